package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/raftstore"
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
	files, err := raftstore.OpenSnapshots(dataDir, 2, hclog.NewNullLogger())
	require.NoError(t, err)
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
// cluster keeps acknowledging writes on the other two (a full leader does
// not win election after election: finding 17); the full node says
// so in Status and in moonraft_disk_errors_total; a snapshot that cannot be
// written leaves the earlier one intact; with space back the node catches
// up by itself and every digest agrees.
func TestDiskFull(t *testing.T) {
	for _, tc := range []struct {
		store  raftstore.LogStore
		leader bool
		// raft-wal writes its log into 64 MiB segment files it allocated
		// beforehand, so a full file system first stops its snapshots;
		// boltdb's appends fail at once.
		failing string
	}{
		{raftstore.LogStoreWAL, false, diskSnapshot},
		{raftstore.LogStoreBoltDB, false, diskLogAppend},
		{raftstore.LogStoreBoltDB, true, diskLogAppend},
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
			c.converged() // v has something to snapshot
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
			timeout := func() time.Duration { return c.nodes[v].raft.ReloadableConfig().HeartbeatTimeout }
			if tc.failing == diskLogAppend {
				require.Eventually(t, func() bool { return timeout() == electionHoldBack*c.cfgs[v].HeartbeatTimeout },
					5*time.Second, 20*time.Millisecond, "a node that cannot append holds back from elections")
			}

			require.NoError(t, os.Remove(filler))
			put(t, c.nodes[c.leader()], "after")
			// The leader retried the refused appends with a backoff that
			// grows to about 10 s (hashicorp/raft's).
			c.convergedWithin(30 * time.Second)
			assert.Equal(t, 22, int(c.nodes[v].Status().Objects), "every acknowledged write, on the node that was full")
			require.NoError(t, c.nodes[v].raft.Snapshot().Error())
			assert.Empty(t, c.nodes[v].Status().DiskError, "cleared once writes succeed again")
			assert.Eventually(t, func() bool { return timeout() == c.cfgs[v].HeartbeatTimeout },
				5*time.Second, 20*time.Millisecond, "its Raft timeouts restored")
		})
	}
}

// tryPut is one put pair through nd, its error returned rather than
// failing the test (a retry after a PutStart that went through is fine).
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

// TestSnapshotFileSyncedAsWritten: a snapshot's file is synced every
// snapshotSyncEvery bytes while it is written, not only whole at the end,
// and the snapshot is intact.
func TestSnapshotFileSyncedAsWritten(t *testing.T) {
	dir := t.TempDir()
	files, err := raftstore.OpenSnapshots(dir, 2, hclog.NewNullLogger())
	require.NoError(t, err)
	w := &watchedSnapshots{SnapshotStore: files, h: newDiskHealth(), dataDir: dir}
	sink, err := w.Create(raft.SnapshotVersionMax, 10, 1, raft.Configuration{}, 1, nil)
	require.NoError(t, err)
	ws := sink.(*watchedSink)
	require.NotNil(t, ws.file, "the sink's state file at %s", raftstore.SnapshotStateFile(dir, sink.ID()))
	chunk := bytes.Repeat([]byte{7}, 1<<20)
	const mb = 20
	for range mb {
		_, err := sink.Write(chunk)
		require.NoError(t, err)
	}
	assert.Equal(t, mb/(snapshotSyncEvery>>20), ws.syncs, "syncs while written")
	require.NoError(t, sink.Close())
	_, rc, err := files.Open(sink.ID())
	require.NoError(t, err)
	defer rc.Close()
	got, err := io.ReadAll(rc)
	require.NoError(t, err)
	assert.Equal(t, bytes.Repeat(chunk, mb), got)
}

// TestWALRotationOnFullDisk: the disk fills just before raft-wal rotates to
// its next segment (finding 15 of docs/RELIABILITY.md). Appends fail while
// it is full and succeed once space is back, every entry readable, without
// a restart: raft-wal alone would answer "segment is sealed" to every
// append until the process restarts.
func TestWALRotationOnFullDisk(t *testing.T) {
	dir := tmpfsDir(t, 8)
	s, _, err := raftstore.Open(dir, raftstore.LogStoreWAL, hclog.NewNullLogger(), 1<<20, 0)
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	filler := fill(t, dir)
	st, err := os.Stat(filler)
	require.NoError(t, err)
	// Room for the meta database's commit of the rotation, not for the
	// next 1 MiB segment.
	require.NoError(t, os.Truncate(filler, st.Size()-64<<10))

	data := bytes.Repeat([]byte{'x'}, 1024)
	entry := func(i uint64) *raft.Log {
		return &raft.Log{Index: i, Term: 1, Data: append([]byte(fmt.Sprint(i, ":")), data...)}
	}
	var last uint64
	for ; last < 4096; last++ {
		if err = s.StoreLogs([]*raft.Log{entry(last + 1)}); err != nil {
			break
		}
	}
	require.Error(t, err, "the first segment filled and the next could not be created")
	require.Greater(t, last, uint64(500), "the first segment took entries until it was full: %v", err)
	require.Error(t, s.StoreLogs([]*raft.Log{entry(last + 1)}), "still full")

	require.NoError(t, os.Remove(filler))
	for i := 1; i <= 10; i++ {
		require.NoError(t, s.StoreLogs([]*raft.Log{entry(last + 1)}), "space is back")
		last++
	}
	check := func(s raftstore.Store) {
		t.Helper()
		got, err := s.LastIndex()
		require.NoError(t, err)
		require.Equal(t, last, got)
		for i := uint64(1); i <= last; i++ {
			var l raft.Log
			require.NoError(t, s.GetLog(i, &l))
			require.Equal(t, entry(i).Data, l.Data, "entry %d", i)
		}
	}
	check(s)
	require.NoError(t, s.Close())
	s, _, err = raftstore.Open(dir, raftstore.LogStoreWAL, hclog.NewNullLogger(), 1<<20, 0)
	require.NoError(t, err)
	check(s)
}

// TestFollowerDiskFullAtWALRotation: a follower's disk fills while its
// raft-wal segment (1 MiB here) has room left; the leader goes on
// committing on the other two, eight writers at a time, until the
// follower's segment is full and the next cannot be created. Its appends
// fail and say so in Status; once space is back it catches up by itself,
// with no restart (finding 15). The concurrent writers keep the leader's
// pipeline to the follower busy when its appends start failing, which is
// when hashicorp/raft's pipeline could stop replicating to it for good
// (finding 16).
func TestFollowerDiskFullAtWALRotation(t *testing.T) {
	c := newCluster(t, 3, time.Hour, func(cfg *Config) {
		cfg.RaftLogStore = raftstore.LogStoreWAL
		cfg.WALSegmentBytes = 1 << 20
		cfg.DataDir = filepath.Join(tmpfsDir(t, 16), "data")
	})
	l := c.leader()
	mountSegments(t, c.nodes[l])
	v := (l + 1) % 3
	filler := fill(t, filepath.Dir(c.cfgs[v].DataDir))
	st, err := os.Stat(filler)
	require.NoError(t, err)
	require.NoError(t, os.Truncate(filler, st.Size()-64<<10), "room for raft-wal's meta database, not for a segment")

	// 3 KiB keys: each put pair adds over 6 KiB to the log, so 480 of them
	// fill the follower's segment whatever was in it.
	long := strings.Repeat("k", 3<<10)
	const writers, each = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := tryPut(t, c.nodes[l], fmt.Sprint(long, w, "/", i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return strings.Contains(c.nodes[v].Status().DiskError, diskLogAppend+": ")
	}, 10*time.Second, 50*time.Millisecond, "the follower reports its failing appends")

	require.NoError(t, os.Remove(filler))
	put(t, c.nodes[l], "after")
	// The leader retried the refused appends with a backoff that grows to
	// about 10 s (hashicorp/raft's).
	c.convergedWithin(30 * time.Second)
	assert.Equal(t, writers*each+1, int(c.nodes[v].Status().Objects), "every acknowledged write, on the node that was full")
	assert.Empty(t, c.nodes[v].Status().DiskError, "cleared once appends succeed again")
}
