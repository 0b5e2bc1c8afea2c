package mooncakeapi

import (
	"testing"

	"github.com/moonraft/moonraft/oplog"
	"github.com/stretchr/testify/require"
)

func TestReplicaDescriptorsNameTheSegmentsProtocol(t *testing.T) {
	for _, tc := range []struct{ mounted, want string }{
		{"", "tcp"},
		{"tcp", "tcp"},
		{"rdma", "rdma"},
	} {
		t.Run("mounted with "+tc.mounted, func(t *testing.T) {
			rs, err := replicasOf([]oplog.ReplicaDesc{{Status: oplog.ReplicaComplete,
				Buffers: []oplog.BufferDesc{{Address: 1 << 40, Size: 4096, Endpoint: "127.0.0.1:15000", Protocol: tc.mounted}}}})
			require.NoError(t, err)
			require.Len(t, rs, 1)
			require.Equal(t, BufferDescriptor{Size: 4096, BufferAddress: 1 << 40, Protocol: tc.want, TransportEndpoint: "127.0.0.1:15000"},
				rs[0].Descriptor.Value().(MemoryDescriptor).Buffer)
		})
	}
}
