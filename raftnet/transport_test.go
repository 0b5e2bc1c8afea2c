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

	p, err := Transport{leader}.AppendEntriesPipeline("f", follower.LocalAddr())
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

// TestHeartbeatsReachTheMainLoop sends a heartbeat of a newer term — what a
// new leader sends a deposed one — through the transport. The unguarded
// transport hands it to the heartbeat handler raft installs, which runs
// appendEntries on the connection's goroutine, beside raft's main loop
// (finding 18); guarded, no handler is installed and the heartbeat arrives
// where every other RPC does, on the channel raft's main loop reads.
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
	leader := newTransport(t)
	require.True(t, heartbeat(t, newTransport(t), leader), "unguarded, the transport takes the fast path (else this test proves nothing)")
	require.False(t, heartbeat(t, Transport{newTransport(t)}, leader), "guarded, the heartbeat must reach the main loop")
}
