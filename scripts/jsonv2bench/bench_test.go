// Package jsonv2bench measures the hand-written OpLog JSON codec (oplog/)
// against github.com/go-json-experiment/json (encoding/json/v2 to be) set up
// for the same bytes and strictness; docs/BENCHMARKS.md has the figures.
// A module of its own, so moonraft does not depend on it:
//
//	cd scripts/jsonv2bench && go test -bench . -benchmem -count 6
package jsonv2bench

import (
	"bytes"
	jsonv1 "encoding/json"
	"testing"

	json "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/moonraft/moonraft/oplog"
)

// entry is oplog.Entry as a tagged struct, what a move to v2 would use.
type entry struct {
	SequenceID    uint64 `json:"sequence_id"`
	TimestampMs   int64  `json:"timestamp"`
	OpType        string `json:"op_type"`
	Key           string `json:"key"`
	Payload       string `json:"payload"`
	Checksum      uint32 `json:"checksum"`
	PrefixHash    uint32 `json:"prefix_hash"`
	KeySequenceID uint64 `json:"key_sequence_id"`
	Source        string `json:"source"`
}

var payload = oplog.EncodePutEndPayload(oplog.PutEndPayload{Size: 3 << 20, Replicas: []oplog.ReplicaDesc{
	{Status: oplog.ReplicaComplete, Buffers: []oplog.BufferDesc{
		{SegmentID: "seg-1", SegmentName: "node-a:rdma0", Address: 0x7f0000001000, Size: 1 << 20},
		{SegmentID: "seg-2", SegmentName: "node-b:rdma0", Address: 0x7f0000200000, Size: 2 << 20}}},
	{Status: oplog.ReplicaComplete, Buffers: []oplog.BufferDesc{
		{SegmentID: "seg-3", SegmentName: "node-c:rdma0<&>\u2028", Address: 0x7f0000001000, Size: 3 << 20}}},
}})

var e = oplog.NewEntry(123456789, 1704110400123, oplog.OpPutEnd, "model-llama-70b/layer-12/chunk-000042", payload, 3, oplog.SourceNone)

func tagged() entry {
	return entry{e.SequenceID, e.TimestampMs, e.OpType.String(), e.Key, e.Payload, e.Checksum, e.PrefixHash, e.KeySequenceID, string(e.Source)}
}

// The options that give encoding/json's bytes and the hand-written
// decoder's strictness (exact names, no duplicates, valid UTF-8, unknown
// members refused, integers in range: v2's defaults plus these).
var (
	encOpts = json.JoinOptions(jsontext.EscapeForHTML(true), jsontext.EscapeForJS(true))
	decOpts = json.JoinOptions(json.RejectUnknownMembers(true))
)

func TestSameBytes(t *testing.T) {
	v2, err := json.Marshal(tagged(), encOpts)
	if err != nil {
		t.Fatal(err)
	}
	v1, _ := jsonv1.Marshal(tagged())
	if !bytes.Equal(v2, e.Encode()) || !bytes.Equal(v1, e.Encode()) {
		t.Fatalf("differ:\nv2   %s\nv1   %s\nhand %s", v2, v1, e.Encode())
	}
	var back entry
	if err := json.Unmarshal(e.Encode(), &back, decOpts); err != nil || back != tagged() {
		t.Fatal(err)
	}
	for _, bad := range []string{`{"sequence_id":1,"sequence_id":2}`, `{"Sequence_ID":1}`, `{"checksum":4294967296}`, "{\"key\":\"\xff\"}", `{"nope":1}`} {
		_, herr := oplog.Decode([]byte(bad))
		var x entry
		verr := json.Unmarshal([]byte(bad), &x, decOpts)
		t.Logf("%-40q hand: %v\n%44s v2: %v", bad, herr, "", verr)
		if verr == nil {
			t.Errorf("v2 accepts %q", bad)
		}
	}
	// What v2 cannot say: a field is required. The hand decoder refuses an
	// entry without one; v2 leaves it zero.
	var empty entry
	_, herr := oplog.Decode([]byte(`{}`))
	t.Logf("{}: hand: %v; v2: %v", herr, json.Unmarshal([]byte(`{}`), &empty, decOpts))
}

func BenchmarkEncode(b *testing.B) {
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			e.Encode()
		}
	})
	b.Run("v2", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			t := tagged()
			if _, err := json.Marshal(&t, encOpts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("v1", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			t := tagged()
			if _, err := jsonv1.Marshal(&t); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	enc := e.Encode()
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := oplog.Decode(enc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("v2", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var t entry
			if err := json.Unmarshal(enc, &t, decOpts); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkEncodePayload(b *testing.B) {
	p, _ := oplog.DecodePutEndPayload(payload)
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			oplog.EncodePutEndPayload(p)
		}
	})
	b.Run("v2", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&p, encOpts); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDecodePayload(b *testing.B) {
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := oplog.DecodePutEndPayload(payload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("v2", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var p oplog.PutEndPayload
			if err := json.Unmarshal([]byte(payload), &p, decOpts); err != nil {
				b.Fatal(err)
			}
		}
	})
}
