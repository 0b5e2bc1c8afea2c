package snapshots

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"
	"strings"

	"github.com/moonraft/moonraft/errcode"
)

// Reader streams a snapshot back. Its own buffer (rather than a
// bufio.Reader) lets it hand out records without copying and hash consumed
// bytes in bulk while keeping the trailer out of the hash.
type Reader struct {
	src    io.Reader
	srcErr error // sticky error of src, io.EOF included
	buf    []byte
	r, w   int   // buf[r:w] is read but not consumed
	h      int   // buf[h:r] is consumed but not hashed yet
	base   int64 // file offset of buf[0]
	big    []byte

	file, body hash.Hash
	inBody     bool

	hdr       Header
	section   string
	names     map[string]struct{}
	onSection func(name string) // lets Inspect see empty sections
	err       error             // sticky; io.EOF once the trailer verified
	digest    [32]byte
}

// NewReader reads and validates the magic, version and header of a
// snapshot.
func NewReader(src io.Reader) (*Reader, error) {
	r := &Reader{
		src:   src,
		buf:   make([]byte, bufSize),
		file:  sha256.New(),
		body:  sha256.New(),
		names: map[string]struct{}{},
	}
	err := r.fill(len(Magic))
	magic := string(r.buf[:min(r.w, len(Magic))])
	switch {
	case magic == Magic:
	case err != nil && (!isEOF(err) || strings.HasPrefix(Magic, magic)):
		return nil, r.fail(err, 0, "magic", len(Magic))
	default:
		return nil, errcode.New(errcode.FileReadFail, "not a moonraft snapshot: magic is %q, want %q", magic, Magic)
	}
	r.r = len(Magic)
	if err := r.fill(4); err != nil {
		return nil, r.fail(err, r.off(), "format version", 4)
	}
	if v := binary.BigEndian.Uint32(r.buf[r.r:]); v != Version {
		return nil, errcode.New(errcode.InvalidVersion, "snapshot format version %d, this build reads version %d", v, Version)
	}
	r.r += 4
	at := r.off()
	n, err := r.uvarint("header length")
	if err != nil {
		return nil, err
	}
	if n > MaxHeaderSize {
		return nil, r.malformed(at, "header length %d exceeds the limit of %d", n, MaxHeaderSize)
	}
	at = r.off()
	b, err := r.bytes(int(n), "header")
	if err != nil {
		return nil, err
	}
	if r.hdr, err = decodeHeader(b, at); err != nil {
		return nil, err
	}
	r.flushHash()
	r.inBody = true
	return r, nil
}

// Header returns the snapshot's header. Like the records, it is only known
// to be intact once Next returned io.EOF.
func (r *Reader) Header() Header { return r.hdr }

// Next returns the next record and the name of its section. data is valid
// only until the next call. After the last record Next verifies the
// trailer and returns io.EOF if it holds; any other error means the file is
// unusable and everything read from it must be discarded.
func (r *Reader) Next() (section string, data []byte, err error) {
	if r.err != nil {
		return "", nil, r.err
	}
	section, data, err = r.next()
	if err != nil {
		r.err = err
		return "", nil, err
	}
	return section, data, nil
}

func (r *Reader) next() (string, []byte, error) {
	for {
		at := r.off()
		if err := r.fill(1); err != nil {
			return "", nil, r.fail(err, at, "frame tag", 0)
		}
		tag := r.buf[r.r]
		r.r++
		switch tag {
		case tagSection:
			if err := r.readSection(at); err != nil {
				return "", nil, err
			}
		case tagRecord:
			if len(r.names) == 0 {
				return "", nil, r.malformed(at, "record outside any section")
			}
			n, err := r.uvarint("record length")
			if err != nil {
				return "", nil, err
			}
			if n > MaxRecordSize {
				return "", nil, r.malformed(at, "record length %d exceeds the limit of %d", n, MaxRecordSize)
			}
			data, err := r.bytes(int(n), "record")
			if err != nil {
				return "", nil, err
			}
			// Hash now rather than later: the caller may modify data.
			r.flushHash()
			return r.section, data, nil
		case tagEnd:
			return "", nil, r.readTrailer()
		default:
			return "", nil, r.malformed(at, "unknown frame tag %d", tag)
		}
	}
}

func (r *Reader) readSection(at int64) error {
	n, err := r.uvarint("section name length")
	if err != nil {
		return err
	}
	if n == 0 || n > MaxSectionNameLen {
		return r.malformed(at, "section name length %d is not in 1..%d", n, MaxSectionNameLen)
	}
	name, err := r.bytes(int(n), "section name")
	if err != nil {
		return err
	}
	if _, dup := r.names[string(name)]; dup {
		return r.malformed(at, "duplicate section %q", name)
	}
	r.section = string(name)
	r.names[r.section] = struct{}{}
	if r.onSection != nil {
		r.onSection(r.section)
	}
	return nil
}

func (r *Reader) readTrailer() error {
	r.flushHash()
	if r.body != nil {
		r.body.Sum(r.digest[:0])
	}
	at := r.off()
	if err := r.fill(trailerSize); err != nil {
		r.digest = [32]byte{}
		return r.fail(err, at, "SHA-256 trailer", trailerSize)
	}
	var sum [32]byte
	if !bytes.Equal(r.file.Sum(sum[:0]), r.buf[r.r:r.r+trailerSize]) {
		r.digest = [32]byte{}
		return errcode.New(errcode.ChecksumMismatch, "snapshot checksum mismatch: file is corrupted")
	}
	r.r += trailerSize
	r.h = r.r
	return io.EOF
}

// expectEnd reports an error unless the source ends right after the
// trailer.
func (r *Reader) expectEnd() error {
	at := r.off()
	err := r.fill(1)
	switch {
	case err == nil:
		return errcode.New(errcode.FileReadFail, "unexpected data after the snapshot trailer at byte %d", at)
	case isEOF(err):
		return nil
	default:
		return r.fail(err, at, "end of file", 0)
	}
}

// SkipDigest, called before the first Next, spares the reader hashing the
// body a second time for Digest (the file's checksum is verified all the
// same); Digest is then zero.
func (r *Reader) SkipDigest() { r.body = nil }

// Digest returns the SHA-256 of the body. It is valid after Next returned
// io.EOF and zero before, or after SkipDigest.
func (r *Reader) Digest() [32]byte {
	if r.err != io.EOF {
		return [32]byte{}
	}
	return r.digest
}

func (r *Reader) off() int64 { return r.base + int64(r.r) }

func (r *Reader) malformed(at int64, format string, args ...any) error {
	return errcode.New(errcode.FileReadFail, "malformed snapshot at byte %d: %s", at, fmt.Sprintf(format, args...))
}

// fail turns a read failure while expecting what (of n bytes, if n > 0) at
// offset at into an error that says where the file ended or what the source
// reported.
func (r *Reader) fail(err error, at int64, what string, n int) error {
	if n > 0 {
		what = fmt.Sprintf("%s of %d bytes", what, n)
	}
	if isEOF(err) {
		return errcode.New(errcode.FileReadFail, "snapshot truncated at byte %d: expected %s at byte %d", r.base+int64(r.w), what, at)
	}
	return errcode.New(errcode.FileReadFail, "reading snapshot at byte %d: %v", at, err)
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func (r *Reader) hash(p []byte) {
	r.file.Write(p)
	if r.inBody && r.body != nil {
		r.body.Write(p)
	}
}

func (r *Reader) flushHash() {
	r.hash(r.buf[r.h:r.r])
	r.h = r.r
}

// read reads once from src into p, recording a failure in srcErr.
func (r *Reader) read(p []byte) int {
	// Like bufio, give up on a source that keeps returning nothing.
	for range 100 {
		n, err := r.src.Read(p)
		if err != nil {
			r.srcErr = err
		}
		if n > 0 || err != nil {
			return n
		}
	}
	r.srcErr = io.ErrNoProgress
	return 0
}

// fill makes at least n <= len(buf) bytes available in buf[r:w], or
// returns the error of the source that prevented it.
func (r *Reader) fill(n int) error {
	if r.w-r.r >= n {
		return nil
	}
	if len(r.buf)-r.r < n {
		r.flushHash()
		copy(r.buf, r.buf[r.r:r.w])
		r.base += int64(r.r)
		r.w -= r.r
		r.r, r.h = 0, 0
	}
	for r.w-r.r < n {
		if r.srcErr != nil {
			return r.srcErr
		}
		r.w += r.read(r.buf[r.w:])
	}
	return nil
}

func (r *Reader) uvarint(what string) (uint64, error) {
	at := r.off()
	// Near the end of the file fewer bytes may follow than a varint can
	// take; that only matters if the varint is incomplete.
	err := r.fill(binary.MaxVarintLen64)
	v, n := binary.Uvarint(r.buf[r.r:r.w])
	switch {
	case n > 0:
		r.r += n
		return v, nil
	case n < 0:
		return 0, r.malformed(at, "%s overflows 64 bits", what)
	default:
		return 0, r.fail(err, at, what, 0)
	}
}

// bytes consumes n bytes. Those that fit the buffer are returned in place;
// longer ones go to r.big, grown as data arrives so that a forged length
// cannot make the reader allocate more than twice what the file holds.
func (r *Reader) bytes(n int, what string) ([]byte, error) {
	at := r.off()
	if n <= len(r.buf) {
		if err := r.fill(n); err != nil {
			return nil, r.fail(err, at, what, n)
		}
		b := r.buf[r.r : r.r+n : r.r+n]
		r.r += n
		return b, nil
	}
	r.flushHash()
	b := append(r.big[:0], r.buf[r.r:r.w]...)
	r.base += int64(r.w)
	r.r, r.w, r.h = 0, 0, 0
	for len(b) < n {
		if r.srcErr != nil {
			r.big = b
			return nil, r.fail(r.srcErr, at, what, n)
		}
		if len(b) == cap(b) {
			b = slices.Grow(b, min(n-len(b), max(cap(b), len(r.buf))))
		}
		m := r.read(b[len(b):min(n, cap(b))])
		b = b[:len(b)+m]
		r.base += int64(m)
	}
	r.big = b
	r.hash(b)
	return b[:n:n], nil
}
