package raftstore

import (
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLogChecksums: entries go to disk with their checksum and come back
// without it; an entry stored before checksums existed is read unchecked;
// a changed index, term or byte of data is refused.
func TestLogChecksums(t *testing.T) {
	for _, ls := range []LogStore{LogStoreWAL, LogStoreBoltDB} {
		t.Run(string(ls), func(t *testing.T) {
			raw, err := openLogStore(t.TempDir(), ls, hclog.NewNullLogger(), 0)
			require.NoError(t, err)
			defer raw.Close()
			s := &Checked{Store: raw, logger: hclog.NewNullLogger()}
			in := &raft.Log{Index: 1, Term: 3, Type: raft.LogCommand, Data: []byte("one")}
			require.NoError(t, s.StoreLogs([]*raft.Log{in}))
			assert.Nil(t, in.Extensions, "raft's own entry is left as it was")
			require.NoError(t, raw.StoreLog(&raft.Log{Index: 2, Term: 3, Type: raft.LogCommand, Data: []byte("old")}))

			var got raft.Log
			require.NoError(t, raw.GetLog(1, &got))
			assert.Len(t, got.Extensions, 8, "stored with its checksum")
			require.NoError(t, s.GetLog(1, &got))
			assert.Equal(t, "one", string(got.Data))
			assert.Nil(t, got.Extensions)
			require.NoError(t, s.GetLog(2, &got), "stored without a checksum: read unchecked")

			require.NoError(t, raw.GetLog(1, &got))
			for name, damage := range map[string]func(l *raft.Log){
				"data":  func(l *raft.Log) { l.Data = []byte("onE") },
				"index": func(l *raft.Log) { l.Index = 9 },
				"term":  func(l *raft.Log) { l.Term = 4 },
			} {
				l := got
				l.Extensions = append([]byte(nil), got.Extensions...)
				damage(&l)
				checked, err := verifyEntry(&l)
				assert.True(t, checked, name)
				assert.ErrorContains(t, err, "fails its checksum", name)
			}
			require.NoError(t, verifyLog(s, t.TempDir(), ls, 0))
		})
	}
}

// TestDamageBeforeTheSnapshot: the check at open reads the entries from
// keepFrom on, those a restart applies, and a damaged entry before them
// does not stop the start; read later, for a follower, it is answered as
// missing, which makes raft send a snapshot instead.
func TestDamageBeforeTheSnapshot(t *testing.T) {
	raw, err := openLogStore(t.TempDir(), LogStoreBoltDB, hclog.NewNullLogger(), 0)
	require.NoError(t, err)
	defer raw.Close()
	s := &Checked{Store: raw, kept: kept{limit: 1 << 20}, logger: hclog.NewNullLogger()}
	for i := uint64(1); i <= 9; i++ {
		require.NoError(t, s.StoreLog(&raft.Log{Index: i, Term: 2, Type: raft.LogCommand, Data: []byte{'e', byte('0' + i)}}))
	}
	var l raft.Log
	require.NoError(t, raw.GetLog(3, &l))
	l.Data = []byte("x3") // bolt overwrites in place; the checksum stays e3's
	require.NoError(t, raw.StoreLog(&l))

	require.NoError(t, verifyLog(s, t.TempDir(), LogStoreBoltDB, 6), "3 is covered by the snapshot")
	assert.Equal(t, 4, s.Kept())
	assert.ErrorIs(t, s.GetLog(3, &raft.Log{}), raft.ErrLogNotFound)
	require.NoError(t, s.GetLog(2, &l))
	assert.Equal(t, "e2", string(l.Data))
	for _, from := range []uint64{0, 3} {
		err := verifyLog(s, t.TempDir(), LogStoreBoltDB, from)
		assert.ErrorContains(t, err, "entry 3 (term 2) fails its checksum", "checked from %d", from)
	}
}

// TestKeptEntries: the check at open keeps the entries from keepFrom on,
// within its bound, and GetLog answers from them; a write or deletion that
// overlaps them drops them from where it starts (a new leader replacing
// this node's entries must not be answered with the old ones), one past or
// below them does not, and Forget drops those applied.
func TestKeptEntries(t *testing.T) {
	data := func(i uint64) []byte { return []byte{'e', byte('0' + i)} }
	open := func(t *testing.T, limit int) (*Checked, Store) {
		raw, err := openLogStore(t.TempDir(), LogStoreWAL, hclog.NewNullLogger(), 0)
		require.NoError(t, err)
		t.Cleanup(func() { _ = raw.Close() })
		s := &Checked{Store: raw, kept: kept{limit: limit}, logger: hclog.NewNullLogger()}
		for i := uint64(1); i <= 9; i++ {
			require.NoError(t, s.StoreLog(&raft.Log{Index: i, Term: 2, Type: raft.LogCommand, Data: data(i)}))
		}
		require.NoError(t, verifyLog(s, t.TempDir(), LogStoreWAL, 6))
		return s, raw
	}
	get := func(t *testing.T, s *Checked, i uint64) string {
		var l raft.Log
		require.NoError(t, s.GetLog(i, &l))
		assert.Nil(t, l.Extensions)
		assert.EqualValues(t, i, l.Index)
		return string(l.Data)
	}

	s, raw := open(t, 1<<20)
	require.Equal(t, 4, s.Kept(), "entries 6 to 9")
	assert.Equal(t, "e7", get(t, s, 7))
	assert.Equal(t, "e2", get(t, s, 2), "from the store")
	// Behind the wrapper's back the store changes: GetLog answering the
	// old entry shows it is answered from the kept ones.
	require.NoError(t, raw.DeleteRange(9, 9))
	require.NoError(t, raw.StoreLog(&raft.Log{Index: 9, Term: 3, Type: raft.LogCommand, Data: []byte("x9")}))
	assert.Equal(t, "e9", get(t, s, 9))

	for _, tc := range []struct {
		name  string
		write func(t *testing.T, s *Checked)
		kept  int
		at9   string
	}{
		{"an append past them", func(t *testing.T, s *Checked) {
			require.NoError(t, s.StoreLog(&raft.Log{Index: 10, Term: 2, Type: raft.LogCommand, Data: []byte("e10")}))
		}, 4, "e9"},
		{"a compaction below them", func(t *testing.T, s *Checked) { require.NoError(t, s.DeleteRange(1, 5)) }, 4, "e9"},
		{"a new leader's entries over them", func(t *testing.T, s *Checked) {
			require.NoError(t, s.DeleteRange(9, 9))
			require.NoError(t, s.StoreLog(&raft.Log{Index: 9, Term: 3, Type: raft.LogCommand, Data: []byte("y9")}))
		}, 3, "y9"},
		{"a new leader's entries over the last two", func(t *testing.T, s *Checked) {
			require.NoError(t, s.DeleteRange(8, 9))
			require.NoError(t, s.StoreLogs([]*raft.Log{{Index: 8, Term: 3, Type: raft.LogCommand, Data: []byte("y8")},
				{Index: 9, Term: 3, Type: raft.LogCommand, Data: []byte("y9")}}))
		}, 2, "y9"},
		{"a compaction into them", func(t *testing.T, s *Checked) { require.NoError(t, s.DeleteRange(1, 6)) }, 0, "e9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := open(t, 1<<20)
			tc.write(t, s)
			assert.Equal(t, tc.kept, s.Kept())
			assert.Equal(t, tc.at9, get(t, s, 9))
		})
	}

	t.Run("forget", func(t *testing.T) {
		s, _ := open(t, 1<<20)
		s.Forget(5)
		assert.Equal(t, 4, s.Kept(), "below them")
		s.Forget(7)
		assert.Equal(t, 2, s.Kept())
		assert.Equal(t, "e7", get(t, s, 7), "from the store")
		s.Forget(100)
		assert.Equal(t, 0, s.Kept())
		assert.Equal(t, "e9", get(t, s, 9))
	})
	t.Run("within the bound", func(t *testing.T) {
		s, _ := open(t, 5) // two entries of two bytes
		assert.Equal(t, 2, s.Kept())
		assert.Equal(t, "e8", get(t, s, 8), "from the store")
	})
}
