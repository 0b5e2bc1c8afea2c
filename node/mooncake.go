package node

import (
	"context"
	"time"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/structpack"
)

// mooncakeForwardTimeout bounds a forwarded call: a Mooncake client's own
// RPC deadline is not on the wire.
const mooncakeForwardTimeout = 10 * time.Second

// mooncakeFront serves the Mooncake protocol: the promoted leader answers;
// a follower forwards each call, frame for frame, to the leader's Mooncake
// address (from its Promote), so a client configured with any node's
// address works. With no promoted leader known (an election) the local
// handler answers UNAVAILABLE_IN_CURRENT_STATUS, as for gRPC.
type mooncakeFront struct {
	n     *Node
	local *mooncakeapi.Handler
	fwd   cororpc.Pool
}

func (m *mooncakeFront) Call(ctx context.Context, id uint32, body []byte) ([]byte, cororpc.Errc, string) {
	addr := m.leaderAddr()
	if addr == "" || cororpc.Forwarded(ctx) { // views disagree: no second hop
		return m.local.Call(ctx, id, body)
	}
	fctx, cancel := context.WithTimeout(ctx, mooncakeForwardTimeout)
	defer cancel()
	resp, err := m.fwd.Call(fctx, addr, id, body)
	if err != nil {
		// The leader may or may not have run it: coro_rpc's io error, which
		// a Mooncake client reports as a failed RPC.
		return nil, cororpc.ErrcIOError, "forwarding to the leader at " + addr + ": " + err.Error()
	}
	if resp.Header.Errc != cororpc.ErrcOK {
		var msg string
		_ = structpack.Unmarshal(resp.Body, &msg)
		return nil, resp.Header.Errc, msg
	}
	return resp.Body, cororpc.ErrcOK, ""
}

// leaderAddr is where to forward: the promoted leader's Mooncake address
// when this node is a follower that hears from it, else "".
func (m *mooncakeFront) leaderAddr() string {
	n := m.n
	if n.IsLeader() {
		return ""
	}
	_, leaderID := n.raft.LeaderWithID()
	var st fsm.Stats
	n.sm.read(func(f *fsm.FSM) { st = f.Stats() })
	if leaderID == "" || string(leaderID) != st.LeaderID || st.LeaderID == n.cfg.ID ||
		time.Since(n.raft.LastContact()) >= n.cfg.HeartbeatTimeout/2 {
		return ""
	}
	return st.LeaderMooncakeAddr
}
