package moonraftpb_test

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// designRPCs is the API of moonraft.v1.Master that clients rely on. A dropped or
// renamed RPC fails TestServiceHasEveryRPC.
var designRPCs = []string{
	"ExistKey", "BatchExistKey", "GetReplicaList", "BatchGetReplicaList",
	"GetReplicaListByRegex", "PutStart", "PutEnd", "PutRevoke", "BatchPutStart",
	"BatchPutEnd", "BatchPutRevoke", "Remove", "RemoveByRegex", "RemoveAll",
	"MountSegment", "ReMountSegment", "UnmountSegment", "Ping",
	// the Mooncake master of today (issue 13)
	"UpsertStart", "UpsertEnd", "UpsertRevoke", "BatchUpsertStart", "BatchUpsertEnd",
	"BatchUpsertRevoke", "BatchRemove", "GracefulUnmountSegment", "QuerySegmentStatus",
	"ListSegments", "ServiceReady",
	// admin
	"Status", "Members", "AddVoter", "RemoveServer", "TransferLeadership",
	"SnapshotSave", "SnapshotRestore",
}

func TestServiceHasEveryRPC(t *testing.T) {
	desc := moonraftpb.Master_ServiceDesc
	assert.Equal(t, "moonraft.v1.Master", desc.ServiceName)

	var got []string
	for _, m := range desc.Methods {
		got = append(got, m.MethodName)
	}
	streams := map[string][2]bool{}
	for _, s := range desc.Streams {
		got = append(got, s.StreamName)
		streams[s.StreamName] = [2]bool{s.ServerStreams, s.ClientStreams}
	}
	want := append([]string(nil), designRPCs...)
	sort.Strings(want)
	sort.Strings(got)
	assert.Equal(t, want, got)

	assert.Equal(t, [2]bool{true, false}, streams["SnapshotSave"], "SnapshotSave streams from the server")
	assert.Equal(t, [2]bool{false, true}, streams["SnapshotRestore"], "SnapshotRestore streams from the client")
}

func roundTrip[M proto.Message](t *testing.T, in M, out M) {
	t.Helper()
	b, err := proto.Marshal(in)
	require.NoError(t, err)
	require.NoError(t, proto.Unmarshal(b, out))
	assert.True(t, proto.Equal(in, out), "round trip changed the message:\n in: %v\nout: %v", in, out)
}

func TestRoundTrip(t *testing.T) {
	t.Run("PutStartRequest", func(t *testing.T) {
		in := &moonraftpb.PutStartRequest{
			Key:          "model/layer0",
			SliceLengths: []uint64{1 << 20, 4096, 0},
			Config: &moonraftpb.ReplicateConfig{
				ReplicaNum:       2,
				WithSoftPin:      true,
				PreferredSegment: "seg-a",
			},
			ClientId: "client-1",
		}
		out := &moonraftpb.PutStartRequest{}
		roundTrip(t, in, out)
		assert.Equal(t, []uint64{1 << 20, 4096, 0}, out.GetSliceLengths())
		assert.Equal(t, uint32(2), out.GetConfig().GetReplicaNum())
	})
	t.Run("StatusResponse", func(t *testing.T) {
		in := &moonraftpb.StatusResponse{
			Status: &moonraftpb.Status{
				Code:           -2001,
				Name:           "NOT_LEADER",
				Message:        "node n2 is a follower",
				LeaderGrpcAddr: "10.0.0.1:7000",
				Retryable:      true,
			},
			Node: &moonraftpb.NodeStatus{
				Id: "n2", RaftAddr: "10.0.0.2:7001", GrpcAddr: "10.0.0.2:7000", HttpAddr: "10.0.0.2:7002",
				Role: "follower", Term: 7, AppliedIndex: 1234, CommitIndex: 1235, AppliedSeq: 99,
				Digest: "deadbeef", LeaderId: "n1", LeaderGrpcAddr: "10.0.0.1:7000",
				Objects: 10, Segments: 2, Sessions: 1, UsedBytes: 1 << 30, CapacityBytes: 1 << 34,
				ExportRingLen: 3, NowMs: 1_700_000_000_000, Promoted: false,
			},
		}
		out := &moonraftpb.StatusResponse{}
		roundTrip(t, in, out)
		assert.Equal(t, "NOT_LEADER", out.GetStatus().GetName())
		assert.Equal(t, uint64(1235), out.GetNode().GetCommitIndex())
	})
}
