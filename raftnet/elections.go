package raftnet

import (
	"time"

	"github.com/hashicorp/raft"
)

// hashicorp/raft refuses a pre-vote while it knows a leader, and a follower
// forgets its leader only when its own timer finds it silent. Followers
// stand at different times (node/stand.go's jitter keeps them from
// splitting the vote), so the first to stand after a leader dies is
// refused by the other, which still knows the dead leader; the election
// then waits for the other to stand, and if the other's log is the shorter
// the first refuses it too, and both wait out an election timeout (300–600
// ms at the defaults; docs/BENCHMARKS.md, "The failover at 6M").
//
// The transport lets a candidate win at once instead. All it does
// concerns pre-votes, which decide nothing: a pre-vote lets a candidate ask
// for real votes, and raft grants those by its own rules.
//
//   - BeforePreVote runs before a pre-vote request reaches raft. The node
//     has raft look for its leader there, which drops one silent for a
//     heartbeat timeout (the same check raft's timer makes, so a live
//     leader keeps its followers); the request then finds no leader. A
//     node that heard from its leader more recently stands as soon as the
//     timeout is up (node/stand.go).
//   - A candidate refused by a peer asks it again once the peer has stood
//     (sent a pre-vote request of its own) and raft has refused that: the
//     peer no longer knows a leader, and the candidate's log is the longer.
//     Within CoordinatePreVotes' span.
//   - A node that granted a pre-vote to a peer whose log is at least as
//     long as its own does not ask that peer for a pre-vote of its own
//     (within CoordinatePreVotes' span): the peer needs only this node's
//     vote to win, and had both asked each other, both would win the
//     pre-vote and split the real vote. It counts as refused. A node that
//     refused the peer asks it as before.
//   - Two nodes that stand at once send their requests before either has
//     read the other's, so the rule above cannot hold: both would grant,
//     both win the pre-vote, and the real vote splits (an election timeout
//     lost: a kill of 855 ms at 6M). So a node that asked a peer for a
//     pre-vote for the same term within the span refuses the peer's request
//     if it outranks the peer (the longer log, then the greater ID), and
//     leaves it to raft otherwise. Both compare the same two requests, so
//     exactly one wins; and since the node's answer to the peer may reach
//     it before the peer's request reaches the node, the node keeps its
//     request for the span, not only while it is unanswered.

// ownRequest is the node's last request for a pre-vote to a peer.
type ownRequest struct {
	at  time.Time
	req *raft.RequestPreVoteRequest
}

// candidacy is the last request for a pre-vote a peer sent, and the
// node's answer once raft has given it.
type candidacy struct {
	at                              time.Time
	term, lastLogTerm, lastLogIndex uint64
	answered                        chan struct{} // closed once granted is set
	granted                         bool
}

// answerWait bounds how long a node's own request for a pre-vote waits
// for raft to answer a peer's: raft's main loop stands, sends its own
// requests, then reads the peer's.
const answerWait = 50 * time.Millisecond

// maxCandidates bounds the peers whose candidacies a transport keeps.
const maxCandidates = 64

// BeforePreVote has fn run on the transport's reader before each pre-vote
// request reaches raft's main loop; raft reads no other RPC meanwhile.
func (t *Transport) BeforePreVote(fn func()) { t.beforePreVote.Store(&fn) }

// CoordinatePreVotes turns on the second, third and fourth rules above,
// each within span of the peer's request or the node's: a node asks a peer
// that refused it again once the peer has stood and been refused, does not
// ask a peer it granted, and refuses a peer it outranks whose request
// crossed its own. Until it is called the node asks every peer once and
// leaves every request to raft.
func (t *Transport) CoordinatePreVotes(span time.Duration) { t.span.Store(int64(span)) }

// noteCandidacy records a request for a pre-vote, has the node's answer
// recorded when raft gives it, and runs the BeforePreVote hook before the
// request goes on to raft. It reports true when it answered the request
// itself (a request that crossed the node's own, which the node outranks),
// which then must not go on to raft. It ignores other RPCs.
func (t *Transport) noteCandidacy(rpc *raft.RPC) (answered bool) {
	req, ok := rpc.Command.(*raft.RequestPreVoteRequest)
	if !ok {
		return false
	}
	c := &candidacy{at: time.Now(), term: req.Term, lastLogTerm: req.LastLogTerm, lastLogIndex: req.LastLogIndex,
		answered: make(chan struct{})}
	t.candidatesMu.Lock()
	if len(t.candidates) >= maxCandidates {
		// Only a peer that is not in the configuration sends so many IDs.
		clear(t.candidates)
	}
	t.candidates[string(req.ID)] = c
	close(t.noted)
	t.noted = make(chan struct{})
	own, ok := t.asked[string(req.ID)]
	t.candidatesMu.Unlock()
	if span := time.Duration(t.span.Load()); ok && span > 0 && time.Since(own.at) < span &&
		own.req.Term == req.Term && outranks(own.req, req) {
		close(c.answered)
		// In the node's own term (the one before the term both stand
		// for), so the peer's raft does not step down.
		rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax},
			Term: req.Term - 1, Granted: false}, nil)
		return true
	}
	// The transport's own channel for the answer holds one, so passing it
	// on never blocks; raft answers every request it reads.
	answer, proxy := rpc.RespChan, make(chan raft.RPCResponse, 1)
	rpc.RespChan = proxy
	go func() {
		select {
		case r := <-proxy:
			resp, ok := r.Response.(*raft.RequestPreVoteResponse)
			c.granted = ok && r.Error == nil && resp.Granted
			close(c.answered)
			answer <- r
		case <-t.done:
		}
	}()
	if fn := t.beforePreVote.Load(); fn != nil {
		(*fn)()
	}
	return false
}

// outranks reports whether the candidate that sent own wins against the
// one that sent peer's crossing request: the longer log, then the greater
// ID.
func outranks(own, peer *raft.RequestPreVoteRequest) bool {
	if own.LastLogTerm != peer.LastLogTerm {
		return own.LastLogTerm > peer.LastLogTerm
	}
	if own.LastLogIndex != peer.LastLogIndex {
		return own.LastLogIndex > peer.LastLogIndex
	}
	return string(own.ID) > string(peer.ID)
}

// yields reports whether the node should not ask peer id for the pre-vote
// args describes (see CoordinatePreVotes).
func (t *Transport) yields(id raft.ServerID, args *raft.RequestPreVoteRequest) bool {
	span := time.Duration(t.span.Load())
	if span <= 0 {
		return false
	}
	t.candidatesMu.Lock()
	c, ok := t.candidates[string(id)]
	t.candidatesMu.Unlock()
	// args.Term is the node's term plus one, as the peer's request's is
	// the peer's: a peer in an older term cannot win.
	if !ok || time.Since(c.at) >= span || c.term < args.Term ||
		c.lastLogTerm < args.LastLogTerm || c.lastLogTerm == args.LastLogTerm && c.lastLogIndex < args.LastLogIndex {
		return false
	}
	select {
	case <-c.answered:
		return c.granted
	case <-time.After(answerWait):
		return false
	case <-t.done:
		return false
	}
}

// refusedSince waits, for up to the span, for peer id to ask for a
// pre-vote after since, and reports whether raft refused it.
func (t *Transport) refusedSince(id raft.ServerID, since time.Time) bool {
	span := time.Duration(t.span.Load())
	if span <= 0 {
		return false
	}
	timeout := time.After(span)
	for {
		t.candidatesMu.Lock()
		c, noted := t.candidates[string(id)], t.noted
		t.candidatesMu.Unlock()
		if c != nil && c.at.After(since) {
			select {
			case <-c.answered:
				return !c.granted
			case <-time.After(answerWait):
				return false
			case <-t.done:
				return false
			}
		}
		select {
		case <-noted:
		case <-timeout:
			return false
		case <-t.done:
			return false
		}
	}
}

// RequestPreVote asks peer id for a pre-vote, unless the node yields to it:
// then the pre-vote is refused without asking. Refused, it asks again once
// the peer has stood and been refused.
func (t *Transport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if t.yields(id, args) {
		*resp = raft.RequestPreVoteResponse{Term: args.Term, Granted: false}
		return nil
	}
	asked := time.Now()
	t.candidatesMu.Lock()
	t.asked[string(id)] = ownRequest{at: asked, req: args}
	t.candidatesMu.Unlock()
	err := t.NetworkTransport.RequestPreVote(id, target, args, resp)
	if err != nil || resp.Granted || resp.Term > args.Term || !t.refusedSince(id, asked) {
		return err
	}
	return t.NetworkTransport.RequestPreVote(id, target, args, resp)
}
