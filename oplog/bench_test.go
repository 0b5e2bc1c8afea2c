package oplog_test

import (
	"testing"

	"github.com/moonraft/moonraft/oplog"
)

const benchKey = "model-llama-70b/layer-12/chunk-000042"

func BenchmarkNewEntry(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		oplog.NewEntry(123456789, 1704110400123, oplog.OpPutEnd, benchKey, samplePayload, 3, oplog.SourceNone)
	}
}

func BenchmarkEncode(b *testing.B) {
	e := oplog.NewEntry(123456789, 1704110400123, oplog.OpPutEnd, benchKey, samplePayload, 3, oplog.SourceNone)
	b.Run("Encode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(e.Encode())))
		for b.Loop() {
			e.Encode()
		}
	})
	b.Run("AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		buf := e.Encode()
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			buf = e.AppendJSON(buf[:0])
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	enc := oplog.NewEntry(123456789, 1704110400123, oplog.OpPutEnd, benchKey, samplePayload, 3, oplog.SourceNone).Encode()
	b.ReportAllocs()
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		if _, err := oplog.Decode(enc); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodePutEndPayload(b *testing.B) {
	p := mustPayload(b, samplePayload)
	b.ReportAllocs()
	b.SetBytes(int64(len(samplePayload)))
	for b.Loop() {
		oplog.EncodePutEndPayload(p)
	}
}

func BenchmarkDecodePutEndPayload(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(samplePayload)))
	for b.Loop() {
		if _, err := oplog.DecodePutEndPayload(samplePayload); err != nil {
			b.Fatal(err)
		}
	}
}
