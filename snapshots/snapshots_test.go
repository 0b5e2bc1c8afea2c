package snapshots

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/errcode"
)

type section struct {
	name    string
	records [][]byte
}

var testHeader = Header{
	RaftIndex:     1234,
	RaftTerm:      7,
	AppliedSeq:    99,
	ClusterID:     "cluster-a",
	NodeID:        "node-1",
	CreatedUnixMs: -5, // negative, to exercise zigzag
	Segments:      3,
	Sessions:      2,
	Objects:       1 << 40,
	Bytes:         ^uint64(0),
}

// pattern returns n bytes that differ from record to record.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func writeBody(t testing.TB, w *Writer, secs []section) {
	for _, s := range secs {
		require.NoError(t, w.Section(s.name))
		for _, r := range s.records {
			require.NoError(t, w.Record(r))
		}
	}
	require.NoError(t, w.Close())
}

// writeSnap writes a file of secs and returns it with its body digest, as
// its reader computes it: a file writer computes none.
func writeSnap(t testing.TB, h Header, secs []section) ([]byte, [32]byte) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	require.NoError(t, err)
	writeBody(t, w, secs)
	require.Equal(t, [32]byte{}, w.Digest(), "a file writer's digest")
	r, _, err := readAll(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	return buf.Bytes(), r.Digest()
}

func bodyDigest(t testing.TB, secs []section) [32]byte {
	w := NewDigestWriter()
	writeBody(t, w, secs)
	return w.Digest()
}

type readRecord struct {
	section string
	data    []byte
}

// readAll reads every record (copying it, since the reader reuses its
// buffer) and returns the first error that is not io.EOF.
func readAll(src io.Reader) (*Reader, []readRecord, error) {
	r, err := NewReader(src)
	if err != nil {
		return nil, nil, err
	}
	var got []readRecord
	for {
		name, data, err := r.Next()
		if err == io.EOF {
			return r, got, nil
		}
		if err != nil {
			return r, got, err
		}
		got = append(got, readRecord{name, bytes.Clone(data)})
	}
}

// smallSnap is a small file with every kind of frame, for the tests that
// damage it at every offset.
func smallSnap(t testing.TB) []byte {
	b, _ := writeSnap(t, Header{RaftIndex: 5, RaftTerm: 1, ClusterID: "c", NodeID: "n"}, []section{
		{name: "segments", records: [][]byte{[]byte("seg-1"), {}}},
		{name: "empty"},
		{name: "objects", records: [][]byte{[]byte("object-a"), pattern(20, 1)}},
	})
	return b
}

func TestRoundTrip(t *testing.T) {
	sizes := []int{0, 1, 2, 127, 128, 255, 16383, 16384, 100_000}
	var many [][]byte
	for i, n := range sizes {
		many = append(many, pattern(n, byte(i)))
	}
	tiny := make([][]byte, 10_000)
	for i := range tiny {
		tiny[i] = pattern(i%5, byte(i))
	}
	cases := []struct {
		name string
		secs []section
	}{
		{"no sections", nil},
		{"only an empty section", []section{{name: "empty"}}},
		{"zero-length records", []section{{name: "z", records: [][]byte{{}, {}, {}}}}},
		{"several sections", []section{
			{name: "segments", records: many},
			{name: "empty"},
			{name: "sessions", records: [][]byte{[]byte("s1"), {}, []byte("s3")}},
			{name: "also-empty"},
			{name: strings.Repeat("n", MaxSectionNameLen), records: [][]byte{[]byte("long name")}},
		}},
		{"many tiny records crossing buffer refills", []section{{name: "tiny", records: tiny}}},
		{"records larger than the buffer", []section{
			{name: "big", records: [][]byte{pattern(bufSize+1, 1), []byte("x"), pattern(3*bufSize+17, 2), {}}},
			{name: "after", records: [][]byte{pattern(bufSize, 3)}},
		}},
	}
	sources := map[string]func([]byte) io.Reader{
		"bytes":    func(b []byte) io.Reader { return bytes.NewReader(b) },
		"one byte": func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
		"half":     func(b []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(b)) },
		"data+EOF": func(b []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			file, wd := writeSnap(t, testHeader, tc.secs)
			assert.Equal(t, bodyDigest(t, tc.secs), wd, "digest writer")
			var want []readRecord
			for _, s := range tc.secs {
				for _, r := range s.records {
					want = append(want, readRecord{s.name, r})
				}
			}
			for srcName, src := range sources {
				r, got, err := readAll(src(file))
				require.NoError(t, err, srcName)
				assert.Equal(t, testHeader, r.Header(), srcName)
				require.Equal(t, len(want), len(got), srcName)
				for i := range want {
					require.Equal(t, want[i].section, got[i].section, "%s record %d", srcName, i)
					require.True(t, bytes.Equal(want[i].data, got[i].data), "%s record %d differs", srcName, i)
				}
				assert.Equal(t, wd, r.Digest(), srcName)
			}

			sum, err := Inspect(bytes.NewReader(file))
			require.NoError(t, err)
			assert.Equal(t, testHeader, sum.Header)
			assert.Equal(t, Version, sum.Version)
			assert.Equal(t, wd, sum.Digest)
			assert.Equal(t, int64(len(file)), sum.FileBytes)
			require.Len(t, sum.Sections, len(tc.secs))
			for i, s := range tc.secs {
				var n uint64
				for _, r := range s.records {
					n += uint64(len(r))
				}
				assert.Equal(t, SectionSummary{Name: s.name, Records: uint64(len(s.records)), Bytes: n}, sum.Sections[i])
			}
		})
	}
}

func TestDigest(t *testing.T) {
	body := []section{{name: "a", records: [][]byte{[]byte("x"), []byte("yz")}}, {name: "b"}}
	file1, d1 := writeSnap(t, testHeader, body)
	file2, d2 := writeSnap(t, Header{RaftIndex: 9999, RaftTerm: 8, NodeID: "other"}, body)
	assert.NotEqual(t, file1, file2)
	assert.Equal(t, d1, d2, "same body under different headers")
	assert.Equal(t, d1, bodyDigest(t, body))
	assert.NotEqual(t, [32]byte{}, d1)

	others := map[string][]section{
		"record changed":      {{name: "a", records: [][]byte{[]byte("x"), []byte("yy")}}, {name: "b"}},
		"record split":        {{name: "a", records: [][]byte{[]byte("x"), []byte("y"), []byte("z")}}, {name: "b"}},
		"empty record added":  {{name: "a", records: [][]byte{[]byte("x"), []byte("yz"), {}}}, {name: "b"}},
		"empty section gone":  {{name: "a", records: [][]byte{[]byte("x"), []byte("yz")}}},
		"section renamed":     {{name: "a", records: [][]byte{[]byte("x"), []byte("yz")}}, {name: "c"}},
		"record moved across": {{name: "a", records: [][]byte{[]byte("x")}}, {name: "b", records: [][]byte{[]byte("yz")}}},
		"no body":             nil,
	}
	for name, secs := range others {
		_, d := writeSnap(t, testHeader, secs)
		assert.NotEqual(t, d1, d, name)
		assert.Equal(t, d, bodyDigest(t, secs), name)
	}
}

func TestTruncatedAtEveryOffset(t *testing.T) {
	file := smallSnap(t)
	for n := range len(file) {
		_, _, err := readAll(bytes.NewReader(file[:n]))
		require.Error(t, err, "prefix of %d bytes", n)
		require.Equal(t, errcode.FileReadFail, errcode.Of(err), "prefix of %d bytes: %v", n, err)
		_, err = Inspect(bytes.NewReader(file[:n]))
		require.Equal(t, errcode.FileReadFail, errcode.Of(err), "prefix of %d bytes: %v", n, err)
	}
}

func TestBitFlipAtEveryOffset(t *testing.T) {
	file := smallSnap(t)
	for i := range file {
		for bit := range 8 {
			bad := bytes.Clone(file)
			bad[i] ^= 1 << bit
			_, _, err := readAll(bytes.NewReader(bad))
			require.Error(t, err, "byte %d bit %d", i, bit)
			_, err = Inspect(bytes.NewReader(bad))
			require.Error(t, err, "byte %d bit %d", i, bit)
		}
	}
}

// Builders of hand-made files, for inputs the Writer refuses to produce.

func uv(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func secFrame(name string) []byte {
	return cat([]byte{tagSection}, uv(uint64(len(name))), []byte(name))
}

func recFrame(data string) []byte { return cat([]byte{tagRecord}, uv(uint64(len(data))), []byte(data)) }

var endFrame = []byte{tagEnd}

// rawFile assembles magic, version, header and body, and appends a correct
// trailer, so that only the intended defect is wrong.
func rawFile(version uint32, hdr []byte, body ...[]byte) []byte {
	b := cat([]byte(Magic), binary.BigEndian.AppendUint32(nil, version), uv(uint64(len(hdr))), hdr, cat(body...))
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func good(body ...[]byte) []byte { return rawFile(Version, appendHeader(nil, testHeader), body...) }

// failingReader yields data and then err instead of io.EOF.
type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func TestBadInput(t *testing.T) {
	valid := good(secFrame("a"), recFrame("hello"), endFrame)
	hdr := appendHeader(nil, testHeader)
	badTrailer := bytes.Clone(valid)
	badTrailer[len(badTrailer)-1] ^= 0xff

	cases := []struct {
		name string
		file []byte
		code errcode.Code
		msg  string
	}{
		{"empty file", nil, errcode.FileReadFail, "snapshot truncated at byte 0: expected magic of 8 bytes"},
		{"short magic", []byte("MOON"), errcode.FileReadFail, "snapshot truncated at byte 4"},
		{"short non-snapshot", []byte("hi"), errcode.FileReadFail, `not a moonraft snapshot: magic is "hi"`},
		{"wrong magic", append([]byte("MOONSNAQ"), valid[8:]...), errcode.FileReadFail, `not a moonraft snapshot: magic is "MOONSNAQ"`},
		{"wrong version", rawFile(7, hdr, secFrame("a"), endFrame), errcode.InvalidVersion, "snapshot format version 7, this build reads version 1"},
		{"short version", []byte(Magic + "\x00\x00"), errcode.FileReadFail, "snapshot truncated at byte 10: expected format version of 4 bytes at byte 8"},
		{"header length over the limit", rawFile(Version, make([]byte, MaxHeaderSize+1), endFrame), errcode.FileReadFail, "header length 1048577 exceeds the limit"},
		{"header length overflows", cat([]byte(Magic), []byte{0, 0, 0, 1}, bytes.Repeat([]byte{0xff}, 10), []byte{1}), errcode.FileReadFail, "header length overflows"},
		{"header with trailing garbage", rawFile(Version, append(bytes.Clone(hdr), 0), endFrame), errcode.FileReadFail, "1 unexpected trailing bytes"},
		{"header too short", rawFile(Version, hdr[:len(hdr)-1], endFrame), errcode.FileReadFail, "truncated or malformed byte count"},
		{"header empty", rawFile(Version, nil, endFrame), errcode.FileReadFail, "malformed snapshot header at byte 13: truncated or malformed raft index"},
		{"header string overruns", rawFile(Version, cat(uv(1), uv(1), uv(1), uv(50), []byte("abc")), endFrame), errcode.FileReadFail, "cluster id of 50 bytes but only 3 remain"},
		{"header varint overflows", rawFile(Version, bytes.Repeat([]byte{0xff}, 11), endFrame), errcode.FileReadFail, "truncated or malformed raft index"},
		{"header bad signed varint", rawFile(Version, cat(uv(1), uv(1), uv(1), uv(0), uv(0), bytes.Repeat([]byte{0xff}, 11)), endFrame), errcode.FileReadFail, "truncated or malformed creation time"},
		{"header truncated", valid[:14], errcode.FileReadFail, "expected header of"},
		{"record before section", good(recFrame("x"), endFrame), errcode.FileReadFail, "record outside any section"},
		{"duplicate section", good(secFrame("a"), secFrame("b"), secFrame("a"), endFrame), errcode.FileReadFail, `duplicate section "a"`},
		{"unknown tag", good(secFrame("a"), []byte{4}, endFrame), errcode.FileReadFail, "unknown frame tag 4"},
		{"zero tag", good([]byte{0}, endFrame), errcode.FileReadFail, "unknown frame tag 0"},
		{"empty section name", good([]byte{tagSection, 0}, endFrame), errcode.FileReadFail, "section name length 0 is not in 1..255"},
		{"section name too long", good(secFrame(strings.Repeat("x", 256)), endFrame), errcode.FileReadFail, "section name length 256"},
		{"section name length overflows", good([]byte{tagSection}, bytes.Repeat([]byte{0x80}, 10), []byte{2}), errcode.FileReadFail, "section name length overflows"},
		{"record over the limit", good(secFrame("a"), []byte{tagRecord}, uv(MaxRecordSize+1), endFrame), errcode.FileReadFail, "record length 67108865 exceeds the limit"},
		{"record longer than the file", good(secFrame("a"), []byte{tagRecord}, uv(MaxRecordSize), endFrame), errcode.FileReadFail, "expected record of 67108864 bytes"},
		{"record longer than the rest", good(secFrame("a"), []byte{tagRecord}, uv(60), []byte("abc")), errcode.FileReadFail, "expected record of 60 bytes"},
		{"no end tag", rawFile(Version, hdr, secFrame("a"), recFrame("x"))[:8+4+1+len(hdr)+6], errcode.FileReadFail, "expected frame tag"},
		{"no trailer", valid[:len(valid)-trailerSize], errcode.FileReadFail, "expected SHA-256 trailer of 32 bytes"},
		{"short trailer", valid[:len(valid)-1], errcode.FileReadFail, "expected SHA-256 trailer of 32 bytes"},
		{"checksum mismatch", badTrailer, errcode.ChecksumMismatch, "snapshot checksum mismatch: file is corrupted"},
		{"end tag twice", good(secFrame("a"), endFrame, endFrame), errcode.ChecksumMismatch, "checksum mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := readAll(bytes.NewReader(tc.file))
			require.Error(t, err)
			assert.Equal(t, tc.code, errcode.Of(err), "%v", err)
			assert.Contains(t, err.Error(), tc.msg)
			_, err = Inspect(bytes.NewReader(tc.file))
			assert.Equal(t, tc.code, errcode.Of(err), "%v", err)
		})
	}
}

func TestTruncationMessage(t *testing.T) {
	file := good(secFrame("a"), recFrame(strings.Repeat("x", 52)), endFrame)
	recAt := len(file) - trailerSize - 1 - 52 - 2
	_, _, err := readAll(bytes.NewReader(file[:recAt+10]))
	assert.EqualError(t, err, fmt.Sprintf("FILE_READ_FAIL: snapshot truncated at byte %d: expected record of 52 bytes at byte %d", recAt+10, recAt+2))
}

func TestDataAfterTrailer(t *testing.T) {
	file := append(good(secFrame("a"), recFrame("x"), endFrame), 0)
	// A reader stops at the trailer, so Raft's restore is unaffected.
	_, got, err := readAll(bytes.NewReader(file))
	require.NoError(t, err)
	assert.Len(t, got, 1)
	_, err = Inspect(bytes.NewReader(file))
	assert.Equal(t, errcode.FileReadFail, errcode.Of(err))
	assert.ErrorContains(t, err, fmt.Sprintf("unexpected data after the snapshot trailer at byte %d", len(file)-1))
}

func TestSourceErrors(t *testing.T) {
	file := smallSnap(t)
	disk := errors.New("disk on fire")
	for _, n := range []int{0, 5, 8, 20, len(file) / 2, len(file) - 1} {
		_, _, err := readAll(&failingReader{data: file[:n], err: disk})
		assert.Equal(t, errcode.FileReadFail, errcode.Of(err), "after %d bytes", n)
		assert.ErrorContains(t, err, "disk on fire", "after %d bytes", n)
	}
	// After the trailer, only Inspect reads on and sees the failure.
	_, err := Inspect(&failingReader{data: file, err: disk})
	assert.Equal(t, errcode.FileReadFail, errcode.Of(err))
	assert.ErrorContains(t, err, "disk on fire")

	big, _ := writeSnap(t, testHeader, []section{{name: "big", records: [][]byte{pattern(3*bufSize, 0)}}})
	_, _, err = readAll(&failingReader{data: big[:2*bufSize], err: disk})
	assert.ErrorContains(t, err, "disk on fire")

	_, err = NewReader(iotest.ErrReader(io.ErrUnexpectedEOF))
	assert.ErrorContains(t, err, "snapshot truncated at byte 0")
}

type emptyReader struct{}

func (emptyReader) Read([]byte) (int, error) { return 0, nil }

func TestSourceWithoutProgress(t *testing.T) {
	_, err := NewReader(emptyReader{})
	assert.Equal(t, errcode.FileReadFail, errcode.Of(err))
	assert.ErrorContains(t, err, io.ErrNoProgress.Error())
}

func TestReaderIsSticky(t *testing.T) {
	file := smallSnap(t)
	r, err := NewReader(bytes.NewReader(file))
	require.NoError(t, err)
	assert.Equal(t, [32]byte{}, r.Digest(), "digest before EOF")
	for {
		if _, _, err = r.Next(); err != nil {
			break
		}
	}
	require.Equal(t, io.EOF, err)
	_, _, err = r.Next()
	assert.Equal(t, io.EOF, err)
	assert.NotEqual(t, [32]byte{}, r.Digest())

	bad := bytes.Clone(file)
	bad[len(bad)-1] ^= 1
	r, err = NewReader(bytes.NewReader(bad))
	require.NoError(t, err)
	for {
		if _, _, err = r.Next(); err != nil {
			break
		}
	}
	_, _, again := r.Next()
	assert.Equal(t, err, again)
	assert.Equal(t, [32]byte{}, r.Digest(), "no digest for a corrupted file")
}

// A reader that skips the digest still verifies the file's checksum.
func TestSkipDigest(t *testing.T) {
	file := smallSnap(t)
	bad := bytes.Clone(file)
	bad[len(bad)/2] ^= 1
	for _, tc := range []struct {
		name string
		file []byte
		want error
	}{{"intact", file, io.EOF}, {"corrupted", bad, nil}} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewReader(bytes.NewReader(tc.file))
			require.NoError(t, err)
			r.SkipDigest()
			for err == nil {
				_, _, err = r.Next()
			}
			if tc.want != nil {
				assert.Equal(t, tc.want, err)
			} else {
				assert.Error(t, err)
				assert.NotEqual(t, io.EOF, err)
			}
			assert.Equal(t, [32]byte{}, r.Digest())
		})
	}
}

// The caller may scribble over a record it was given: the checksum covers
// what was read, not what the buffer holds later.
func TestCallerMayModifyRecords(t *testing.T) {
	file := smallSnap(t)
	r, err := NewReader(bytes.NewReader(file))
	require.NoError(t, err)
	for {
		_, data, err := r.Next()
		if err != nil {
			require.Equal(t, io.EOF, err)
			break
		}
		for i := range data {
			data[i] = 0
		}
	}
}

// failingWriter accepts n bytes, then fails.
type failingWriter struct{ n int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		n := f.n
		f.n = 0
		return n, errors.New("disk full")
	}
	f.n -= len(p)
	return len(p), nil
}

func TestWriterMisuse(t *testing.T) {
	newW := func(t *testing.T) *Writer {
		w, err := NewWriter(io.Discard, testHeader)
		require.NoError(t, err)
		return w
	}
	cases := []struct {
		name string
		run  func(t *testing.T) error
		msg  string
	}{
		{"record before section", func(t *testing.T) error { return newW(t).Record([]byte("x")) }, "before any section"},
		{"duplicate section", func(t *testing.T) error {
			w := newW(t)
			require.NoError(t, w.Section("a"))
			require.NoError(t, w.Section("b"))
			return w.Section("a")
		}, `duplicate snapshot section "a"`},
		{"empty section name", func(t *testing.T) error { return newW(t).Section("") }, "must be 1..255 bytes, got 0"},
		{"section name too long", func(t *testing.T) error { return newW(t).Section(strings.Repeat("x", 256)) }, "got 256"},
		{"record too large", func(t *testing.T) error {
			w := newW(t)
			require.NoError(t, w.Section("a"))
			return w.Record(make([]byte, MaxRecordSize+1))
		}, "more than the limit"},
		{"section after close", func(t *testing.T) error {
			w := newW(t)
			require.NoError(t, w.Close())
			return w.Section("a")
		}, "closed"},
		{"record after close", func(t *testing.T) error {
			w := newW(t)
			require.NoError(t, w.Section("a"))
			require.NoError(t, w.Close())
			return w.Record(nil)
		}, "closed"},
		{"close twice", func(t *testing.T) error {
			w := NewDigestWriter()
			require.NoError(t, w.Close())
			return w.Close()
		}, "closed"},
		{"header too large", func(t *testing.T) error {
			_, err := NewWriter(io.Discard, Header{ClusterID: strings.Repeat("c", MaxHeaderSize)})
			return err
		}, "snapshot header is"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run(t)
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", err)
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestWriterRejectedCallsLeaveFileValid(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testHeader)
	require.NoError(t, err)
	assert.Error(t, w.Record([]byte("x")))
	require.NoError(t, w.Section("a"))
	assert.Error(t, w.Section("a"))
	require.NoError(t, w.Record([]byte("x")))
	require.NoError(t, w.Close())
	_, got, err := readAll(&buf)
	require.NoError(t, err)
	assert.Equal(t, []readRecord{{"a", []byte("x")}}, got)
}

func TestWriterOutputFails(t *testing.T) {
	file := smallSnap(t)
	for _, n := range []int{0, 10, 30, len(file) - trailerSize - 1, len(file) - 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w, err := NewWriter(&failingWriter{n: n}, Header{RaftIndex: 5, RaftTerm: 1, ClusterID: "c", NodeID: "n"})
			if err == nil {
				err = w.Section("segments")
				for err == nil {
					// Write until the buffer spills onto the failing writer.
					err = w.Record(pattern(bufSize/4, 0))
				}
			}
			assert.Equal(t, errcode.FileWriteFail, errcode.Of(err), "%v", err)
			assert.ErrorContains(t, err, "disk full")
		})
	}
	t.Run("trailer", func(t *testing.T) {
		whole, _ := writeSnap(t, testHeader, []section{{name: "x"}})
		w, err := NewWriter(&failingWriter{n: len(whole) - 1}, testHeader)
		require.NoError(t, err)
		require.NoError(t, w.Section("x"))
		err = w.Close()
		assert.Equal(t, errcode.FileWriteFail, errcode.Of(err), "%v", err)
		assert.Equal(t, [32]byte{}, w.Digest())
	})
	t.Run("close", func(t *testing.T) {
		w, err := NewWriter(&failingWriter{n: 30}, Header{})
		require.NoError(t, err)
		require.NoError(t, w.Section(strings.Repeat("x", 100)))
		err = w.Close()
		assert.Equal(t, errcode.FileWriteFail, errcode.Of(err), "%v", err)
		assert.Equal(t, errcode.InvalidParams, errcode.Of(w.Record(nil)))
	})
}

func TestDigestBeforeClose(t *testing.T) {
	w := NewDigestWriter()
	require.NoError(t, w.Section("a"))
	assert.Equal(t, [32]byte{}, w.Digest())
}

func TestNoAllocationPerRecord(t *testing.T) {
	rec := pattern(100, 0)
	w, err := NewWriter(io.Discard, testHeader)
	require.NoError(t, err)
	require.NoError(t, w.Section("a"))
	assert.Zero(t, testing.AllocsPerRun(10_000, func() { _ = w.Record(rec) }), "Writer.Record")

	const n = 20_000
	secs := []section{{name: "a", records: make([][]byte, n)}}
	for i := range secs[0].records {
		secs[0].records[i] = rec
	}
	file, _ := writeSnap(t, testHeader, secs)
	r, err := NewReader(bytes.NewReader(file))
	require.NoError(t, err)
	_, _, err = r.Next() // the section's name is allocated once
	require.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(n-10, func() { _, _, _ = r.Next() }), "Reader.Next")
}

// A forged length must not make the reader allocate what the file does not
// hold.
func TestForgedLengthDoesNotAllocate(t *testing.T) {
	file := good(secFrame("a"), []byte{tagRecord}, uv(MaxRecordSize), []byte("short"))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := readAll(bytes.NewReader(file))
	runtime.ReadMemStats(&after)
	require.Error(t, err)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20))
}

// fuzzSeeds are the seeds added in code; testdata/fuzz/FuzzReader holds the
// same as files.
func fuzzSeeds(t testing.TB) map[string][]byte {
	valid := smallSnap(t)
	badVersion := bytes.Clone(valid)
	badVersion[len(Magic)+3] = 2
	return map[string][]byte{
		"valid":       valid,
		"truncated":   valid[:len(valid)/2],
		"bad-magic":   append([]byte("MOONSNAX"), valid[len(Magic):]...),
		"bad-version": badVersion,
	}
}

func TestFuzzCorpusFiles(t *testing.T) {
	for name, b := range fuzzSeeds(t) {
		got, err := readCorpusFile("testdata/fuzz/FuzzReader/" + name)
		require.NoError(t, err, name)
		assert.Equal(t, b, got, "corpus file %s is stale", name)
	}
}

// readCorpusFile decodes a one-value []byte corpus file of go test fuzz.
func readCorpusFile(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lit, ok := strings.CutPrefix(string(raw), "go test fuzz v1\n[]byte(")
	lit, ok2 := strings.CutSuffix(lit, ")\n")
	if !ok || !ok2 {
		return nil, fmt.Errorf("%s: not a []byte corpus file", path)
	}
	s, err := strconv.Unquote(lit)
	return []byte(s), err
}

func FuzzReader(f *testing.F) {
	for _, b := range fuzzSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, _, rerr := readAll(bytes.NewReader(b))
		sum, ierr := Inspect(bytes.NewReader(b))
		if ierr == nil {
			require.NoError(t, rerr)
			assert.Equal(t, sum.Digest, r.Digest())
			assert.Equal(t, int64(len(b)), sum.FileBytes)
		}
		if rerr == nil && r.off() == int64(len(b)) {
			require.NoError(t, ierr, "reader accepted the whole input")
		}
	})
}

// benchSnap writes the benchmarks' snapshot: 1M records of 100 bytes.
func benchSnap(b *testing.B, dst io.Writer) {
	rec := pattern(100, 0)
	w, err := NewWriter(dst, testHeader)
	require.NoError(b, err)
	require.NoError(b, w.Section("objects"))
	for range 1_000_000 {
		if err := w.Record(rec); err != nil {
			b.Fatal(err)
		}
	}
	require.NoError(b, w.Close())
}

func BenchmarkWriter(b *testing.B) {
	var cw countingWriter
	benchSnap(b, &cw)
	b.SetBytes(cw.n)
	for b.Loop() {
		benchSnap(b, io.Discard)
	}
}

func BenchmarkReader(b *testing.B) {
	var buf bytes.Buffer
	benchSnap(b, &buf)
	file := buf.Bytes()
	b.SetBytes(int64(len(file)))
	for b.Loop() {
		r, err := NewReader(bytes.NewReader(file))
		if err != nil {
			b.Fatal(err)
		}
		for {
			_, _, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}
