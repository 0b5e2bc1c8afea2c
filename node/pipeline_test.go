package node

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

	p, err := guardedTransport{leader}.AppendEntriesPipeline("f", follower.LocalAddr())
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
