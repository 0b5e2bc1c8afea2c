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
	"github.com/moonraft/moonraft/internal/varint"
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

func decodeHeader(b []byte, at int64) (Header, error) {
	r := varint.NewReader(b)
	str := func(what string) string { return string(r.Bytes(what)) }
	h := Header{
		RaftIndex:     r.Uvarint("raft index"),
		RaftTerm:      r.Uvarint("raft term"),
		AppliedSeq:    r.Uvarint("applied seq"),
		ClusterID:     str("cluster id"),
		NodeID:        str("node id"),
		CreatedUnixMs: r.Varint("creation time"),
		Segments:      r.Uvarint("segment count"),
		Sessions:      r.Uvarint("session count"),
		Objects:       r.Uvarint("object count"),
		Bytes:         r.Uvarint("byte count"),
	}
	r.Done()
	if pos, msg, failed := r.Failure(); failed {
		return h, errcode.New(errcode.FileReadFail, "malformed snapshot header at byte %d: %s", at+int64(pos), msg)
	}
	return h, nil
}
