package node

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/structpack"
)

// mooncakeForwardTimeout bounds a forwarded call: a Mooncake client's own
// RPC deadline is not on the wire.
const mooncakeForwardTimeout = 10 * time.Second

// mooncakeFront serves the Mooncake protocol: the promoted leader answers;
// a follower forwards each call, frame for frame, to the leader's Mooncake
// address (from its Promote), so a client configured with any node's
// address works. During an election it waits for a leader as a gRPC call
// does; with none known by then, the local handler answers
// UNAVAILABLE_IN_CURRENT_STATUS.
type mooncakeFront struct {
	n     *Node
	local *mooncakeapi.Handler
	fwd   cororpc.Pool
	calls atomic.Uint64 // calls begun: DrainMooncake waits for it to stand still
}

// CallInline implements cororpc.Inliner: a key read is quick on the
// leader; on a follower it is a forward, a round trip to the leader.
func (m *mooncakeFront) CallInline(ctx context.Context, id uint32, body, dst []byte) ([]byte, cororpc.Errc, string, bool) {
	m.calls.Add(1)
	if !m.n.IsLeader() {
		return dst, 0, "", false
	}
	return m.local.CallInline(ctx, id, body, dst)
}

func (m *mooncakeFront) Call(ctx context.Context, id uint32, body, dst []byte) ([]byte, cororpc.Errc, string) {
	m.calls.Add(1)
	if cororpc.Forwarded(ctx) { // views disagree: no second hop
		return m.local.Call(ctx, id, body, dst)
	}
	if term := m.n.promotedTerm.Load(); m.n.IsLeader() {
		repeatable := mooncakeapi.Repeatable(id)
		lctx, trace := ctx, (*writeTrace)(nil)
		if !repeatable {
			lctx, trace = withWriteTrace(ctx)
		}
		out, errc, msg := m.local.Call(lctx, id, body, dst)
		if trace != nil && trace.noEffect() {
			// This node handed leadership over while the call waited,
			// and Raft refused its write unlogged: the new leader takes it.
			return m.forward(ctx, id, body, dst)
		}
		if m.n.promotedTerm.Load() == term && m.n.IsLeader() || !repeatable {
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
// local handler answers.
func (m *mooncakeFront) forward(ctx context.Context, id uint32, body, dst []byte) ([]byte, cororpc.Errc, string) {
	addr := m.leaderAddr()
	if addr == "" && !m.n.IsLeader() {
		// An election, or a leader not heard from for a moment: wait for
		// one as a gRPC call does (bounded), then look again.
		wctx, cancel := context.WithTimeout(ctx, mooncakeForwardTimeout)
		_ = m.n.awaitLeader(wctx)
		cancel()
		addr = m.leaderAddr()
	}
	if addr == "" {
		return m.local.Call(ctx, id, body, dst)
	}
	fctx, cancel := context.WithTimeout(ctx, mooncakeForwardTimeout)
	defer cancel()
	resp, err := m.fwd.Call(fctx, addr, id, body)
	if err != nil {
		// The leader may or may not have run it: coro_rpc's io error, which
		// a Mooncake client reports as a failed RPC.
		return dst, cororpc.ErrcIOError, "forwarding to the leader at " + addr + ": " + err.Error()
	}
	if resp.Header.Errc != cororpc.ErrcOK {
		var msg string
		_ = structpack.Unmarshal(resp.Body, &msg)
		return dst, resp.Header.Errc, msg
	}
	return append(dst, resp.Body...), cororpc.ErrcOK, ""
}

// leaderAddr is where to forward: the promoted leader's Mooncake address
// when this node is a follower whose Raft leader is that promoted leader,
// else "". Unlike a NOT_LEADER answer it does not ask for recent contact:
// on a loaded machine a live leader can be a heartbeat late, and a
// forward to a dead one fails at once (connection refused).
func (m *mooncakeFront) leaderAddr() string {
	if m.n.IsLeader() {
		return ""
	}
	st, ok := m.n.promotedLeader()
	if !ok {
		return ""
	}
	return st.LeaderMooncakeAddr
}

// DrainMooncake keeps serving until another node leads, promoted, and no
// Mooncake call has begun here for quiet since; or until ctx ends. A
// leader that handed over before it stops calls it: its clients move to
// the new leader once it publishes master_view, and until then this node
// forwards their calls. Closing at once would cost each client whose next
// call met the closed address ~4 s of its connection pool's retries
// (docs/MOONCAKE_PROTOCOL.md). A leader promotes within two election
// timeouts of the handover; with none by then (the whole cluster
// stopping), no node would take the calls, and quiet alone decides.
func (n *Node) DrainMooncake(ctx context.Context, quiet time.Duration) {
	if n.mooncake == nil || quiet <= 0 {
		return
	}
	leaderBy := time.Now().Add(2 * n.cfg.ElectionTimeout)
	t := time.NewTicker(quiet / 4)
	defer t.Stop()
	last, since := n.mooncake.calls.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c := n.mooncake.calls.Load()
		awaiting := n.mooncake.leaderAddr() == "" && time.Now().Before(leaderBy)
		switch {
		case c != last || awaiting:
			last, since = c, time.Now()
		case time.Since(since) >= quiet:
			return
		}
	}
}
