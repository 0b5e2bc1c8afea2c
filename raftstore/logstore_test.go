package raftstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChooseLogStore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		holds   []string // files or dirs in the data dir
		want    LogStore
		got     LogStore
		errPart string
	}{
		{name: "new dir, no choice: the default", got: DefaultLogStore},
		{name: "new dir, boltdb asked", want: LogStoreBoltDB, got: LogStoreBoltDB},
		{name: "new dir, wal asked", want: LogStoreWAL, got: LogStoreWAL},
		{name: "boltdb dir keeps boltdb", holds: []string{raftDB}, got: LogStoreBoltDB},
		{name: "wal dir keeps wal", holds: []string{walDir + "/"}, got: LogStoreWAL},
		{name: "boltdb dir, same asked", holds: []string{raftDB}, want: LogStoreBoltDB, got: LogStoreBoltDB},
		{name: "boltdb dir, wal asked", holds: []string{raftDB}, want: LogStoreWAL, errPart: "holds a boltdb Raft log, not wal"},
		{name: "wal dir, boltdb asked", holds: []string{walDir + "/"}, want: LogStoreBoltDB, errPart: "moonraft migrate-log-store"},
		{name: "both", holds: []string{raftDB, walDir + "/"}, errPart: "holds both"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, h := range tc.holds {
				p := filepath.Join(dir, h)
				if h[len(h)-1] == '/' {
					require.NoError(t, os.Mkdir(p, 0o755))
				} else {
					require.NoError(t, os.WriteFile(p, nil, 0o644))
				}
			}
			got, err := chooseLogStore(dir, tc.want)
			if tc.errPart != "" {
				require.Error(t, err)
				assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
				assert.Contains(t, err.Error(), tc.errPart)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.got, got)
		})
	}
}

func TestParseLogStore(t *testing.T) {
	for _, s := range []string{"", "wal", "boltdb"} {
		ls, err := ParseLogStore(s)
		require.NoError(t, err)
		assert.Equal(t, LogStore(s), ls)
	}
	_, err := ParseLogStore("rocksdb")
	assert.ErrorContains(t, err, "want wal or boltdb")
}

func TestLogStoreRefusesASecondOpener(t *testing.T) {
	for _, ls := range []LogStore{LogStoreWAL, LogStoreBoltDB} {
		t.Run(string(ls), func(t *testing.T) {
			dir := t.TempDir()
			s, err := openLogStore(dir, ls, hclog.NewNullLogger(), 0)
			require.NoError(t, err)
			_, err = openLogStore(dir, ls, hclog.NewNullLogger(), 0)
			require.Error(t, err)
			assert.Equal(t, errcode.FileLockFail, errcode.Of(err))
			assert.Contains(t, err.Error(), "in use by another process")
			require.NoError(t, s.Close())
			s, err = openLogStore(dir, ls, hclog.NewNullLogger(), 0) // the lock went with Close
			require.NoError(t, err)
			require.NoError(t, s.Close())
		})
	}
}

// TestMigrateLogStore moves a log with a compacted head and a node's term
// and vote from one store to the other and back: every entry and key
// arrives, the old store is gone, and moving again to the same store is
// refused.
func TestMigrateLogStore(t *testing.T) {
	for _, from := range []LogStore{LogStoreBoltDB, LogStoreWAL} {
		to := LogStoreWAL
		if from == LogStoreWAL {
			to = LogStoreBoltDB
		}
		t.Run(fmt.Sprintf("%s to %s", from, to), func(t *testing.T) {
			dir := t.TempDir()
			s, err := openLogStore(dir, from, hclog.NewNullLogger(), 0)
			require.NoError(t, err)
			var logs []*raft.Log
			for i := uint64(101); i <= 600; i++ { // a log compacted up to 100
				logs = append(logs, &raft.Log{Index: i, Term: 3 + i/300, Type: raft.LogCommand, Data: []byte(fmt.Sprintf("entry-%d", i))})
			}
			require.NoError(t, s.StoreLogs(logs))
			require.NoError(t, s.SetUint64([]byte("CurrentTerm"), 5))
			require.NoError(t, s.SetUint64([]byte("LastVoteTerm"), 5))
			require.NoError(t, s.Set([]byte("LastVoteCand"), []byte("n2")))
			require.NoError(t, s.Close())

			n, err := MigrateLogStore(context.Background(), dir, to)
			require.NoError(t, err)
			assert.Equal(t, uint64(500), n)
			have, err := DetectLogStore(dir)
			require.NoError(t, err)
			assert.Equal(t, to, have, "the old store is removed")

			m, err := openLogStore(dir, to, hclog.NewNullLogger(), 0)
			require.NoError(t, err)
			first, _ := m.FirstIndex()
			last, _ := m.LastIndex()
			assert.Equal(t, []uint64{101, 600}, []uint64{first, last})
			for _, want := range logs {
				var got raft.Log
				require.NoError(t, m.GetLog(want.Index, &got))
				assert.Equal(t, want.Term, got.Term)
				assert.Equal(t, want.Data, got.Data)
			}
			term, err := m.GetUint64([]byte("CurrentTerm"))
			require.NoError(t, err)
			assert.Equal(t, uint64(5), term)
			cand, err := m.Get([]byte("LastVoteCand"))
			require.NoError(t, err)
			assert.Equal(t, "n2", string(cand))
			require.NoError(t, m.Close())

			_, err = MigrateLogStore(context.Background(), dir, to)
			assert.ErrorContains(t, err, "already holds a "+string(to))
		})
	}
}

// A node that never voted has no vote keys: migration must not need them.
func TestMigrateLogStoreWithoutVote(t *testing.T) {
	dir := t.TempDir()
	s, err := openLogStore(dir, LogStoreBoltDB, hclog.NewNullLogger(), 0)
	require.NoError(t, err)
	require.NoError(t, s.StoreLog(&raft.Log{Index: 1, Term: 1, Type: raft.LogConfiguration}))
	require.NoError(t, s.Close())
	n, err := MigrateLogStore(context.Background(), dir, LogStoreWAL)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), n)
	_, err = MigrateLogStore(context.Background(), t.TempDir(), LogStoreWAL)
	assert.ErrorContains(t, err, "holds no Raft log")
}

// Raft clears a store that refuses gaps after a snapshot install only if it
// learns so through every wrapper (LogCache, the data dir lock, checksums).
func TestLogStoreMonotonicThroughWrappers(t *testing.T) {
	for ls, want := range map[LogStore]bool{LogStoreWAL: true, LogStoreBoltDB: false} {
		dir := t.TempDir()
		s, err := openLogStore(dir, ls, hclog.NewNullLogger(), 0)
		require.NoError(t, err)
		c, err := raft.NewLogCache(8, &Checked{Store: s})
		require.NoError(t, err)
		assert.Equal(t, want, c.IsMonotonic(), string(ls))
		require.NoError(t, s.Close())
	}
}

// TestLogStoreReopensAfterTailTruncation: a follower whose log conflicts
// with a new leader's drops its tail ("clearing log suffix"), then is
// killed and restarted. raft-wal v0.4.0 marked the tail segment sealed
// without writing its index, and every later read of it failed ("sealed
// segment has no index block": a node in a crash loop, found by the fault
// suite); fixed in v0.4.1 (hashicorp/raft-wal#31).
func TestLogStoreReopensAfterTailTruncation(t *testing.T) {
	for _, ls := range []LogStore{LogStoreWAL, LogStoreBoltDB} {
		t.Run(string(ls), func(t *testing.T) {
			dir := t.TempDir()
			s, err := openLogStore(dir, ls, hclog.NewNullLogger(), 0)
			require.NoError(t, err)
			var logs []*raft.Log
			for i := uint64(1); i <= 100; i++ {
				logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte(fmt.Sprint(i))})
			}
			require.NoError(t, s.StoreLogs(logs))
			require.NoError(t, s.DeleteRange(91, 100)) // the conflicting suffix
			require.NoError(t, s.StoreLog(&raft.Log{Index: 91, Term: 2, Type: raft.LogCommand, Data: []byte("new")}))
			require.NoError(t, s.Close()) // killed here in the fault run: no clean shutdown needed either

			s, err = openLogStore(dir, ls, hclog.NewNullLogger(), 0)
			require.NoError(t, err)
			defer s.Close()
			last, err := s.LastIndex()
			require.NoError(t, err)
			assert.Equal(t, uint64(91), last)
			for i := uint64(1); i <= 91; i++ {
				var l raft.Log
				require.NoError(t, s.GetLog(i, &l), "index %d", i)
			}
			var l raft.Log
			require.NoError(t, s.GetLog(91, &l))
			assert.Equal(t, uint64(2), l.Term)
		})
	}
}
