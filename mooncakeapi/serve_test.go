package mooncakeapi

import (
	"slices"
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

// TestOnlyReadsAndPingRepeat: a front may ask the new leader again only
// for calls that change nothing when run twice; a write asked twice could
// put or remove twice.
func TestOnlyReadsAndPingRepeat(t *testing.T) {
	reads := []string{"ServiceReady", "GetStorageConfig", "GetFsdir", "FetchTasks", "Ping", "ExistKey",
		"BatchExistKey", "GetReplicaList", "BatchGetReplicaList", "GetReplicaListByRegex"}
	for _, f := range Functions {
		t.Run(f.Name, func(t *testing.T) {
			require.Equal(t, slices.Contains(reads, f.Name), Repeatable(f.ID))
		})
	}
}
