package raftnet

import (
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
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
