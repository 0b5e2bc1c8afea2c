package raftnet

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPipelineAfterARefusedAppend plays raft's pipeline replication
// against a follower that refuses every append (its disk is full): raft's
// decoder reads the refusal and stops reading; its sender may go on. With
// the transport's default of two RPCs in flight, the second send after
// that waited forever (finding 16); guarded, it returns ErrPipelineShutdown,
// so raft closes the pipeline and replicates the ordinary way.
func TestPipelineAfterARefusedAppend(t *testing.T) {
	follower, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
	require.NoError(t, err)
	defer follower.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case rpc := <-follower.Consumer():
				rpc.Respond(&raft.AppendEntriesResponse{Success: false, LastLog: 1}, nil)
			case <-stop:
				return
			}
		}
	}()
	leader, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
	require.NoError(t, err)
	defer leader.Close()

	guarded := guard(leader)
	defer guarded.Close()
	p, err := guarded.AppendEntriesPipeline("f", follower.LocalAddr())
	require.NoError(t, err)
	send := func() error {
		_, err := p.AppendEntries(&raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: 1,
			PrevLogEntry: 5, PrevLogTerm: 1}, &raft.AppendEntriesResponse{})
		return err
	}
	require.NoError(t, send())
	select {
	case f := <-p.Consumer():
		require.False(t, f.Response().Success, "the follower refused")
	case <-time.After(5 * time.Second):
		t.Fatal("no answer from the follower")
	}

	sent := make(chan error, 1)
	go func() {
		var err error
		for range 3 {
			if err = send(); err != nil {
				break
			}
		}
		sent <- err
	}()
	select {
	case err := <-sent:
		require.ErrorIs(t, err, raft.ErrPipelineShutdown)
	case <-time.After(5 * time.Second):
		t.Fatal("a send after the refusal hangs: nobody reads the pipeline's answers any more")
	}
	require.NoError(t, p.Close())
}

// TestHeartbeatsReachTheMainLoop sends a heartbeat of term 5 through the
// transport. The unguarded transport hands any heartbeat to the handler
// raft installs, which runs appendEntries on the connection's goroutine,
// beside raft's main loop: one of a newer term — what a new leader sends
// a deposed one — then changes the term there (finding 18). Guarded, the
// heartbeat arrives where every other RPC does, on the channel raft's main
// loop reads, unless the node is a follower in term 5 already: then it is
// answered on the fast path, changing nothing but the time of contact.
func TestHeartbeatsReachTheMainLoop(t *testing.T) {
	heartbeat := func(t *testing.T, to raft.Transport, via *raft.NetworkTransport) (fastPath bool) {
		t.Helper()
		handled := make(chan struct{}, 1)
		to.SetHeartbeatHandler(func(rpc raft.RPC) {
			handled <- struct{}{}
			rpc.Respond(&raft.AppendEntriesResponse{Term: 5, Success: true}, nil)
		})
		sent := make(chan error, 1)
		go func() {
			req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax,
				ID: []byte("n0"), Addr: []byte(via.LocalAddr())}, Term: 5}
			sent <- via.AppendEntries("f", to.LocalAddr(), req, &raft.AppendEntriesResponse{})
		}()
		select {
		case <-handled:
			fastPath = true
		case rpc := <-to.Consumer():
			req, ok := rpc.Command.(*raft.AppendEntriesRequest)
			require.True(t, ok, "got %T", rpc.Command)
			require.EqualValues(t, 5, req.Term)
			rpc.Respond(&raft.AppendEntriesResponse{Term: 5, Success: true}, nil)
		case <-time.After(5 * time.Second):
			t.Fatal("the heartbeat arrived nowhere")
		}
		require.NoError(t, <-sent)
		return fastPath
	}
	newTransport := func(t *testing.T) *raft.NetworkTransport {
		tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	guarded := func(t *testing.T, followerIn uint64) *Transport {
		g := guard(newTransport(t))
		t.Cleanup(func() { _ = g.Close() })
		if followerIn > 0 {
			g.FastHeartbeats(func(term uint64) bool { return term == followerIn })
		}
		return g
	}
	leader := newTransport(t)
	require.True(t, heartbeat(t, newTransport(t), leader), "unguarded, the transport takes the fast path (else this test proves nothing)")
	require.False(t, heartbeat(t, guarded(t, 0), leader), "guarded, before the node says its term, the heartbeat must reach the main loop")
	require.False(t, heartbeat(t, guarded(t, 4), leader), "a heartbeat of a newer term must reach the main loop")
	require.True(t, heartbeat(t, guarded(t, 5), leader), "a heartbeat of a follower's own term is answered on the fast path")
}

// TestPreVoteHooks: a pre-vote request runs the BeforePreVote hook before
// it reaches raft's main loop. A node that granted a peer's pre-vote, the
// peer's log being at least as long as its own, does not ask that peer for
// a pre-vote within the span; it asks a peer it refused, a peer with
// a shorter log, one that asked for an older term, and any peer once the
// span is over.
func TestPreVoteHooks(t *testing.T) {
	newGuarded := func(t *testing.T) *Transport {
		tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
		require.NoError(t, err)
		g := guard(tr)
		t.Cleanup(func() { _ = g.Close() })
		return g
	}
	node := newGuarded(t)
	var hooked atomic.Bool
	node.BeforePreVote(func() { hooked.Store(true) })
	const span = 300 * time.Millisecond
	node.CoordinatePreVotes(span)

	preVote := func(from, to *Transport, term, lastTerm, lastIndex uint64) (*raft.RequestPreVoteResponse, error) {
		req := &raft.RequestPreVoteRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax,
			ID: []byte(from.LocalAddr()), Addr: []byte(from.LocalAddr())}, Term: term, LastLogTerm: lastTerm, LastLogIndex: lastIndex}
		var resp raft.RequestPreVoteResponse
		err := from.RequestPreVote(raft.ServerID(to.LocalAddr()), to.LocalAddr(), req, &resp)
		return &resp, err
	}
	// askedBy has peer ask the node for a pre-vote in term 6 with its log
	// at 4/100, and answers it as the node's raft, granting or not.
	askedBy := func(peer *Transport, grant bool) {
		t.Helper()
		hooked.Store(false)
		answered := make(chan *raft.RequestPreVoteResponse, 1)
		go func() {
			resp, err := preVote(peer, node, 6, 4, 100)
			assert.NoError(t, err)
			answered <- resp
		}()
		select {
		case rpc := <-node.Consumer():
			require.IsType(t, &raft.RequestPreVoteRequest{}, rpc.Command)
			require.True(t, hooked.Load(), "the hook ran before raft got the request")
			rpc.Respond(&raft.RequestPreVoteResponse{Term: 6, Granted: grant}, nil)
		case <-time.After(5 * time.Second):
			t.Fatal("the pre-vote request did not reach raft")
		}
		select {
		case resp := <-answered:
			require.Equal(t, grant, resp.Granted, "the peer got raft's answer")
		case <-time.After(5 * time.Second):
			t.Fatal("the peer got no answer")
		}
	}
	// ask has the node ask peer for a pre-vote and reports whether the
	// peer was asked; the peer grants every request.
	ask := func(peer *Transport, term, lastTerm, lastIndex uint64) bool {
		t.Helper()
		type result struct {
			resp *raft.RequestPreVoteResponse
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := preVote(node, peer, term, lastTerm, lastIndex)
			done <- result{resp, err}
		}()
		select {
		case rpc := <-peer.Consumer():
			rpc.Respond(&raft.RequestPreVoteResponse{Term: term, Granted: true}, nil)
		case r := <-done:
			require.NoError(t, r.err)
			assert.False(t, r.resp.Granted, "a pre-vote not asked for counts as refused")
			assert.Equal(t, term, r.resp.Term, "in the node's own term, so raft does not step down")
			return false
		case <-time.After(5 * time.Second):
			t.Fatal("no answer")
		}
		r := <-done
		require.NoError(t, r.err)
		assert.True(t, r.resp.Granted)
		return true
	}

	refused := newGuarded(t)
	askedBy(refused, false)
	assert.True(t, ask(refused, 6, 4, 100), "the node refused the peer: it asks, so that one of them wins")

	granted := newGuarded(t)
	askedBy(granted, true)
	assert.False(t, ask(granted, 6, 4, 100), "an equal log: the peer wins with the node's vote, so the node does not ask")
	assert.False(t, ask(granted, 6, 4, 90), "the node's log is the shorter")
	assert.False(t, ask(granted, 6, 3, 200), "the node's last term is the older")
	assert.True(t, ask(granted, 6, 4, 101), "the node's log is the longer: it may win")
	assert.True(t, ask(granted, 6, 5, 1), "the node's last term is the newer")
	assert.True(t, ask(granted, 7, 4, 90), "the peer asked for an older term")
	time.Sleep(span)
	assert.True(t, ask(granted, 6, 4, 90), "the span is over")

	// Raft stands, sends its own requests, and only then reads the peer's:
	// the node's request to the peer waits for that answer.
	pending := newGuarded(t)
	go func() {
		_, err := preVote(pending, node, 6, 4, 100)
		assert.NoError(t, err)
	}()
	var held raft.RPC
	select {
	case held = <-node.Consumer():
	case <-time.After(5 * time.Second):
		t.Fatal("the pre-vote request did not reach raft")
	}
	asked := make(chan bool, 1)
	go func() {
		resp, err := preVote(node, pending, 6, 4, 100)
		assert.NoError(t, err)
		asked <- resp.Granted
	}()
	time.Sleep(answerWait / 5)
	held.Respond(&raft.RequestPreVoteResponse{Term: 6, Granted: true}, nil)
	select {
	case rpc := <-pending.Consumer():
		rpc.Respond(&raft.RequestPreVoteResponse{Term: 6, Granted: true}, nil)
		t.Fatal("the node asked a peer it was granting a pre-vote to")
	case granted := <-asked:
		assert.False(t, granted)
	case <-time.After(5 * time.Second):
		t.Fatal("no answer")
	}
}

// TestPreVoteAskedAgain: a node whose pre-vote a peer refused asks the
// peer again once the peer has asked for a pre-vote of its own and been
// refused — here by the node's transport, which outranks the peer (the
// longer log) and keeps its own request for the span although the peer
// already answered it; not when the peer's log is the longer and raft
// granted it (the peer wins), and not when the peer does not stand within
// the span.
func TestPreVoteAskedAgain(t *testing.T) {
	const span = 300 * time.Millisecond
	request := func(from *Transport, lastIndex uint64) *raft.RequestPreVoteRequest {
		return &raft.RequestPreVoteRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax,
			ID: []byte(from.LocalAddr()), Addr: []byte(from.LocalAddr())}, Term: 6, LastLogTerm: 4, LastLogIndex: lastIndex}
	}
	answer := func(t *testing.T, tr *Transport, grant bool) {
		t.Helper()
		select {
		case rpc := <-tr.Consumer():
			rpc.Respond(&raft.RequestPreVoteResponse{Term: 6, Granted: grant}, nil)
		case <-time.After(5 * time.Second):
			t.Fatal("no pre-vote request arrived")
		}
	}
	for _, tc := range []struct {
		name          string
		peerStands    bool
		peerLastIndex uint64 // the node's is 100
		nodeRaftAsked bool   // the peer's request reaches the node's raft, which grants it
		granted       bool   // the node's own pre-vote, in the end
	}{
		{"the peer stands with the shorter log: refused, and asked again", true, 99, false, true},
		{"the peer stands with the longer log: granted, and wins", true, 101, true, false},
		{"the peer does not stand", false, 100, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, peer := coordinated(t, span), coordinated(t, span)
			done := make(chan *raft.RequestPreVoteResponse, 1)
			go func() {
				var resp raft.RequestPreVoteResponse
				assert.NoError(t, node.RequestPreVote(raft.ServerID(peer.LocalAddr()), peer.LocalAddr(), request(node, 100), &resp))
				done <- &resp
			}()
			answer(t, peer, false)
			peerDone := make(chan *raft.RequestPreVoteResponse, 1)
			if tc.peerStands {
				go func() {
					var resp raft.RequestPreVoteResponse
					assert.NoError(t, peer.RequestPreVote(raft.ServerID(node.LocalAddr()), node.LocalAddr(), request(peer, tc.peerLastIndex), &resp))
					peerDone <- &resp
				}()
				if tc.nodeRaftAsked {
					answer(t, node, true)
				}
			}
			if tc.granted {
				answer(t, peer, true)
			}
			select {
			case resp := <-done:
				assert.Equal(t, tc.granted, resp.Granted)
			case <-time.After(5 * time.Second):
				t.Fatal("the node's pre-vote got no answer")
			}
			if tc.peerStands {
				select {
				case resp := <-peerDone:
					assert.Equal(t, tc.nodeRaftAsked, resp.Granted, "the peer's own pre-vote")
				case <-time.After(5 * time.Second):
					t.Fatal("the peer's pre-vote got no answer")
				}
			}
			select {
			case rpc := <-peer.Consumer():
				rpc.Respond(&raft.RequestPreVoteResponse{Term: 6}, nil)
				t.Fatal("the node asked the peer once more than it should")
			case rpc := <-node.Consumer():
				rpc.Respond(&raft.RequestPreVoteResponse{Term: 6}, nil)
				t.Fatal("the node's raft got a request its transport answered")
			default:
			}
		})
	}
}

// TestPreVoteCrossing: two nodes that stand at once each send their
// request before reading the other's. The one that outranks refuses the
// other's request itself (raft never sees it) and the other leaves the
// outranking one's to raft, so exactly one wins the pre-vote and the real
// vote does not split.
func TestPreVoteCrossing(t *testing.T) {
	const span = 300 * time.Millisecond
	ask := func(from, to *Transport, lastIndex uint64) chan *raft.RequestPreVoteResponse {
		done := make(chan *raft.RequestPreVoteResponse, 1)
		go func() {
			req := &raft.RequestPreVoteRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax,
				ID: []byte(from.LocalAddr()), Addr: []byte(from.LocalAddr())}, Term: 6, LastLogTerm: 4, LastLogIndex: lastIndex}
			var resp raft.RequestPreVoteResponse
			assert.NoError(t, from.RequestPreVote(raft.ServerID(to.LocalAddr()), to.LocalAddr(), req, &resp))
			done <- &resp
		}()
		return done
	}
	winner, loser := coordinated(t, span), coordinated(t, span)
	won := ask(winner, loser, 101)
	// The winner's request waits at the loser's raft while the loser's
	// crosses it.
	var held raft.RPC
	select {
	case held = <-loser.Consumer():
	case <-time.After(5 * time.Second):
		t.Fatal("the winner's request did not reach the loser's raft")
	}
	lost := ask(loser, winner, 100)
	select {
	case resp := <-lost:
		assert.False(t, resp.Granted, "the outranked node's pre-vote")
		assert.Equal(t, uint64(5), resp.Term, "in the term before the one both stand for, so raft does not step down")
	case rpc := <-winner.Consumer():
		rpc.Respond(&raft.RequestPreVoteResponse{Term: 6, Granted: true}, nil)
		t.Fatal("the outranking node's raft got the crossing request")
	case <-time.After(5 * time.Second):
		t.Fatal("the outranked node's pre-vote got no answer")
	}
	held.Respond(&raft.RequestPreVoteResponse{Term: 6, Granted: true}, nil)
	select {
	case resp := <-won:
		assert.True(t, resp.Granted, "the outranking node's pre-vote")
	case <-time.After(5 * time.Second):
		t.Fatal("the outranking node's pre-vote got no answer")
	}
}

// coordinated is a guarded transport on loopback with CoordinatePreVotes'
// rules on.
func coordinated(t *testing.T, span time.Duration) *Transport {
	tr, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
	require.NoError(t, err)
	g := guard(tr)
	g.CoordinatePreVotes(span)
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// TestOutranks: the longer log wins a crossing, then the greater ID.
func TestOutranks(t *testing.T) {
	req := func(id string, lastTerm, lastIndex uint64) *raft.RequestPreVoteRequest {
		return &raft.RequestPreVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte(id)}, LastLogTerm: lastTerm, LastLogIndex: lastIndex}
	}
	for _, tc := range []struct {
		name      string
		own, peer *raft.RequestPreVoteRequest
		want      bool
	}{
		{"a newer last term", req("a", 5, 1), req("b", 4, 100), true},
		{"an older last term", req("b", 4, 100), req("a", 5, 1), false},
		{"a longer log", req("a", 4, 101), req("b", 4, 100), true},
		{"a shorter log", req("b", 4, 99), req("a", 4, 100), false},
		{"equal logs, the greater ID", req("b", 4, 100), req("a", 4, 100), true},
		{"equal logs, the smaller ID", req("a", 4, 100), req("b", 4, 100), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, outranks(tc.own, tc.peer))
			assert.False(t, tc.want && outranks(tc.peer, tc.own), "both outrank each other")
		})
	}
}
