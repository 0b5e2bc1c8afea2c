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
			s := &checksummed{Store: raw}
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
			require.NoError(t, verifyLog(s, t.TempDir(), ls))
		})
	}
}
