package raftnet

import (
	"io"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/internal/freeport"
)

// An append of term 3 from a leader to follower "f", with entries to take
// and a commit index: what raft's replication sends, not a heartbeat.
func replicationAppend() *raft.AppendEntriesRequest {
	return &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n0")},
		Term: 3, PrevLogEntry: 7, PrevLogTerm: 3, LeaderCommitIndex: 7, Entries: []*raft.Log{{Index: 8, Term: 3, Data: []byte("x")}}}
}

func leaderTransport(t *testing.T) *Transport {
	t.Helper()
	nt, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
	require.NoError(t, err)
	g := guard(nt)
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// startFollower listens on addr as follower "f" and answers every append
// with success, counting them.
func startFollower(t *testing.T, addr string) *atomic.Int64 {
	t.Helper()
	f, err := raft.NewTCPTransport(addr, nil, 2, time.Second, io.Discard)
	require.NoError(t, err)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); _ = f.Close() })
	got := &atomic.Int64{}
	go func() {
		for {
			select {
			case rpc := <-f.Consumer():
				got.Add(1)
				rpc.Respond(&raft.AppendEntriesResponse{Term: 3, Success: true, LastLog: 8}, nil)
			case <-stop:
				return
			}
		}
	}()
	return got
}

// TestAppendWaitsForARestartingPeer: an append to a follower whose process
// is down is held, not failed, while the leader leads its term with the
// follower in its configuration, and it is delivered once the follower
// listens again: raft's replication, which backs off for up to 10 s after
// each failure, reaches a restarted node at once.
func TestAppendWaitsForARestartingPeer(t *testing.T) {
	addr, err := freeport.Addr()
	require.NoError(t, err)
	leader := leaderTransport(t)
	leader.HoldAppends(func(term uint64, peer raft.ServerID) bool { return term == 3 && peer == "f" })

	var resp raft.AppendEntriesResponse
	sent := make(chan error, 1)
	go func() { sent <- leader.AppendEntries("f", raft.ServerAddress(addr), replicationAppend(), &resp) }()
	select {
	case err := <-sent:
		t.Fatalf("the append to a peer that is down returned (%v): raft would count a failure and back off", err)
	case <-time.After(300 * time.Millisecond):
	}
	got := startFollower(t, addr)
	select {
	case err := <-sent:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the held append did not reach the follower once it listened")
	}
	require.True(t, resp.Success)
	require.EqualValues(t, 1, got.Load(), "the follower took the append once")
}

// TestAppendNotHeld: an append fails at once, as raft's transport has it,
// when nothing says to hold it, when it is a heartbeat, and when the
// leader no longer leads its term or the peer left its configuration; and
// a held append gives up as soon as either stops being so, or the
// transport closes.
func TestAppendNotHeld(t *testing.T) {
	heartbeat := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n0")},
		Term: 3, Leader: []byte("n0")}
	for _, tc := range []struct {
		name    string
		hold    bool // HoldAppends called
		leading func(term uint64, peer raft.ServerID) bool
		req     *raft.AppendEntriesRequest
	}{
		{"without HoldAppends", false, nil, replicationAppend()},
		{"a heartbeat", true, func(uint64, raft.ServerID) bool { return true }, heartbeat},
		{"another term", true, func(term uint64, _ raft.ServerID) bool { return term == 4 }, replicationAppend()},
		{"a peer not in the configuration", true, func(_ uint64, peer raft.ServerID) bool { return peer == "g" }, replicationAppend()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, err := freeport.Addr()
			require.NoError(t, err)
			leader := leaderTransport(t)
			if tc.hold {
				leader.HoldAppends(tc.leading)
			}
			start := time.Now()
			err = leader.AppendEntries("f", raft.ServerAddress(addr), tc.req, &raft.AppendEntriesResponse{})
			require.ErrorIs(t, err, syscall.ECONNREFUSED)
			require.Less(t, time.Since(start), 2*redialEvery, "not held")
		})
	}

	for _, tc := range []struct {
		name string
		end  func(leading *atomic.Bool, leader *Transport)
	}{
		{"the leader steps down", func(leading *atomic.Bool, _ *Transport) { leading.Store(false) }},
		{"the transport closes", func(_ *atomic.Bool, leader *Transport) { _ = leader.Close() }},
	} {
		t.Run("held until "+tc.name, func(t *testing.T) {
			addr, err := freeport.Addr()
			require.NoError(t, err)
			leader := leaderTransport(t)
			leading := &atomic.Bool{}
			leading.Store(true)
			leader.HoldAppends(func(uint64, raft.ServerID) bool { return leading.Load() })
			sent := make(chan error, 1)
			go func() {
				sent <- leader.AppendEntries("f", raft.ServerAddress(addr), replicationAppend(), &raft.AppendEntriesResponse{})
			}()
			select {
			case err := <-sent:
				t.Fatalf("returned while held: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			tc.end(leading, leader)
			select {
			case err := <-sent:
				require.ErrorIs(t, err, syscall.ECONNREFUSED)
			case <-time.After(5 * time.Second):
				t.Fatal("the held append did not give up")
			}
		})
	}
}
