package mooncakeapi

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/structpack"
)

// Leadership is what the front asks of the Raft host about who leads.
type Leadership interface {
	// IsLeader: this node is the promoted leader, ready to serve.
	IsLeader() bool
	// ViewVersion is the term this node was promoted leader in (0 when it
	// is not the promoted leader).
	ViewVersion() uint64
	// LeaderMooncakeAddr is the promoted leader's Mooncake address when this
	// node follows it, else "".
	LeaderMooncakeAddr() string
	// AwaitLeader returns once a leader is known, or ctx ends.
	AwaitLeader(ctx context.Context) error
}

const (
	// forwardTimeout bounds a forwarded call, its retries on a new leader
	// included: a Mooncake client's own RPC deadline is not on the wire.
	// The leader holds a write without a deadline at most 10 s while etcd
	// catches up (node's undeadlinedPaceWait); 2 s more lets its answer,
	// TOO_MANY_REQUESTS or done, come back rather than a timeout.
	forwardTimeout = 12 * time.Second
	// A forward that failed looks for the next leader every leaderPoll,
	// and is sent again after retryPause at the latest.
	leaderPoll = 20 * time.Millisecond
	retryPause = 200 * time.Millisecond
)

// Front serves the Mooncake protocol on a node: the promoted leader answers;
// a follower forwards each call, frame for frame, to the leader's Mooncake
// address (from its Promote), so a client configured with any node's
// address works. During an election it waits for a leader as a gRPC call
// does; with none known by then, the local handler answers
// UNAVAILABLE_IN_CURRENT_STATUS.
type Front struct {
	lead  Leadership
	local *Handler
	fwd   cororpc.Pool
	calls atomic.Uint64 // calls begun: Drain waits for it to stand still
}

// NewFront serves d's calls on the promoted leader and forwards them from
// a follower; Close releases its forwarding connections.
func NewFront(d service.Data, lead Leadership, log cororpc.Logger, leaseTTLMs uint64) *Front {
	return &Front{lead: lead, local: NewHandler(d, log, leaseTTLMs), fwd: cororpc.Pool{MsgType: cororpc.MsgForwarded}}
}

// Close closes the connections calls were forwarded on.
func (m *Front) Close() { m.fwd.Close() }

// CallInline implements cororpc.Inliner: a key read or a Ping is quick on
// the leader; on a follower it is a forward, a round trip to the leader.
// If leadership moved while it ran, its answer may be that this node is
// not the leader: Call then answers it, forwarding it if need be.
func (m *Front) CallInline(ctx context.Context, id uint32, body, dst []byte) ([]byte, cororpc.Errc, string, bool) {
	m.calls.Add(1)
	term := m.lead.ViewVersion()
	if !m.lead.IsLeader() {
		return dst, 0, "", false
	}
	out, errc, msg, done := m.local.CallInline(ctx, id, body, dst)
	if done && (m.lead.ViewVersion() != term || !m.lead.IsLeader()) {
		return dst, 0, "", false
	}
	return out, errc, msg, done
}

func (m *Front) Call(ctx context.Context, id uint32, body, dst []byte) ([]byte, cororpc.Errc, string) {
	m.calls.Add(1)
	if cororpc.Forwarded(ctx) { // views disagree: no second hop
		return m.local.Call(ctx, id, body, dst)
	}
	if term := m.lead.ViewVersion(); m.lead.IsLeader() {
		repeatable := Repeatable(id)
		lctx, trace := ctx, (*service.WriteTrace)(nil)
		if !repeatable {
			lctx, trace = service.WithWriteTrace(ctx)
		}
		out, errc, msg := m.local.Call(lctx, id, body, dst)
		if trace != nil && trace.NoEffect() {
			// This node handed leadership over while the call waited,
			// and Raft refused its write unlogged: the new leader takes it.
			return m.forward(ctx, id, body, dst)
		}
		if m.lead.ViewVersion() == term && m.lead.IsLeader() || !repeatable {
			return out, errc, msg
		}
		// Leadership moved while the call ran (a paused or cut-off leader
		// answers what was queued once it runs again): its answer may be
		// that this node is not the leader, which master_bench takes as
		// fatal for a Ping. A read or a Ping is asked again, as a follower
		// would forward it.
	}
	return m.forward(ctx, id, body, dst)
}

// forward sends the call to the promoted leader, waiting (bounded) for one
// during an election; with none known, or this node the leader again, the
// local handler answers. A call that failed across a leader change is sent
// again to the new leader, within forwardTimeout: any call whose request
// never left (the old leader's connection gone, its address refused), and a
// read or a Ping whatever happened to it. A write that may have run is not:
// its client hears that the outcome is unknown.
func (m *Front) forward(ctx context.Context, id uint32, body, dst []byte) ([]byte, cororpc.Errc, string) {
	fctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	defer cancel()
	for {
		addr := m.leaderAddr()
		if addr == "" && !m.lead.IsLeader() {
			// An election, or a leader not heard from for a moment: wait
			// for one as a gRPC call does (bounded), then look again.
			_ = m.lead.AwaitLeader(fctx)
			addr = m.leaderAddr()
		}
		if addr == "" {
			return m.local.Call(ctx, id, body, dst)
		}
		resp, err := m.fwd.Call(fctx, addr, id, body)
		if err == nil {
			if resp.Header.Errc != cororpc.ErrcOK {
				var msg string
				_ = structpack.Unmarshal(resp.Body, &msg)
				return dst, resp.Header.Errc, msg
			}
			return append(dst, resp.Body...), cororpc.ErrcOK, ""
		}
		_, notSent := errors.AsType[*cororpc.NotSentError](err)
		if !(notSent || Repeatable(id)) || !m.retryWait(fctx, addr) {
			// A write the leader may have run, or no leader took the call
			// in time: coro_rpc's io error, which a Mooncake client
			// reports as a failed RPC.
			return dst, cororpc.ErrcIOError, "forwarding to the leader at " + addr + ": " + err.Error()
		}
	}
}

// retryWait waits before a forward is sent again: until the promoted leader
// is no longer at addr (another node promoted, or this one), or for
// retryPause if it still is there. It reports false once ctx has ended.
func (m *Front) retryWait(ctx context.Context, addr string) bool {
	t := time.NewTicker(leaderPoll)
	defer t.Stop()
	until := time.Now().Add(retryPause)
	for {
		if a := m.leaderAddr(); a != addr && (a != "" || m.lead.IsLeader()) || time.Now().After(until) {
			return ctx.Err() == nil
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// leaderAddr is where to forward: the promoted leader's Mooncake address
// when this node follows it, else "".
func (m *Front) leaderAddr() string {
	if m.lead.IsLeader() {
		return ""
	}
	return m.lead.LeaderMooncakeAddr()
}

// Drain keeps serving until another node leads, promoted, and no
// Mooncake call has begun here for quiet since; or until ctx ends. A
// leader that handed over before it stops calls it: its clients move to
// the new leader once it publishes master_view, and until then this node
// forwards their calls. Closing at once would cost each client whose next
// call met the closed address ~4 s of its connection pool's retries
// (docs/MOONCAKE_PROTOCOL.md). A leader promotes within two election
// timeouts of the handover (leaderWithin); with none by then (the whole
// cluster stopping), no node would take the calls, and quiet alone decides.
func (m *Front) Drain(ctx context.Context, quiet, leaderWithin time.Duration) {
	if quiet <= 0 {
		return
	}
	leaderBy := time.Now().Add(leaderWithin)
	t := time.NewTicker(quiet / 4)
	defer t.Stop()
	last, since := m.calls.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c := m.calls.Load()
		awaiting := m.leaderAddr() == "" && time.Now().Before(leaderBy)
		switch {
		case c != last || awaiting:
			last, since = c, time.Now()
		case time.Since(since) >= quiet:
			return
		}
	}
}
