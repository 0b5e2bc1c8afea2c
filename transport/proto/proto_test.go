package moonraftpb_test

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/moonraft/moonraft/oplog"
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

// TestDescriptors: an answer's replica lists carved from shared room come
// out as ReplicasToPB's would, each list its own (an append to one cannot
// reach the next), whether or not it was reserved.
func TestDescriptors(t *testing.T) {
	buf := func(seg string, addr uint64) oplog.BufferDesc {
		return oplog.BufferDesc{SegmentID: seg, SegmentName: "name-" + seg, Address: addr, Size: 4096}
	}
	lists := [][]oplog.ReplicaDesc{
		{{Status: "COMPLETE", Buffers: []oplog.BufferDesc{buf("s1", 1)}}},
		{},
		{
			{Status: "COMPLETE", Buffers: []oplog.BufferDesc{buf("s1", 2), buf("s2", 3), buf("s3", 4)}},
			{Status: "COMPLETE", Buffers: []oplog.BufferDesc{}},
		},
		{{Status: "COMPLETE", Buffers: []oplog.BufferDesc{buf("s2", 5)}}},
	}
	for _, tc := range []struct {
		name     string
		reserved int // how many of the lists are reserved first
	}{
		{"all reserved", len(lists)},
		{"none reserved", 0},
		{"some reserved", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d moonraftpb.Descriptors
			for _, l := range lists[:tc.reserved] {
				d.Reserve(l)
			}
			out := make([][]*moonraftpb.ReplicaDescriptor, len(lists))
			for i, l := range lists {
				out[i] = d.ToPB(l)
			}
			_ = append(out[0], &moonraftpb.ReplicaDescriptor{Status: "appended"})
			_ = append(out[2][0].Buffers, &moonraftpb.BufferDescriptor{SegmentId: "appended"})
			for i, l := range lists {
				assert.Equal(t, l, moonraftpb.ReplicasFromPB(out[i]), "list %d", i)
				assert.Equal(t, moonraftpb.ReplicasFromPB(moonraftpb.ReplicasToPB(l)), moonraftpb.ReplicasFromPB(out[i]), "list %d", i)
			}
		})
	}
}
