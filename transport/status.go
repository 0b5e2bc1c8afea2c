package transport

import (
	"context"
	"io"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/service"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// noAdmin answers the admin RPCs of a server with no Raft group behind it.
type noAdmin struct{ role string }

func (a noAdmin) err() error {
	return errcode.New(errcode.UnavailableInCurrentMode,
		"this server (%s) has no Raft group: send membership, leadership and snapshot requests to a node of the Raft cluster", a.role)
}

func (a noAdmin) Members(context.Context) ([]service.Member, error)      { return nil, a.err() }
func (a noAdmin) AddVoter(context.Context, string, string, string) error { return a.err() }
func (a noAdmin) RemoveServer(context.Context, string) error             { return a.err() }
func (a noAdmin) TransferLeadership(context.Context, string) error       { return a.err() }
func (a noAdmin) SnapshotSave(context.Context, io.Writer) error          { return a.err() }
func (a noAdmin) SnapshotRestore(context.Context, io.Reader) error       { return a.err() }

// NodeStatusPB is st on the wire (and in /status's JSON).
func NodeStatusPB(st *service.NodeStatus) *moonraftpb.NodeStatus {
	return &moonraftpb.NodeStatus{
		Id: st.ID, RaftAddr: st.RaftAddr, GrpcAddr: st.GRPCAddr, HttpAddr: st.HTTPAddr, Role: st.Role,
		Term: st.Term, AppliedIndex: st.AppliedIndex, CommitIndex: st.CommitIndex, AppliedSeq: st.AppliedSeq,
		Digest: st.Digest, LeaderId: st.LeaderID, LeaderGrpcAddr: st.LeaderGRPCAddr,
		Objects: st.Objects, Segments: st.Segments, Sessions: st.Sessions,
		UsedBytes: st.UsedBytes, CapacityBytes: st.CapacityBytes, ExportRingLen: st.ExportRingLen,
		NowMs: st.NowMs, Promoted: st.Promoted, ExportedSeq: st.ExportedSeq, EtcdExport: st.EtcdExport,
		ObjectSetDigest: st.ObjectSetDigest, ReadMode: st.ReadMode,
		ReadLeaseRemainingMs: st.ReadLeaseRemainingMs, DiskError: st.DiskError,
		ExportBacklogMs: st.ExportBacklogMs, ExportTakeRate: st.ExportTakeRate, WritesPaced: st.WritesPaced, EtcdError: st.EtcdError,
		ExportDeferred: st.ExportDeferred, LastLogIndex: st.LastLogIndex, LastContactMs: st.LastContactMs,
	}
}

func membersPB(ms []service.Member) []*moonraftpb.Member {
	out := make([]*moonraftpb.Member, len(ms))
	for i, m := range ms {
		out[i] = &moonraftpb.Member{Id: m.ID, RaftAddr: m.RaftAddr, GrpcAddr: m.GRPCAddr, Suffrage: m.Suffrage, Leader: m.Leader}
	}
	return out
}
