package raftnet

import (
	"errors"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// A peer that refuses connections has no process listening on its Raft
// address: it is down, or starting again. hashicorp/raft counts every
// refused append as a failure and sleeps 10 ms × 2^(failures−2) before the
// next (replication.go, up to 10.24 s), so a node restarted after seconds
// down took no entry until its leader's next try, and applied nothing
// before it: the leader tells a follower what is committed in its
// appends. At a million objects that wait was 1.0–1.9 s of a restart
// (docs/BENCHMARKS.md, "Production size"); redpanda met the same
// (redpanda-data/redpanda#4083).
//
// So an append to a refusing peer waits in the transport instead, dialing
// again every redialEvery while HoldAppends' test says the leader still
// leads the request's term with the peer in its configuration: raft counts
// one failure for the outage, and the append reaches the peer as soon as
// it listens. Nothing was sent on a refused dial, so sending the same
// request again is sending it once. Heartbeats are not held: raft's
// heartbeat backoff stops at half a heartbeat timeout, and a heartbeat
// carries no commit index.
const redialEvery = 50 * time.Millisecond

// HoldAppends lets an append to a peer that refuses connections wait for
// it while holding(term, peer) says this node leads term with peer in its
// configuration. Until it is called no append waits.
func (t *Transport) HoldAppends(holding func(term uint64, peer raft.ServerID) bool) {
	t.holding.Store(&holding)
}

// AppendEntries is the transport's, held while the peer refuses (above).
func (t *Transport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	err := t.NetworkTransport.AppendEntries(id, target, args, resp)
	holding := t.holding.Load()
	if holding == nil || isHeartbeat(args) {
		return err
	}
	tick := time.NewTicker(redialEvery)
	defer tick.Stop()
	for errors.Is(err, syscall.ECONNREFUSED) && (*holding)(args.Term, id) {
		select {
		case <-t.done:
			return err
		case <-tick.C:
		}
		err = t.NetworkTransport.AppendEntries(id, target, args, resp)
	}
	return err
}

// isHeartbeat is NetworkTransport's own test for a heartbeat: an append
// with a leader and a term and nothing else.
func isHeartbeat(req *raft.AppendEntriesRequest) bool {
	return req.Term != 0 && req.PrevLogEntry == 0 && req.PrevLogTerm == 0 &&
		len(req.Entries) == 0 && req.LeaderCommitIndex == 0
}
