package mooncakeapi

import (
	"strings"
	"testing"

	"github.com/moonraft/moonraft/structpack"
	"github.com/stretchr/testify/require"
)

// plainReplicaListResponse is GetReplicaListResponse without its Packer:
// the reflection walk encodes it, which the hand-written encoder must
// match byte for byte.
type plainReplicaListResponse struct {
	Replicas       []ReplicaDescriptor
	LeaseTTLMs     uint64
	ObjectChecksum *uint64
}

func TestReplicaListPackerMatchesTheWalk(t *testing.T) {
	sum := uint64(0xdeadbeef01)
	mem := func(id uint64, endpoint string) ReplicaDescriptor {
		return ReplicaDescriptor{ID: id, Status: ReplicaComplete,
			Descriptor: Memory(BufferDescriptor{Size: 4096, BufferAddress: 0x7f00_0000_1000 + id, Protocol: "tcp", TransportEndpoint: endpoint})}
	}
	var disk ReplicaDescriptor
	disk.ID, disk.Status = 9, ReplicaProcessing
	disk.Descriptor.Set(2, DiskDescriptor{FilePath: "/mnt/kv/a", ObjectSize: 4096})
	for _, tc := range []struct {
		name string
		resp GetReplicaListResponse
	}{
		{"no replica", GetReplicaListResponse{LeaseTTLMs: 5000}},
		{"one in memory", GetReplicaListResponse{Replicas: []ReplicaDescriptor{mem(1, "127.0.0.1:15000")}, LeaseTTLMs: 5000}},
		{"a checksum", GetReplicaListResponse{Replicas: []ReplicaDescriptor{mem(1, "10.0.0.7:15001")}, LeaseTTLMs: 1, ObjectChecksum: &sum}},
		{"two, one endpoint longer than 255 (2-byte lengths)", GetReplicaListResponse{
			Replicas: []ReplicaDescriptor{mem(1, "h:1"), mem(2, strings.Repeat("e", 300))}, LeaseTTLMs: 5000}},
		{"on disk (the walk's)", GetReplicaListResponse{Replicas: []ReplicaDescriptor{disk}, LeaseTTLMs: 5000}},
		{"in memory and on disk", GetReplicaListResponse{Replicas: []ReplicaDescriptor{mem(3, "h:2"), disk}, ObjectChecksum: &sum}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := structpack.Marshal(tc.resp)
			require.NoError(t, err)
			want, err := structpack.Marshal(plainReplicaListResponse(tc.resp))
			require.NoError(t, err)
			require.Equal(t, want, got, "a lone answer")

			// As BatchGetReplicaList answers: inside expected<>s, among failures.
			batch := []Expected[GetReplicaListResponse]{structpack.OK(tc.resp), structpack.Fail[GetReplicaListResponse](structpack.ErrorCode(-704)), structpack.OK(tc.resp)}
			plain := make([]Expected[plainReplicaListResponse], len(batch))
			for i, e := range batch {
				plain[i] = Expected[plainReplicaListResponse]{Value: plainReplicaListResponse(e.Value), Err: e.Err}
			}
			got, err = structpack.Marshal(batch)
			require.NoError(t, err)
			want, err = structpack.Marshal(plain)
			require.NoError(t, err)
			require.Equal(t, want, got, "a batch answer")

			var back GetReplicaListResponse
			require.NoError(t, structpack.Unmarshal(must(structpack.Marshal(tc.resp)), &back))
			require.Equal(t, tc.resp.LeaseTTLMs, back.LeaseTTLMs)
			require.Len(t, back.Replicas, len(tc.resp.Replicas))
		})
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
