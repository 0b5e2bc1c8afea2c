package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newestFile is the last match of glob in name order (raft-wal's segments
// and raft's snapshots are named so that the newest sorts last).
func newestFile(t *testing.T, glob string) string {
	t.Helper()
	m, err := filepath.Glob(glob)
	require.NoError(t, err)
	require.NotEmpty(t, m, glob)
	sort.Strings(m)
	return m[len(m)-1]
}

func editFile(t *testing.T, path string, edit func(b []byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, edit(b), 0o644))
}

// flipIn flips one bit of every occurrence of what in the file: of the
// stored entry, that is, not only of a stale copy of it (bbolt writes pages
// copy-on-write and leaves the old ones in free pages) nor of the unused
// tail of a preallocated file.
func flipIn(what string) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		editFile(t, path, func(b []byte) []byte {
			require.Contains(t, string(b), what, "%s holds %q", path, what)
			return bytes.ReplaceAll(b, []byte(what), append([]byte{what[0] ^ 0x01}, what[1:]...))
		})
	}
}

// cutAt cuts the file short just after the first occurrence of what: a
// crash in the middle of a write (or a file system that lost the tail).
func cutAt(what string) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		editFile(t, path, func(b []byte) []byte {
			i := bytes.Index(b, []byte(what))
			require.GreaterOrEqual(t, i, 0, "%s holds %q", path, what)
			return b[:i+1]
		})
	}
}

func cutHalf(t *testing.T, path string) {
	editFile(t, path, func(b []byte) []byte { return b[:len(b)/2] })
}

// scrambleData scrambles every page of a bbolt file past its two meta
// pages: the live tree, wherever copy-on-write left it (a scramble of one
// spot may hit only a free page).
func scrambleData(t *testing.T, path string) {
	editFile(t, path, func(b []byte) []byte {
		for j := 2 * os.Getpagesize(); j < len(b); j++ {
			b[j] ^= 0x5a
		}
		return b
	})
}

func scramble(at float64) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		editFile(t, path, func(b []byte) []byte {
			i := int(float64(len(b)) * at)
			for j := i; j < i+16 && j < len(b); j++ {
				b[j] ^= 0x5a
			}
			return b
		})
	}
}

// TestDamagedFilesAtRestart damages one file of a stopped follower's data
// dir — its Raft log, the store's metadata, a snapshot — the ways a crash
// or a disk does, and restarts it. Each either recovers (and then holds
// exactly the leader's state) or refuses to start with FILE_READ_FAIL,
// naming the file and the way out; never a panic, never a node serving
// what it read wrong. One refused node is then taken back the way the
// message says: removed, emptied, started with --join.
func TestDamagedFilesAtRestart(t *testing.T) {
	const (
		wal     = "raft-wal/*.wal"
		walMeta = "raft-wal/wal-meta.db"
		bolt    = "raft.db"
		snap    = "snapshots/snapshots/*/state.bin"
		meta    = "snapshots/snapshots/*/meta.json"
	)
	for _, tc := range []struct {
		name    string
		store   raftstore.LogStore
		file    string
		damage  func(t *testing.T, path string)
		refused bool
	}{
		{"wal entry bit flip", raftstore.LogStoreWAL, wal, flipIn("b15"), true},
		{"wal torn tail", raftstore.LogStoreWAL, wal, cutAt("b29"), false},
		{"wal entry bit flip before the snapshot", raftstore.LogStoreWAL, wal, flipIn("a15"), false},
		{"wal metadata scrambled", raftstore.LogStoreWAL, walMeta, scrambleData, true},
		{"wal metadata cut short", raftstore.LogStoreWAL, walMeta, cutHalf, true},
		{"boltdb entry bit flip", raftstore.LogStoreBoltDB, bolt, flipIn("b15"), true},
		{"boltdb meta page scrambled", raftstore.LogStoreBoltDB, bolt, scramble(0), true},
		{"boltdb cut short", raftstore.LogStoreBoltDB, bolt, cutHalf, true},
		{"snapshot bit flip", raftstore.LogStoreWAL, snap, scramble(0.5), true},
		{"snapshot cut short", raftstore.LogStoreWAL, snap, cutHalf, true},
		{"snapshot meta scrambled", raftstore.LogStoreWAL, meta, scramble(0.5), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, time.Hour, func(cfg *Config) { cfg.RaftLogStore = tc.store })
			l := c.leader()
			mountSegments(t, c.nodes[l])
			f := (l + 1) % 3
			for i := 0; i < 30; i++ {
				c.put(t, fmt.Sprintf("a%d", i))
			}
			c.converged() // the follower snapshots everything it was sent
			require.NoError(t, c.nodes[f].raft.Snapshot().Error())
			for i := 0; i < 30; i++ {
				c.put(t, fmt.Sprintf("b%d", i))
			}
			c.converged() // the damage is aimed at entries f must hold: an acknowledged put need not be on f yet
			c.stop(f)
			path := newestFile(t, filepath.Join(c.cfgs[f].DataDir, tc.file))
			tc.damage(t, path)
			c.put(t, "after")

			nd, err := Start(context.Background(), c.cfgs[f])
			if !tc.refused {
				require.NoError(t, err)
				c.nodes[f] = nd
				c.converged()
				assert.Equal(t, 61, int(nd.Status().Objects))
				if tc.name == "wal entry bit flip before the snapshot" {
					joinNeedingTheWholeLog(t, c, f)
				}
				return
			}
			require.Error(t, err, "a node with a damaged %s must not start", tc.file)
			assert.Equal(t, errcode.FileReadFail, errcode.Of(err))
			assert.Contains(t, err.Error(), filepath.Dir(path), "the error names where the damage is")
			assert.Contains(t, err.Error(), "members remove")

			if tc.name != "wal entry bit flip" {
				return
			}
			// The way out the message gives.
			l = c.leader()
			require.NoError(t, c.nodes[l].RemoveServer(ctx(t), c.cfgs[f].ID))
			require.NoError(t, os.RemoveAll(c.cfgs[f].DataDir))
			c.cfgs[f].Bootstrap, c.cfgs[f].Peers, c.cfgs[f].Join = false, nil, c.cfgs[l].GRPCAddr
			c.start(f)
			c.converged()
			assert.Equal(t, 61, int(c.nodes[f].Status().Objects))
		})
	}
}

// joinNeedingTheWholeLog makes f, whose log holds a damaged entry its
// snapshot covers, the leader, and another node join it empty: f reads
// its log from the start for the newcomer, answers the damaged entry as
// missing, and sends its snapshot instead.
func joinNeedingTheWholeLog(t *testing.T, c *cluster, f int) {
	t.Helper()
	l := c.leader()
	if l != f {
		require.NoError(t, c.nodes[l].TransferLeadership(ctx(t), c.cfgs[f].ID))
	}
	require.Eventually(t, func() bool { return c.leader() == f }, 10*time.Second, 10*time.Millisecond)
	g := (f + 1) % 3
	require.NoError(t, c.nodes[f].RemoveServer(ctx(t), c.cfgs[g].ID))
	c.stop(g)
	require.NoError(t, os.RemoveAll(c.cfgs[g].DataDir))
	c.cfgs[g].Bootstrap, c.cfgs[g].Peers, c.cfgs[g].Join = false, nil, c.cfgs[f].GRPCAddr
	c.start(g)
	c.converged()
	assert.Equal(t, 61, int(c.nodes[g].Status().Objects))
}

// TestInterruptedSnapshotIgnored: a crash while a snapshot is written
// leaves its directory still named .tmp, half-written; the node starts from
// its last complete snapshot and its log.
func TestInterruptedSnapshotIgnored(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	f := (l + 1) % 3
	c.put(t, "a")
	c.converged() // the follower has "a" to snapshot
	require.NoError(t, c.nodes[f].raft.Snapshot().Error())
	c.put(t, "b")
	c.stop(f)
	done := filepath.Dir(newestFile(t, filepath.Join(c.cfgs[f].DataDir, "snapshots/snapshots/*/state.bin")))
	half := done[:len(done)-3] + "999-1.tmp" // a later snapshot, never finished
	require.NoError(t, os.Mkdir(half, 0o755))
	b, err := os.ReadFile(filepath.Join(done, "state.bin"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(half, "state.bin"), b[:len(b)/2], 0o644))
	c.start(f)
	c.converged()
	assert.Equal(t, 2, int(c.nodes[f].Status().Objects))
}
