package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPingsReadSessionsWithoutTheLock: a ping is answered while an apply
// holds the state's lock, and says whether the client has a session.
func TestPingsReadSessionsWithoutTheLock(t *testing.T) {
	c := newCluster(t, 1, time.Hour)
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)

	type answer struct {
		remount bool
		err     error
	}
	answers := make(chan answer, 2)
	nd.sm.mu.Lock()
	go func() {
		pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, id := range []string{"c1", "c9"} {
			remount, err := nd.Ping(pctx, id)
			answers <- answer{remount, err}
		}
	}()
	var got []answer
	for range 2 {
		select {
		case a := <-answers:
			got = append(got, a)
		case <-time.After(2 * time.Second):
		}
	}
	nd.sm.mu.Unlock()
	require.Len(t, got, 2, "the pings waited for the state's lock")
	assert.Equal(t, answer{false, nil}, got[0], "c1 has a session")
	assert.Equal(t, answer{true, nil}, got[1], "c9 has none: remount")
}

// TestPingsNeverWaitForARound: a ping is answered from the leader's own
// sessions with no quorum round, even where every read takes one
// (--read-mode quorum): under service.NoWait it is answered, not given up,
// and the next tick carries it.
func TestPingsNeverWaitForARound(t *testing.T) {
	c := newCluster(t, 3, time.Hour, func(cfg *Config) { cfg.ReadMode = ReadQuorum })
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	_, _, err := nd.GetReplicaList(service.NoWait(ctx(t)), "k")
	require.ErrorIs(t, err, errWouldWait, "a read waits for a round")

	remount, err := nd.Ping(service.NoWait(ctx(t)), "c1")
	require.NoError(t, err)
	assert.False(t, remount, "c1 has a session")
	remount, err = nd.Ping(service.NoWait(ctx(t)), "c9")
	require.NoError(t, err)
	assert.True(t, remount, "c9 has none: remount")
	_, pings := nd.batcher.Drain()
	require.Len(t, pings, 1)
	assert.Equal(t, "c1", pings[0].ClientID, "the ping waits for the next tick")

	follower := c.nodes[(c.leader()+1)%3]
	_, err = follower.Ping(ctx(t), "c1")
	assert.Contains(t, []errcode.Code{errcode.NotLeader, errcode.UnavailableInCurrentStatus}, errcode.Of(err), "a follower does not answer")
}

// TestRestoreReplacesTheSessionSet: after a Restore the set pings read is
// the snapshot's sessions, and applies go on changing it.
func TestRestoreReplacesTheSessionSet(t *testing.T) {
	now := time.Now().UnixMilli()
	mount := func(sm *stateMachine, index uint64, client string) {
		r := sm.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: fsm.Encode(&fsm.MountSegment{NowMs: now, ClientID: client,
			Segment: fsm.SegmentSpec{ID: "s-" + client, Name: "n-" + client, Base: index << 32, Size: 1 << 20}})})
		require.NoError(t, r.(fsm.Result).Err)
	}
	src := newStateMachine("cluster", "n0", func() int64 { return now })
	mount(src, 1, "c1")
	mount(src, 2, "c2")
	var buf bytes.Buffer
	require.NoError(t, src.f.Snapshot().Write(&buf, snapshots.Header{AppliedSeq: src.f.AppliedSeq(), RaftIndex: 2, RaftTerm: 1, ClusterID: "cluster", NodeID: "n0"}))

	dst := newStateMachine("cluster", "n1", func() int64 { return now })
	mount(dst, 1, "c9")
	require.NoError(t, dst.Restore(io.NopCloser(&buf)))
	assert.True(t, dst.hasSession("c1"))
	assert.True(t, dst.hasSession("c2"))
	assert.False(t, dst.hasSession("c9"), "gone with the state it had")
	mount(dst, 3, "c3")
	assert.True(t, dst.hasSession("c3"), "applies after the restore are tracked")
}

// TestRestoreEndsWithACollection: once Restore returns, the collector's
// count of the live heap, which sets the heap limit (memlimit.Tune) and
// its pacing, is of the restored state, not of the one before: collecting
// at once then would slow the log's replay, and the stale limit would
// have it collect back to back.
func TestRestoreEndsWithACollection(t *testing.T) {
	now := time.Now().UnixMilli()
	src := newStateMachine("cluster", "n0", func() int64 { return now })
	const clients = 20_000
	for i := range clients {
		c := fmt.Sprintf("client-%05d", i)
		r := src.Apply(&raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: fsm.Encode(&fsm.MountSegment{NowMs: now, ClientID: c,
			Segment: fsm.SegmentSpec{ID: "s-" + c, Name: "n-" + c, Base: uint64(i+1) << 32, Size: 1 << 20}})})
		require.NoError(t, r.(fsm.Result).Err)
	}
	var buf bytes.Buffer
	require.NoError(t, src.f.Snapshot().Write(&buf, snapshots.Header{AppliedSeq: src.f.AppliedSeq(), RaftIndex: clients, RaftTerm: 1, ClusterID: "cluster", NodeID: "n0"}))
	src = nil
	runtime.GC()
	live := func() uint64 {
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	before := live()

	dst := newStateMachine("cluster", "n1", func() int64 { return now })
	require.NoError(t, dst.Restore(io.NopCloser(&buf)))
	after := live()
	grown := after - min(after, before)
	assert.Greater(t, grown, uint64(4<<20), "the live heap counted after the restore: %d B before, %d B more after", before, grown)
	runtime.KeepAlive(dst)
}
