package node

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
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

// fill takes every free byte of dir's file system in a file it returns;
// removing the file gives the space back.
func fill(t *testing.T, dir string) string {
	t.Helper()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(dir, &st))
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, syscall.Fallocate(int(f.Fd()), 0, 0, int64(st.Bavail)*st.Bsize))
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

// TestDiskFull fills one node's file system (each node's data dir is on a
// tmpfs of its own) while the cluster takes writes, then frees it. The
// cluster keeps acknowledging writes on the other two; the full node says
// so in Status and in moonraft_disk_errors_total; a snapshot that cannot be
// written leaves the earlier one intact; with space back the node catches
// up by itself and every digest agrees.
func TestDiskFull(t *testing.T) {
	for _, tc := range []struct {
		store  LogStore
		leader bool
		// raft-wal writes its log into 64 MiB segment files it allocated
		// beforehand, so a full file system first stops its snapshots;
		// boltdb's appends fail at once.
		failing string
	}{
		{LogStoreWAL, false, diskSnapshot},
		{LogStoreBoltDB, false, diskLogAppend},
		{LogStoreBoltDB, true, diskLogAppend},
	} {
		who := map[bool]string{false: "follower", true: "leader"}[tc.leader]
		t.Run(string(tc.store)+" "+who, func(t *testing.T) {
			c := newCluster(t, 3, time.Hour, func(cfg *Config) {
				cfg.RaftLogStore = tc.store
				cfg.DataDir = filepath.Join(tmpfsDir(t, 100), "data")
			})
			l := c.leader()
			mountSegments(t, c.nodes[l])
			v := (l + 1) % 3
			if tc.leader {
				v = l
			}
			put(t, c.nodes[l], "before")
			require.NoError(t, c.nodes[v].raft.Snapshot().Error())
			require.Equal(t, 1, snapshotsIntact(t, c.cfgs[v].DataDir))

			filler := fill(t, filepath.Dir(c.cfgs[v].DataDir))
			for i := 0; i < 20; i++ {
				// The first write a full leader takes fails (it steps down);
				// the next goes to its successor.
				require.Eventually(t, func() bool {
					err := tryPut(t, c.nodes[c.leader()], fmt.Sprint("k", i))
					if errcode.Of(err) == errcode.InternalError {
						t.Fatalf("a write the full leader could not log: %v", err)
					}
					return err == nil
				}, 10*time.Second, 50*time.Millisecond, "the other two keep taking writes")
			}
			if tc.leader {
				assert.NotEqual(t, v, c.leader(), "a leader that cannot write its log steps down")
			}
			if tc.failing == diskSnapshot {
				require.Error(t, c.nodes[v].raft.Snapshot().Error())
			}
			require.Eventually(t, func() bool { return c.nodes[v].Status().DiskError != "" }, 10*time.Second, 20*time.Millisecond)
			status := c.nodes[v].Status().DiskError
			assert.Contains(t, status, tc.failing+": ")
			assert.Contains(t, status, "no space left on device")
			assert.Positive(t, testutil.ToFloat64(c.nodes[v].disk.errs.WithLabelValues(tc.failing)))
			assert.Equal(t, 1, snapshotsIntact(t, c.cfgs[v].DataDir), "the earlier snapshot stays whole")

			require.NoError(t, os.Remove(filler))
			put(t, c.nodes[c.leader()], "after")
			c.converged()
			assert.Equal(t, 22, int(c.nodes[v].Status().Objects), "every acknowledged write, on the node that was full")
			require.NoError(t, c.nodes[v].raft.Snapshot().Error())
			assert.Empty(t, c.nodes[v].Status().DiskError, "cleared once writes succeed again")
		})
	}
}

// tryPut is put that reports a failure instead of ending the test.
func tryPut(t *testing.T, nd *Node, key string) error {
	now := time.Now().UnixMilli()
	for _, cmd := range []fsm.Command{
		&fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{1024}, ReplicaNum: 2, ClientID: "c1"},
		&fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"},
	} {
		r, err := nd.Propose(ctx(t), cmd)
		if err == nil {
			err = r.Err
		}
		if _, retried := cmd.(*fsm.PutStart); retried && errcode.Of(err) == errcode.ObjectAlreadyExists {
			continue // an earlier try's PutStart went through
		}
		if err != nil {
			return err
		}
	}
	return nil
}
