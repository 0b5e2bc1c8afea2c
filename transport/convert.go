package transport

import (
	"context"
	"errors"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// Retryable reports whether a request answered with code was certainly not
// applied and may succeed if sent again later or elsewhere: NOT_LEADER
// (retry at the leader), UNAVAILABLE_IN_CURRENT_STATUS (no promoted
// leader yet, shutting down, queue full) and TOO_MANY_REQUESTS (the
// client's in-flight cap on that node; retry there after a backoff). ETCD_OPERATION_ERROR is not: it
// means the leader fails writes closed until etcd is back, which takes far
// longer than a client's retry budget, so the caller decides. OUTCOME_UNKNOWN
// is not: the write may have been applied.
func Retryable(code errcode.Code) bool {
	return code == errcode.NotLeader || code == errcode.UnavailableInCurrentStatus || code == errcode.TooManyRequests
}

// statusOf is the response Status of err (nil: OK). A context error from the
// backend means this node gave up waiting, so it is retryable.
func statusOf(err error) *moonraftpb.Status {
	if err == nil {
		return &moonraftpb.Status{Name: errcode.OK.String()}
	}
	code, msg := errcode.InternalError, err.Error()
	var e *errcode.Error
	switch {
	case errors.As(err, &e):
		code, msg = e.Code, e.Msg
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		code = errcode.UnavailableInCurrentStatus
	}
	st := &moonraftpb.Status{Code: int32(code), Name: code.String(), Message: msg, Retryable: Retryable(code)}
	if code == errcode.NotLeader {
		st.LeaderGrpcAddr = msg
	}
	return st
}

// writeStatusOf is statusOf for an error of Propose: a write whose wait was
// cut short by a context may already be in the log, so its outcome is
// unknown rather than retryable.
func writeStatusOf(err error) *moonraftpb.Status {
	var e *errcode.Error
	if !errors.As(err, &e) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return statusOf(errcode.New(errcode.OutcomeUnknown, "the write was proposed but not answered before %v; check the key before retrying", err))
	}
	return statusOf(err)
}

// errorOf is the error a response Status carries (nil for OK).
func errorOf(st *moonraftpb.Status) error {
	code := errcode.Code(st.GetCode())
	if code == errcode.OK {
		return nil
	}
	if code == errcode.NotLeader && st.GetLeaderGrpcAddr() != "" {
		return &errcode.Error{Code: code, Msg: st.GetLeaderGrpcAddr()}
	}
	return &errcode.Error{Code: code, Msg: st.GetMessage()}
}

func replicasToPB(rs []oplog.ReplicaDesc) []*moonraftpb.ReplicaDescriptor {
	out := make([]*moonraftpb.ReplicaDescriptor, len(rs))
	for i, r := range rs {
		bufs := make([]*moonraftpb.BufferDescriptor, len(r.Buffers))
		for j, b := range r.Buffers {
			bufs[j] = &moonraftpb.BufferDescriptor{SegmentId: b.SegmentID, SegmentName: b.SegmentName, BufferAddress: b.Address, Size: b.Size}
		}
		out[i] = &moonraftpb.ReplicaDescriptor{Status: r.Status, Buffers: bufs}
	}
	return out
}

func replicasFromPB(rs []*moonraftpb.ReplicaDescriptor) []oplog.ReplicaDesc {
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

func segmentToPB(s fsm.SegmentSpec) *moonraftpb.Segment {
	return &moonraftpb.Segment{Id: s.ID, Name: s.Name, Base: s.Base, Size: s.Size}
}

func segmentFromPB(s *moonraftpb.Segment) fsm.SegmentSpec {
	return fsm.SegmentSpec{ID: s.GetId(), Name: s.GetName(), Base: s.GetBase(), Size: s.GetSize()}
}

func segmentStateToPB(st fsm.SegmentStatus) *moonraftpb.SegmentState {
	return &moonraftpb.SegmentState{
		State:        st.State,
		Segment:      segmentToPB(fsm.SegmentSpec{ID: st.ID, Name: st.Name, Base: st.Base, Size: st.Size}),
		ClientId:     st.ClientID,
		UsedBytes:    st.Used,
		Objects:      uint64(st.Objects),
		DrainUntilMs: st.DrainUntilMs,
	}
}

func segmentStateFromPB(st *moonraftpb.SegmentState) SegmentStatus {
	return SegmentStatus{State: st.GetState(), Segment: segmentFromPB(st.GetSegment()), ClientID: st.GetClientId(),
		UsedBytes: st.GetUsedBytes(), Objects: st.GetObjects(), DrainUntilMs: st.GetDrainUntilMs()}
}
