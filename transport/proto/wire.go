package moonraftpb

import (
	"path"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	"google.golang.org/grpc/status"
)

// What the server and the Go client agree on besides the messages.
const (
	// MaxMessageBytes is the default cap of one gRPC message each way, on
	// the server and in the client. A key is at most 4 KiB, so only a huge
	// batch or by-regex answer comes near it.
	MaxMessageBytes = 16 << 20
	// SnapshotChunkBytes is the largest data of one SnapshotChunk.
	SnapshotChunkBytes = 1 << 20
	// MinMessageBytes is the smallest message limit allowed, on servers
	// and clients: a snapshot chunk and its framing must fit.
	MinMessageBytes = 2 << 20
	// AuthHeader carries the admin token, as "Bearer <token>", in the
	// metadata of admin RPCs.
	AuthHeader = "authorization"
)

// AdminMethod reports whether the gRPC method (full name or short) is an
// admin RPC: membership, leadership transfer, snapshots and RemoveAll.
func AdminMethod(method string) bool {
	switch path.Base(method) {
	case "Members", "AddVoter", "RemoveServer", "TransferLeadership", "SnapshotSave", "SnapshotRestore", "RemoveAll":
		return true
	}
	return false
}

// DetailStatus is the Status a server put in the details of a gRPC error
// (a failed stream, a call its interceptor refused), or nil.
func DetailStatus(err error) *Status {
	for _, d := range status.Convert(err).Details() {
		if st, ok := d.(*Status); ok {
			return st
		}
	}
	return nil
}

// ErrorOf is the error a response Status carries (nil for OK): an
// *errcode.Error, whose message for NOT_LEADER is the leader's address.
func ErrorOf(st *Status) error {
	code := errcode.Code(st.GetCode())
	if code == errcode.OK {
		return nil
	}
	if code == errcode.NotLeader && st.GetLeaderGrpcAddr() != "" {
		return &errcode.Error{Code: code, Msg: st.GetLeaderGrpcAddr()}
	}
	return &errcode.Error{Code: code, Msg: st.GetMessage()}
}

// ReplicasToPB is rs on the wire.
func ReplicasToPB(rs []oplog.ReplicaDesc) []*ReplicaDescriptor {
	out := make([]*ReplicaDescriptor, len(rs))
	for i, r := range rs {
		bufs := make([]*BufferDescriptor, len(r.Buffers))
		for j, b := range r.Buffers {
			bufs[j] = &BufferDescriptor{SegmentId: b.SegmentID, SegmentName: b.SegmentName, BufferAddress: b.Address, Size: b.Size}
		}
		out[i] = &ReplicaDescriptor{Status: r.Status, Buffers: bufs}
	}
	return out
}

// ReplicasFromPB is ReplicasToPB's inverse.
func ReplicasFromPB(rs []*ReplicaDescriptor) []oplog.ReplicaDesc {
	out := make([]oplog.ReplicaDesc, len(rs))
	for i, r := range rs {
		bufs := make([]oplog.BufferDesc, len(r.GetBuffers()))
		for j, b := range r.GetBuffers() {
			bufs[j] = oplog.BufferDesc{SegmentID: b.GetSegmentId(), SegmentName: b.GetSegmentName(), Address: b.GetBufferAddress(), Size: b.GetSize()}
		}
		out[i] = oplog.ReplicaDesc{Status: r.GetStatus(), Buffers: bufs}
	}
	return out
}

// SegmentToPB is s on the wire.
func SegmentToPB(s fsm.SegmentSpec) *Segment {
	return &Segment{Id: s.ID, Name: s.Name, Base: s.Base, Size: s.Size}
}

// SegmentFromPB is SegmentToPB's inverse.
func SegmentFromPB(s *Segment) fsm.SegmentSpec {
	return fsm.SegmentSpec{ID: s.GetId(), Name: s.GetName(), Base: s.GetBase(), Size: s.GetSize()}
}
