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
	var d Descriptors
	d.Reserve(rs)
	return d.ToPB(rs)
}

// Descriptors builds the replica lists of one answer from four allocations
// however many lists, replicas and buffers it holds, instead of four for
// each replica: a batch read's answer is garbage once gRPC has sent it,
// and what it allocates the leader's collector must catch up with, at
// hundreds of thousands of keys a second (docs/BENCHMARKS.md, the sweep's
// batch gets). Reserve every list, then convert each with ToPB.
type Descriptors struct {
	replicas, buffers int // reserved and not yet converted
	reps              []ReplicaDescriptor
	repPtrs           []*ReplicaDescriptor
	bufs              []BufferDescriptor
	bufPtrs           []*BufferDescriptor
}

// Reserve makes room for rs in the allocations ToPB makes.
func (d *Descriptors) Reserve(rs []oplog.ReplicaDesc) {
	d.replicas += len(rs)
	for _, r := range rs {
		d.buffers += len(r.Buffers)
	}
}

// ToPB is rs on the wire, carved from the room reserved (or, for a list
// not reserved, from new room).
func (d *Descriptors) ToPB(rs []oplog.ReplicaDesc) []*ReplicaDescriptor {
	buffers := 0
	for _, r := range rs {
		buffers += len(r.Buffers)
	}
	if len(d.reps) < len(rs) {
		n := max(d.replicas, len(rs))
		d.reps, d.repPtrs = make([]ReplicaDescriptor, n), make([]*ReplicaDescriptor, n)
	}
	if len(d.bufs) < buffers {
		n := max(d.buffers, buffers)
		d.bufs, d.bufPtrs = make([]BufferDescriptor, n), make([]*BufferDescriptor, n)
	}
	d.replicas, d.buffers = max(d.replicas-len(rs), 0), max(d.buffers-buffers, 0)
	out, reps := take(&d.repPtrs, len(rs)), take(&d.reps, len(rs))
	for i, r := range rs {
		ptrs, bufs := take(&d.bufPtrs, len(r.Buffers)), take(&d.bufs, len(r.Buffers))
		for j, b := range r.Buffers {
			bd := &bufs[j]
			bd.SegmentId, bd.SegmentName, bd.BufferAddress, bd.Size = b.SegmentID, b.SegmentName, b.Address, b.Size
			ptrs[j] = bd
		}
		rep := &reps[i]
		rep.Status, rep.Buffers = r.Status, ptrs
		out[i] = rep
	}
	return out
}

// take cuts the first n of *s off, capped so that an append to them
// cannot reach the rest.
func take[T any](s *[]T, n int) []T {
	out := (*s)[:n:n]
	*s = (*s)[n:]
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
