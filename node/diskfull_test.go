package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tmpfsDir mounts a tmpfs of sizeMB on a fresh directory for the test
// (tests run as root, as CI does) and unmounts it at the end.
func tmpfsDir(t *testing.T, sizeMB int) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dm", sizeMB)),
		"mount a tmpfs for the disk-full test (needs root)")
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fill takes every free byte of dir's file system in a file it returns
// (in steps, as the nodes write meanwhile); removing the file gives the
// space back.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	var size int64
	for _, step := range []int64{1 << 20, 4 << 10} {
		for {
			err := syscall.Fallocate(int(f.Fd()), 0, size, step)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			require.NoError(t, err)
			size += step
		}
	}
	return path
}

// snapshotsIntact opens every snapshot in dataDir as a restart would.
func snapshotsIntact(t *testing.T, dataDir string) int {
	t.Helper()
	files, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(dataDir, snapshotsDir), 2, hclog.NewNullLogger())
	require.NoError(t, err)
	require.NoError(t, verifySnapshots(files, filepath.Join(dataDir, snapshotsDir, "snapshots")))
	list, err := files.List()
	require.NoError(t, err)
	return len(list)
}

// TestLeaderLogWriteFailure: a write the leader could not store in its
// log is refused as retryable and not applied (raft's LogCache says so by
// text only), not as an internal error.
func TestLeaderLogWriteFailure(t *testing.T) {
	cache, err := raft.NewLogCache(8, failingLog{raft.NewInmemStore()})
	require.NoError(t, err)
	stored := cache.StoreLogs([]*raft.Log{{Index: 1, Term: 1}}) // the error as raft hands it on
	require.Error(t, stored)
	n := &Node{cfg: Config{ID: "n1"}}
	err = n.raftErr(stored, true)
	assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(err))
	assert.Contains(t, err.Error(), "not applied")
	assert.Contains(t, err.Error(), "no space left on device")
}

type failingLog struct{ raft.LogStore }

func (failingLog) StoreLogs([]*raft.Log) error { return syscall.ENOSPC }

// TestDiskFull fills one node's file system (each node's data dir is on a
// tmpfs of its own) while the cluster takes writes, then frees it. The
// cluster keeps acknowledging writes on the other two; the full node says
// so in Status and in moonraft_disk_errors_total; a snapshot that cannot be
// written leaves the earlier one intact; with space back the node catches
// up by itself and every digest agrees.
func TestDiskFull(t *testing.T) {
	// raft-wal (the default store) writes its log into 64 MiB segment
	// files it allocated beforehand, so a full file system first stops a
	// follower's snapshots. boltdb, whose appends fail at once, is left out
	// until the hang in docs/RELIABILITY.md ("follower's disk full") is
	// understood.
	c := newCluster(t, 3, time.Hour, func(cfg *Config) {
		cfg.RaftLogStore = LogStoreWAL
		cfg.DataDir = filepath.Join(tmpfsDir(t, 100), "data")
	})
	l := c.leader()
	mountSegments(t, c.nodes[l])
	v := (l + 1) % 3
	put(t, c.nodes[l], "before")
	require.NoError(t, c.nodes[v].raft.Snapshot().Error())
	require.Equal(t, 1, snapshotsIntact(t, c.cfgs[v].DataDir))

	filler := fill(t, filepath.Dir(c.cfgs[v].DataDir))
	for i := 0; i < 20; i++ {
		put(t, c.nodes[l], fmt.Sprint("k", i)) // the other two commit it
	}
	require.Error(t, c.nodes[v].raft.Snapshot().Error())
	status := c.nodes[v].Status().DiskError
	assert.Contains(t, status, diskSnapshot+": ")
	assert.Contains(t, status, "no space left on device")
	assert.Positive(t, testutil.ToFloat64(c.nodes[v].disk.errs.WithLabelValues(diskSnapshot)))
	assert.Equal(t, 1, snapshotsIntact(t, c.cfgs[v].DataDir), "the earlier snapshot stays whole")

	require.NoError(t, os.Remove(filler))
	put(t, c.nodes[l], "after")
	c.converged()
	assert.Equal(t, 22, int(c.nodes[v].Status().Objects), "every acknowledged write, on the node that was full")
	require.NoError(t, c.nodes[v].raft.Snapshot().Error())
	assert.Empty(t, c.nodes[v].Status().DiskError, "cleared once writes succeed again")
}

// TestDiskHealth: each kind of failed write stands in Status until a write
// of that kind succeeds, and is counted.
func TestDiskHealth(t *testing.T) {
	d := newDiskHealth()
	d.observe(diskSnapshot, syscall.ENOSPC)
	d.observe(diskLogAppend, syscall.EIO)
	assert.Equal(t, "log_append: input/output error; snapshot: no space left on device", d.String())
	d.observe(diskLogAppend, nil)
	assert.Equal(t, "snapshot: no space left on device", d.String())
	d.observe(diskSnapshot, nil)
	assert.Empty(t, d.String())
	assert.Equal(t, 1.0, testutil.ToFloat64(d.errs.WithLabelValues(diskLogAppend)))
}
