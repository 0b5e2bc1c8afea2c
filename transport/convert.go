package transport

import (
	"context"
	"errors"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

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
	st := &moonraftpb.Status{Code: int32(code), Name: code.String(), Message: msg, Retryable: code.Retryable()}
	if code == errcode.NotLeader {
		st.LeaderGrpcAddr = msg
	}
	return st
}

// itemStatus is the Status of a batch item's err, where ok is its batch's
// top-level OK Status: the OK items of one answer share it instead of each
// allocating its own.
func itemStatus(err error, ok *moonraftpb.Status) *moonraftpb.Status {
	if err == nil {
		return ok
	}
	return statusOf(err)
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

func segmentStateToPB(st fsm.SegmentStatus) *moonraftpb.SegmentState {
	return &moonraftpb.SegmentState{
		State:        st.State,
		Segment:      moonraftpb.SegmentToPB(fsm.SegmentSpec{ID: st.ID, Name: st.Name, Base: st.Base, Size: st.Size}),
		ClientId:     st.ClientID,
		UsedBytes:    st.Used,
		Objects:      uint64(st.Objects),
		DrainUntilMs: st.DrainUntilMs,
	}
}
