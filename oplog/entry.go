// Package oplog is the OpLog of the source notes as moonraft writes it to
// etcd: the entry, its JSON codec, its checksum and prefix hash, and the
// payload of a PUT_END entry.
//
// Every node of the Raft group produces the same entries from the same
// commands and a deposed leader may race a new one writing them, so the
// encoding is deterministic down to the byte: hand-rolled appenders with a
// fixed field order and fixed string escaping (the one encoding/json uses
// today, frozen here so a Go upgrade on one node cannot change the bytes).
//
// Strings (keys, payloads, sources, segment names) must be valid UTF-8. The
// checksum covers the raw bytes, and JSON cannot carry invalid UTF-8: Encode
// would write U+FFFD in its place, so the reader's Verify would fail. The
// FSM therefore rejects invalid UTF-8 keys when they come in, and Decode
// rejects strings that are not valid UTF-8.
package oplog

import (
	"hash/crc32"
	"strconv"
	"strings"
	"unsafe"

	"github.com/moonraft/moonraft/errcode"
)

// OpType is the kind of an OpLog entry.
type OpType uint8

// The op types of the notes; the numbers are moonraft's, the names are the
// ones written to etcd.
const (
	OpPutEnd    OpType = 1 // "PUT_END"
	OpPutRevoke OpType = 2 // "PUT_REVOKE"
	OpRemove    OpType = 3 // "REMOVE"
)

// String returns the name written to etcd, or OpType(n) for an unknown value.
func (t OpType) String() string {
	switch t {
	case OpPutEnd:
		return "PUT_END"
	case OpPutRevoke:
		return "PUT_REVOKE"
	case OpRemove:
		return "REMOVE"
	}
	return "OpType(" + strconv.Itoa(int(t)) + ")"
}

// ParseOpType returns the op type with the given etcd name.
func ParseOpType(s string) (OpType, error) {
	if t, ok := parseOpType(s); ok {
		return t, nil
	}
	return 0, errcode.New(errcode.InvalidParams, "oplog: unknown op_type %q", s)
}

func parseOpType(s string) (OpType, bool) {
	switch s {
	case "PUT_END":
		return OpPutEnd, true
	case "PUT_REVOKE":
		return OpPutRevoke, true
	case "REMOVE":
		return OpRemove, true
	}
	return 0, false
}

// Source says why a REMOVE happened ("" for PUT_END / PUT_REVOKE).
type Source string

// The sources moonraft writes. Decode accepts any other value on a REMOVE:
// a newer master may add reasons, and a follower removes the key either way.
const (
	SourceNone           Source = ""
	SourceRemove         Source = "remove"
	SourceRemoveByRegex  Source = "remove_by_regex"
	SourceRemoveAll      Source = "remove_all"
	SourceUnmountSegment Source = "unmount_segment"
	SourceClientExpired  Source = "client_expired"
	SourceEvict          Source = "evict"
	SourceDiscard        Source = "discard"
	// SourceUpsert: an upsert is rewriting (or has taken over) the object's
	// buffers, so a follower must stop trusting them; its PUT_END follows.
	SourceUpsert Source = "upsert"
)

// Entry is one OpLog entry. Its JSON (Encode) is, in this order:
// {"sequence_id","timestamp","op_type","key","payload","checksum",
// "prefix_hash","key_sequence_id","source"}.
type Entry struct {
	SequenceID    uint64
	TimestampMs   int64  // json "timestamp", milliseconds
	OpType        OpType // json string "PUT_END" etc.
	Key           string
	Payload       string // PUT_END: EncodePutEndPayload; empty otherwise
	Checksum      uint32 // json number
	PrefixHash    uint32 // json number
	KeySequenceID uint64
	Source        Source
}

// NewEntry returns an entry with Checksum and PrefixHash filled in.
func NewEntry(seq uint64, tsMs int64, op OpType, key, payload string, keySeq uint64, src Source) Entry {
	return Entry{
		SequenceID:    seq,
		TimestampMs:   tsMs,
		OpType:        op,
		Key:           key,
		Payload:       payload,
		Checksum:      Checksum(seq, op, key, payload),
		PrefixHash:    PrefixHash(key),
		KeySequenceID: keySeq,
		Source:        src,
	}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Checksum is the CRC-32C (Castagnoli) of the bytes
// "<seq in decimal>|<op type name>|<key>|<payload>". The pieces are hashed
// one after the other, so nothing is concatenated or allocated.
func Checksum(seq uint64, op OpType, key, payload string) uint32 {
	var head [40]byte // 20 digits, '|', the longest name (10), '|'
	h := strconv.AppendUint(head[:0], seq, 10)
	h = append(h, '|')
	h = append(h, op.String()...)
	h = append(h, '|')
	crc := updateShort(0, h)
	crc = crc32.Update(crc, castagnoli, bytesOf(key))
	crc = updateShort(crc, []byte{'|'})
	return crc32.Update(crc, castagnoli, bytesOf(payload))
}

// updateShort is crc32.Update for a few bytes. crc32.Update dispatches
// through a function variable, so any slice it is given escapes: head would
// move to the heap.
func updateShort(crc uint32, p []byte) uint32 {
	crc = ^crc
	for _, c := range p {
		crc = castagnoli[byte(crc)^c] ^ crc>>8
	}
	return ^crc
}

// bytesOf views s as bytes without copying it, for readers that never
// write: crc32 and the decoder.
func bytesOf(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// PrefixHash is the FNV-1a 32-bit hash of key up to (not including) its last
// '/', or of the whole key if it has none. Keys under one "directory" share
// it, so a watcher can filter by prefix without parsing keys.
func PrefixHash(key string) uint32 {
	if i := strings.LastIndexByte(key, '/'); i >= 0 {
		key = key[:i]
	}
	// Inline FNV-1a: hash/fnv would put a hasher on the heap per call.
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return h
}

// Verify recomputes the checksum and the prefix hash and reports a
// mismatch as errcode.ChecksumMismatch.
func (e Entry) Verify() error {
	if sum := Checksum(e.SequenceID, e.OpType, e.Key, e.Payload); sum != e.Checksum {
		return errcode.New(errcode.ChecksumMismatch,
			"oplog entry %d: checksum %d does not match computed %d", e.SequenceID, e.Checksum, sum)
	}
	if ph := PrefixHash(e.Key); ph != e.PrefixHash {
		return errcode.New(errcode.ChecksumMismatch,
			"oplog entry %d: prefix_hash %d does not match computed %d", e.SequenceID, e.PrefixHash, ph)
	}
	return nil
}
