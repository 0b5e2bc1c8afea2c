package fsm

import (
	"encoding/binary"
	"unicode/utf8"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/internal/varint"
)

// enc appends the compact binary encoding shared by commands and snapshot
// records: uvarints, zigzag varints, and uvarint-length-prefixed strings.
type enc struct{ b []byte }

func (e *enc) u64(v uint64)   { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) i64(v int64)    { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) str(s string)   { e.u64(uint64(len(s))); e.b = append(e.b, s...) }
func (e *enc) bytes(b []byte) { e.u64(uint64(len(b))); e.b = append(e.b, b...) }

func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

// dec reads what enc wrote (varint.Reader). Its failures are
// INVALID_PARAMS errors naming what was being decoded.
type dec struct {
	varint.Reader
	// kind and name ("command", "PutStart") say what is being decoded in
	// error messages; they are joined only on failure, as decoding is on
	// every node's apply path.
	kind, name string
	// transport: segment specs carry their transport fields (the entry's
	// command type says so).
	transport bool
	// promoteMooncake: a Promote carries the leader's Mooncake address.
	promoteMooncake bool
	// upsertCopy: an UpsertStart copies a leased object.
	upsertCopy bool
}

func newDec(b []byte, kind, name string) dec {
	return dec{Reader: varint.NewReader(b), kind: kind, name: name}
}

// err is the first failure as an error, nil if none.
func (d *dec) err() error {
	if _, msg, failed := d.Failure(); failed {
		return errcode.New(errcode.InvalidParams, "%s %s: %s", d.kind, d.name, msg)
	}
	return nil
}

func (d *dec) u64() uint64 { return d.Uvarint("number") }
func (d *dec) i64() int64  { return d.Varint("number") }

func (d *dec) bool() bool {
	switch v := d.u64(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.Fail("boolean is %d", v)
		return false
	}
}

func (d *dec) str() string { return string(d.bytes()) }

// bytes reads what enc.bytes or enc.str wrote; the result aliases the input.
func (d *dec) bytes() []byte { return d.Bytes("string") }

// count reads a list length; each element takes at least minBytes, which
// bounds the allocation a corrupted length can cause.
func (d *dec) count(minBytes int) int {
	n := d.u64()
	if d.err() != nil {
		return 0
	}
	if n > uint64(d.Remaining()/minBytes) {
		d.Fail("list of %d elements but only %d bytes remain", n, d.Remaining())
		return 0
	}
	return int(n)
}

// done reports trailing bytes as an error: a record decodes exactly.
func (d *dec) done() error {
	d.Done()
	return d.err()
}

// Limits on client-supplied input.
const (
	MaxKeyLen      = 4096
	MaxRegexLen    = 4096
	MaxReplicas    = 8
	MaxSlices      = 1024
	MaxIDLen       = 256
	maxSegmentName = 1024
)

func validateKey(key string) error {
	switch {
	case key == "":
		return errcode.New(errcode.InvalidKey, "key is empty")
	case len(key) > MaxKeyLen:
		return errcode.New(errcode.InvalidKey, "key is %d bytes, the limit is %d", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return errcode.New(errcode.InvalidKey, "key is not valid UTF-8")
	}
	return nil
}

func validateID(kind, id string) error {
	switch {
	case id == "":
		return errcode.New(errcode.InvalidParams, "%s is empty", kind)
	case len(id) > MaxIDLen:
		return errcode.New(errcode.InvalidParams, "%s is %d bytes, the limit is %d", kind, len(id), MaxIDLen)
	case !utf8.ValidString(id):
		return errcode.New(errcode.InvalidParams, "%s is not valid UTF-8", kind)
	}
	return nil
}
