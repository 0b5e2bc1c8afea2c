// Package varint reads the compact encoding that the state machine's
// commands and records and the snapshot header share: uvarints, zigzag
// varints (encoding/binary's) and uvarint-length-prefixed bytes, from a
// slice held in memory. The first error sticks, so a decoder reads a
// whole struct and checks once; a length is checked against the bytes
// that remain before anything is allocated.
package varint

import (
	"encoding/binary"
	"fmt"
)

// Reader reads b from the start. Its owner turns a failure into the
// error its callers expect (Failure); the message is formatted only when
// the input is malformed, so a Reader costs no allocation on the hot path.
type Reader struct {
	b    []byte
	pos  int
	fail *failure // nil while the input is sound
}

type failure struct {
	at  int
	msg string
}

// NewReader reads b.
func NewReader(b []byte) Reader { return Reader{b: b} }

// Failure says what was wrong with the input, at which offset of b, once
// something was; ok is false while nothing was.
func (r *Reader) Failure() (at int, msg string, ok bool) {
	if r.fail == nil {
		return 0, "", false
	}
	return r.fail.at, r.fail.msg, true
}

// Remaining is the number of bytes not read yet.
func (r *Reader) Remaining() int { return len(r.b) - r.pos }

// Fail records malformed input unless a failure already stands.
func (r *Reader) Fail(format string, args ...any) {
	if r.fail == nil {
		r.fail = &failure{at: r.pos, msg: fmt.Sprintf(format, args...)}
	}
}

// Uvarint reads an unsigned varint; what names it in the failure.
func (r *Reader) Uvarint(what string) uint64 {
	v, ok := r.uvarint()
	if !ok {
		r.Fail("truncated or malformed %s", what)
	}
	return v
}

func (r *Reader) uvarint() (uint64, bool) {
	if r.fail != nil {
		return 0, true
	}
	v, n := binary.Uvarint(r.b[r.pos:])
	if n <= 0 {
		return 0, false
	}
	r.pos += n
	return v, true
}

// Varint reads a zigzag varint; what names it in the error.
func (r *Reader) Varint(what string) int64 {
	if r.fail != nil {
		return 0
	}
	v, n := binary.Varint(r.b[r.pos:])
	if n <= 0 {
		r.Fail("truncated or malformed %s", what)
		return 0
	}
	r.pos += n
	return v
}

// Bytes reads a uvarint length and that many bytes, which alias b.
func (r *Reader) Bytes(what string) []byte {
	n, ok := r.uvarint()
	if !ok {
		r.Fail("truncated or malformed %s length", what)
	}
	if r.fail != nil {
		return nil
	}
	if n > uint64(r.Remaining()) {
		r.Fail("%s of %d bytes but only %d remain", what, n, r.Remaining())
		return nil
	}
	b := r.b[r.pos : r.pos+int(n) : r.pos+int(n)]
	r.pos += int(n)
	return b
}

// Done records bytes left unread as a failure: a record decodes exactly.
func (r *Reader) Done() {
	if r.pos != len(r.b) {
		r.Fail("%d unexpected trailing bytes", len(r.b)-r.pos)
	}
}
