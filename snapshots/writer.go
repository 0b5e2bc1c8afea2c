package snapshots

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"io"

	"github.com/moonraft/moonraft/errcode"
)

// Writer streams a snapshot. It buffers at most bufSize bytes, never the
// whole body.
type Writer struct {
	bw        *bufio.Writer
	hw        *hashWriter
	dst       io.Writer // nil for a digest writer, which has no trailer
	names     map[string]struct{}
	inSection bool
	closed    bool
	err       error // first write failure; the output is unusable after it
	digest    [32]byte
	scratch   [1 + binary.MaxVarintLen64]byte // frame prefix, so Record does not allocate
}

// hashWriter sits below the bufio.Writer so that hashing runs over whole
// buffers instead of per frame. It hashes all that is written: a file
// writer's whole file, for its trailer, and a digest writer's body, which
// is all it writes. A file writer leaves its body's digest to the file's
// reader (Reader.Digest): hashing the body a second time was an eighth of
// writing a snapshot.
type hashWriter struct {
	dst  io.Writer
	hash hash.Hash
}

func (h *hashWriter) Write(p []byte) (int, error) {
	n, err := h.dst.Write(p)
	h.hash.Write(p[:n])
	return n, err
}

// NewWriter writes the magic, version and header to w and returns a Writer
// for the body. Close writes the trailer; w is never closed.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	hdr := appendHeader(nil, h)
	if len(hdr) > MaxHeaderSize {
		return nil, errcode.New(errcode.InvalidParams, "snapshot header is %d bytes, more than the limit of %d", len(hdr), MaxHeaderSize)
	}
	sw := newWriter(w, true)
	sw.bw.WriteString(Magic)
	sw.bw.Write(binary.BigEndian.AppendUint32(nil, Version))
	sw.bw.Write(binary.AppendUvarint(nil, uint64(len(hdr))))
	sw.bw.Write(hdr)
	// A destination that cannot take the header fails here.
	if err := sw.flush(); err != nil {
		return nil, err
	}
	return sw, nil
}

// NewDigestWriter returns a Writer that only computes the body digest: it
// writes no file, has no header and no trailer. Digest after Close equals
// the digest of a snapshot file with the same sections and records
// (Reader.Digest).
func NewDigestWriter() *Writer {
	return newWriter(io.Discard, false)
}

func newWriter(w io.Writer, file bool) *Writer {
	hw := &hashWriter{dst: w, hash: sha256.New()}
	sw := &Writer{bw: bufio.NewWriterSize(hw, bufSize), hw: hw, names: map[string]struct{}{}}
	if file {
		sw.dst = w
	}
	return sw
}

func (w *Writer) usable() error {
	if w.closed {
		return errcode.New(errcode.InvalidParams, "snapshot writer is closed")
	}
	return w.err
}

func (w *Writer) flush() error {
	if err := w.bw.Flush(); err != nil {
		w.err = errcode.New(errcode.FileWriteFail, "writing snapshot: %v", err)
	}
	return w.err
}

// noteErr records a write failure reported by bufio, which keeps it sticky.
func (w *Writer) noteErr(err error) error {
	if err != nil && w.err == nil {
		w.err = errcode.New(errcode.FileWriteFail, "writing snapshot: %v", err)
	}
	return w.err
}

// Section starts a section. Names are 1..255 bytes and unique within a file.
func (w *Writer) Section(name string) error {
	if err := w.usable(); err != nil {
		return err
	}
	if len(name) == 0 || len(name) > MaxSectionNameLen {
		return errcode.New(errcode.InvalidParams, "snapshot section name must be 1..%d bytes, got %d", MaxSectionNameLen, len(name))
	}
	if _, dup := w.names[name]; dup {
		return errcode.New(errcode.InvalidParams, "duplicate snapshot section %q", name)
	}
	w.names[name] = struct{}{}
	w.inSection = true
	w.scratch[0] = tagSection
	n := binary.PutUvarint(w.scratch[1:], uint64(len(name)))
	w.bw.Write(w.scratch[:1+n])
	_, err := w.bw.WriteString(name)
	return w.noteErr(err)
}

// Record appends one record of at most MaxRecordSize bytes to the current
// section.
func (w *Writer) Record(b []byte) error {
	if err := w.usable(); err != nil {
		return err
	}
	if !w.inSection {
		return errcode.New(errcode.InvalidParams, "snapshot record written before any section")
	}
	if len(b) > MaxRecordSize {
		return errcode.New(errcode.InvalidParams, "snapshot record is %d bytes, more than the limit of %d", len(b), MaxRecordSize)
	}
	w.scratch[0] = tagRecord
	n := binary.PutUvarint(w.scratch[1:], uint64(len(b)))
	w.bw.Write(w.scratch[:1+n])
	_, err := w.bw.Write(b)
	return w.noteErr(err)
}

// Close writes the end tag and the trailer and flushes. It does not close
// the underlying io.Writer.
func (w *Writer) Close() error {
	if err := w.usable(); err != nil {
		return err
	}
	w.closed = true
	w.bw.WriteByte(tagEnd)
	if err := w.flush(); err != nil {
		return err
	}
	if w.dst == nil {
		w.hw.hash.Sum(w.digest[:0])
		return nil
	}
	// Straight to dst: the trailer is not part of what it hashes.
	if _, err := w.dst.Write(w.hw.hash.Sum(nil)); err != nil {
		w.err = errcode.New(errcode.FileWriteFail, "writing snapshot trailer: %v", err)
	}
	return w.err
}

// Digest returns the SHA-256 of the body (first frame through the end tag)
// written to a digest writer (NewDigestWriter). It is valid after a
// successful Close and zero before; a file writer's is always zero (the
// file's reader computes it, Reader.Digest).
func (w *Writer) Digest() [32]byte {
	if !w.closed || w.err != nil {
		return [32]byte{}
	}
	return w.digest
}
