// Package snapshots reads and writes moonraft's snapshot container: the file
// that carries the FSM state for Raft's FSM.Snapshot/Restore, for
// `moonctl snapshot save|inspect|restore` and for the offline restore. It
// knows nothing of the state itself; fsm/ decides what the sections and
// records contain.
//
// Format version 1:
//
//	"MOONSNAP"                 8 bytes of magic
//	version                    uint32, big-endian (= 1)
//	header length L            uvarint, L <= 1 MiB
//	header                     L bytes (see Header)
//	body                       frames, each starting with a one-byte tag:
//	  1 section begin          uvarint name length (1..255) + name, unique per file
//	  2 record                 uvarint length (<= 64 MiB) + bytes; only inside a section
//	  3 end of body            exactly once, last
//	trailer                    32 bytes: SHA-256 of every byte before it
//
// The header is a sequence of fields in Header's order: uvarints for the
// unsigned ones, a zigzag varint for CreatedUnixMs, a uvarint length plus
// bytes for strings. It must be consumed exactly.
//
// The SHA-256 of the body alone (first frame through the end tag) is the state
// digest: it leaves out the header, so two snapshots of the same state taken
// at different Raft indexes have equal digests. NewDigestWriter computes it
// without writing a file.
//
// Nothing read from a file is trusted before the trailer is verified, so a
// restore must build its new state aside and swap it in only after
// Reader.Next returned io.EOF.
package snapshots

import (
	"encoding/binary"

	"github.com/moonraft/moonraft/errcode"
)

// Magic opens every snapshot file.
const Magic = "MOONSNAP"

// Version is the format version this package writes and reads.
const Version uint32 = 1

// Limits of the format. They bound what a reader allocates for a length
// field it cannot trust yet.
const (
	MaxHeaderSize     = 1 << 20
	MaxSectionNameLen = 255
	MaxRecordSize     = 64 << 20
)

const (
	tagSection byte = 1
	tagRecord  byte = 2
	tagEnd     byte = 3
)

// trailerSize is the size of the SHA-256 that closes the file.
const trailerSize = 32

// bufSize is the buffer of readers and writers: large enough that hashing
// and I/O run in bulk rather than per record.
const bufSize = 256 << 10

// Header describes the state a snapshot holds. The counts are informational,
// for inspect; nothing checks them against the body.
type Header struct {
	RaftIndex     uint64
	RaftTerm      uint64
	AppliedSeq    uint64 // last OpLog sequence id the state covers
	ClusterID     string
	NodeID        string
	CreatedUnixMs int64
	Segments      uint64
	Sessions      uint64
	Objects       uint64
	Bytes         uint64 // bytes allocated to objects
}

func appendHeader(b []byte, h Header) []byte {
	b = binary.AppendUvarint(b, h.RaftIndex)
	b = binary.AppendUvarint(b, h.RaftTerm)
	b = binary.AppendUvarint(b, h.AppliedSeq)
	b = appendString(b, h.ClusterID)
	b = appendString(b, h.NodeID)
	b = binary.AppendVarint(b, h.CreatedUnixMs)
	b = binary.AppendUvarint(b, h.Segments)
	b = binary.AppendUvarint(b, h.Sessions)
	b = binary.AppendUvarint(b, h.Objects)
	return binary.AppendUvarint(b, h.Bytes)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// headerDecoder decodes a header held in memory; the first error sticks so
// that decodeHeader can read all fields and check once.
type headerDecoder struct {
	b   []byte
	pos int
	at  int64 // file offset of b[0], for messages
	err error
}

func decodeHeader(b []byte, at int64) (Header, error) {
	d := headerDecoder{b: b, at: at}
	h := Header{
		RaftIndex:     d.uvarint("raft index"),
		RaftTerm:      d.uvarint("raft term"),
		AppliedSeq:    d.uvarint("applied seq"),
		ClusterID:     d.string("cluster id"),
		NodeID:        d.string("node id"),
		CreatedUnixMs: d.varint("creation time"),
		Segments:      d.uvarint("segment count"),
		Sessions:      d.uvarint("session count"),
		Objects:       d.uvarint("object count"),
		Bytes:         d.uvarint("byte count"),
	}
	if d.err == nil && d.pos != len(b) {
		d.fail("%d bytes of trailing garbage", len(b)-d.pos)
	}
	return h, d.err
}

func (d *headerDecoder) fail(format string, args ...any) {
	if d.err == nil {
		args = append([]any{d.at + int64(d.pos)}, args...)
		d.err = errcode.New(errcode.FileReadFail, "malformed snapshot header at byte %d: "+format, args...)
	}
}

func (d *headerDecoder) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.pos:])
	if n <= 0 {
		d.fail("bad or missing %s", field)
		return 0
	}
	d.pos += n
	return v
}

func (d *headerDecoder) varint(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b[d.pos:])
	if n <= 0 {
		d.fail("bad or missing %s", field)
		return 0
	}
	d.pos += n
	return v
}

func (d *headerDecoder) string(field string) string {
	n := d.uvarint(field + " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)-d.pos) {
		d.fail("%s of %d bytes overruns the header", field, n)
		return ""
	}
	s := string(d.b[d.pos : d.pos+int(n)])
	d.pos += int(n)
	return s
}
