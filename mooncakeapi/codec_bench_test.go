package mooncakeapi

import (
	"fmt"
	"testing"

	"github.com/moonraft/moonraft/structpack"
)

// BenchmarkBatchGetReplicaListAnswer encodes and decodes what the leader
// answers to master_bench's BatchGet: 128 keys of one memory replica each.
func BenchmarkBatchGetReplicaListAnswer(b *testing.B) {
	out := make([]Expected[GetReplicaListResponse], 128)
	for i := range out {
		out[i] = structpack.OK(GetReplicaListResponse{LeaseTTLMs: 5000, Replicas: []ReplicaDescriptor{{ID: 1, Status: ReplicaComplete,
			Descriptor: Memory(BufferDescriptor{Size: 4096, BufferAddress: uint64(i) << 12, Protocol: "tcp", TransportEndpoint: fmt.Sprintf("127.0.0.1:%d", 15000+i)})}}})
	}
	frame, err := structpack.Marshal(out)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := structpack.Marshal(out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var in []Expected[GetReplicaListResponse]
			if err := structpack.Unmarshal(frame, &in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkGetReplicaListAnswer encodes what the leader answers to
// master_bench's Get, into a reused buffer as the event loop does.
func BenchmarkGetReplicaListAnswer(b *testing.B) {
	out := structpack.OK(GetReplicaListResponse{LeaseTTLMs: 5000, Replicas: []ReplicaDescriptor{{ID: 1, Status: ReplicaComplete,
		Descriptor: Memory(BufferDescriptor{Size: 4096, BufferAddress: 1 << 40, Protocol: "tcp", TransportEndpoint: "segment_client_31"})}}})
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = structpack.AppendMarshal(buf[:0], out); err != nil {
			b.Fatal(err)
		}
	}
}
