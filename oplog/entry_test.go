package oplog_test

import (
	"encoding/json"
	"hash/crc32"
	"hash/fnv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

func TestOpType(t *testing.T) {
	tests := []struct {
		op   oplog.OpType
		name string
	}{
		{oplog.OpPutEnd, "PUT_END"},
		{oplog.OpPutRevoke, "PUT_REVOKE"},
		{oplog.OpRemove, "REMOVE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.name, tt.op.String())
			got, err := oplog.ParseOpType(tt.name)
			require.NoError(t, err)
			assert.Equal(t, tt.op, got)
		})
	}
	assert.Equal(t, "OpType(0)", oplog.OpType(0).String())
	assert.Equal(t, "OpType(9)", oplog.OpType(9).String())
	for _, bad := range []string{"", "put_end", "PUT", "OpType(1)"} {
		_, err := oplog.ParseOpType(bad)
		assert.Equal(t, errcode.InvalidParams, errcode.Of(err), bad)
		assert.ErrorContains(t, err, "unknown op_type")
	}
}

func TestChecksum(t *testing.T) {
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	// The table itself: CRC-32C's check value.
	require.Equal(t, uint32(0xE3069283), crc32.Checksum([]byte("123456789"), castagnoli))
	tests := []struct {
		seq          uint64
		op           oplog.OpType
		key, payload string
		literal      string
	}{
		{1, oplog.OpPutEnd, "a/b", `{"size":1}`, `1|PUT_END|a/b|{"size":1}`},
		{42, oplog.OpRemove, "key", "", `42|REMOVE|key|`},
		{7, oplog.OpPutRevoke, "x|y", "", `7|PUT_REVOKE|x|y|`},
		{18446744073709551615, oplog.OpRemove, "模型/层", "", "18446744073709551615|REMOVE|模型/层|"},
		{3, oplog.OpPutEnd, strings.Repeat("k", 5000), strings.Repeat("p", 300), "3|PUT_END|" + strings.Repeat("k", 5000) + "|" + strings.Repeat("p", 300)},
	}
	for _, tt := range tests {
		t.Run(tt.literal[:min(len(tt.literal), 24)], func(t *testing.T) {
			want := crc32.Checksum([]byte(tt.literal), castagnoli)
			assert.Equal(t, want, oplog.Checksum(tt.seq, tt.op, tt.key, tt.payload))
		})
	}
	// Every piece counts.
	base := oplog.Checksum(1, oplog.OpRemove, "k", "")
	assert.NotEqual(t, base, oplog.Checksum(2, oplog.OpRemove, "k", ""))
	assert.NotEqual(t, base, oplog.Checksum(1, oplog.OpPutRevoke, "k", ""))
	assert.NotEqual(t, base, oplog.Checksum(1, oplog.OpRemove, "j", ""))
	assert.NotEqual(t, base, oplog.Checksum(1, oplog.OpRemove, "k", "p"))
}

func TestChecksumDoesNotAllocate(t *testing.T) {
	key, payload := "model/layer-12/chunk-000042", strings.Repeat("x", 512)
	allocs := testing.AllocsPerRun(100, func() { oplog.Checksum(123456789, oplog.OpPutEnd, key, payload) })
	assert.Zero(t, allocs)
}

func TestPrefixHash(t *testing.T) {
	fnv1a := func(s string) uint32 {
		h := fnv.New32a()
		h.Write([]byte(s))
		return h.Sum32()
	}
	tests := []struct {
		name, key, prefix string
	}{
		{"no slash", "plainkey", "plainkey"},
		{"one slash", "dir/file", "dir"},
		{"nested", "a/b/c/d", "a/b/c"},
		{"trailing slash", "a/b/", "a/b"},
		{"leading slash", "/top", ""},
		{"only slash", "/", ""},
		{"empty key", "", ""},
		{"unicode", "模型/层/块", "模型/层"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, fnv1a(tt.prefix), oplog.PrefixHash(tt.key))
		})
	}
	assert.Equal(t, uint32(2166136261), oplog.PrefixHash("/x"), "empty prefix is FNV's offset basis")
	assert.Equal(t, oplog.PrefixHash("dir/a"), oplog.PrefixHash("dir/b"))
}

func TestNewEntryAndVerify(t *testing.T) {
	e := oplog.NewEntry(9, 1700000000000, oplog.OpRemove, "dir/k", "", 3, oplog.SourceEvict)
	assert.Equal(t, oplog.Entry{
		SequenceID: 9, TimestampMs: 1700000000000, OpType: oplog.OpRemove, Key: "dir/k",
		Checksum: oplog.Checksum(9, oplog.OpRemove, "dir/k", ""), PrefixHash: oplog.PrefixHash("dir/k"),
		KeySequenceID: 3, Source: oplog.SourceEvict,
	}, e)
	require.NoError(t, e.Verify())

	// Fields outside the checksum may change freely.
	free := e
	free.TimestampMs, free.KeySequenceID, free.Source = 1, 99, oplog.SourceRemove
	assert.NoError(t, free.Verify())

	tests := []struct {
		name   string
		mutate func(*oplog.Entry)
		msg    string
	}{
		{"checksum", func(e *oplog.Entry) { e.Checksum++ }, "checksum"},
		{"seq", func(e *oplog.Entry) { e.SequenceID = 10 }, "checksum"},
		{"op", func(e *oplog.Entry) { e.OpType = oplog.OpPutRevoke }, "checksum"},
		{"payload", func(e *oplog.Entry) { e.Payload = "x" }, "checksum"},
		{"key same prefix", func(e *oplog.Entry) { e.Key = "dir/j" }, "checksum"},
		{"prefix hash", func(e *oplog.Entry) { e.PrefixHash++ }, "prefix_hash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := e
			tt.mutate(&bad)
			err := bad.Verify()
			require.Error(t, err)
			assert.Equal(t, errcode.ChecksumMismatch, errcode.Of(err))
			assert.ErrorContains(t, err, tt.msg)
			assert.ErrorContains(t, err, "oplog entry ")
		})
	}
	bad := e
	bad.Checksum = 12345
	assert.EqualError(t, bad.Verify(), "CHECKSUM_MISMATCH: oplog entry 9: checksum 12345 does not match computed "+
		itoa(uint64(e.Checksum)))
	bad = e
	bad.PrefixHash = 7
	assert.EqualError(t, bad.Verify(), "CHECKSUM_MISMATCH: oplog entry 9: prefix_hash 7 does not match computed "+
		itoa(uint64(e.PrefixHash)))
}

func itoa(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}
