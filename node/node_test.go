package node

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/cmd/node/serve"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type cluster struct {
	t     testing.TB
	cfgs  []Config
	nodes []*Node
}

func freeAddr(t testing.TB) string {
	a, err := freeport.Addr()
	require.NoError(t, err)
	return a
}

// newCluster starts n bootstrapped nodes on loopback with short timeouts.
// tick is the leader's tick interval (an hour freezes time-driven entries so
// the log goes quiet and indexes can be compared).
func newCluster(t testing.TB, n int, tick time.Duration, opts ...func(*Config)) *cluster {
	return newClusterWithout(t, n, -1, tick, opts...)
}

// newClusterWithout is newCluster with node absent (if >= 0) configured
// but not started: c.start(absent) starts it for the first time.
func newClusterWithout(t testing.TB, n, absent int, tick time.Duration, opts ...func(*Config)) *cluster {
	c := &cluster{t: t}
	var peers []raftstore.Peer
	for i := 0; i < n; i++ {
		peers = append(peers, raftstore.Peer{ID: fmt.Sprintf("n%d", i), RaftAddr: freeAddr(t)})
	}
	for i := 0; i < n; i++ {
		cfg := DefaultConfig()
		cfg.ID = peers[i].ID
		cfg.RaftAddr = peers[i].RaftAddr
		cfg.GRPCAddr = freeAddr(t)
		cfg.DataDir = t.TempDir()
		cfg.Bootstrap = true
		cfg.Peers = peers
		cfg.Tick = tick
		// Short enough for quick elections, long enough that a loaded
		// 2-core CI machine running other packages does not depose leaders.
		cfg.HeartbeatTimeout = 500 * time.Millisecond
		cfg.ElectionTimeout = 500 * time.Millisecond
		cfg.LeaderLeaseTimeout = 250 * time.Millisecond
		// Reads go through the key index, as on a leader that has served
		// a while, not through the tree of its first seconds.
		cfg.KeyIndexAfter = 0
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: cfg.ID, Level: hclog.Warn})
		cfg.Listen = listen
		for _, o := range opts {
			o(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	// Concurrently: each node waits out a read lease before starting Raft.
	c.nodes = make([]*Node, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		if i != absent {
			wg.Go(func() { c.nodes[i], errs[i] = Start(context.Background(), c.cfgs[i]) })
		}
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			if nd != nil {
				_ = nd.Close()
			}
		}
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
	return c
}

// addressesRecorded waits until the replicated state of every running node
// holds every running node's client address: the Member entries that
// announce them are written once, shortly after a leader is known, and
// tests that count log entries wait them out first.
func (c *cluster) addressesRecorded() {
	c.t.Helper()
	require.Eventually(c.t, func() bool {
		for _, nd := range c.nodes {
			if nd == nil {
				continue
			}
			var addrs map[string]string
			nd.sm.read(func(f *fsm.FSM) { addrs = f.MemberAddrs() })
			for i, other := range c.nodes {
				if other != nil && addrs[c.cfgs[i].ID] != c.cfgs[i].GRPCAddr {
					return false
				}
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "client addresses not recorded")
}

func (c *cluster) start(i int) {
	nd, err := Start(context.Background(), c.cfgs[i])
	require.NoError(c.t, err)
	if i < len(c.nodes) {
		c.nodes[i] = nd
	} else {
		c.nodes = append(c.nodes, nd)
	}
}

func (c *cluster) stop(i int) {
	require.NoError(c.t, c.nodes[i].Close())
	c.nodes[i] = nil
}

// leader waits for a promoted leader and returns its index.
func (c *cluster) leader() int {
	c.t.Helper()
	var idx int
	require.Eventually(c.t, func() bool {
		idx = -1
		for i, nd := range c.nodes {
			if nd != nil && nd.IsLeader() {
				idx = i
			}
		}
		return idx >= 0
	}, 10*time.Second, 10*time.Millisecond, "no leader promoted")
	return idx
}

// converged waits until every running node has applied the same index and
// then checks that they hold the same digest there.
func (c *cluster) converged() string {
	c.t.Helper()
	return c.convergedWithin(10 * time.Second)
}

func (c *cluster) convergedWithin(d time.Duration) string {
	c.t.Helper()
	var digest string
	require.Eventually(c.t, func() bool {
		// The furthest node is held still and the others are caught as
		// they reach its index, each then held too: with ticks and export
		// acknowledgements applied every few ms, statuses taken one after
		// another would rarely meet at one index.
		var lead *Node
		for _, nd := range c.nodes {
			if nd != nil && (lead == nil || nd.sm.appliedIndex.Load() > lead.sm.appliedIndex.Load()) {
				lead = nd
			}
		}
		lead.sm.mu.RLock()
		defer lead.sm.mu.RUnlock()
		index := lead.sm.appliedIndex.Load()
		states := []*fsm.FSM{lead.sm.f}
		for _, nd := range c.nodes {
			if nd == nil || nd == lead {
				continue
			}
			for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
				nd.sm.mu.RLock()
				at := nd.sm.appliedIndex.Load()
				if at == index {
					defer nd.sm.mu.RUnlock()
					break
				}
				nd.sm.mu.RUnlock()
				if at > index || time.Now().After(deadline) {
					return false
				}
			}
			states = append(states, nd.sm.f)
		}
		first := states[0].Digest()
		for _, f := range states[1:] {
			require.Equal(c.t, first, f.Digest(), "equal applied index %d but different digests", index)
		}
		digest = hex.EncodeToString(first[:])
		return true
	}, d, 20*time.Millisecond, "nodes did not converge")
	return digest
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustPropose(t *testing.T, nd *Node, cmd fsm.Command) fsm.Result {
	t.Helper()
	r, err := nd.Propose(ctx(t), cmd)
	require.NoError(t, err)
	require.NoError(t, r.Err)
	return r
}

func put(t *testing.T, nd *Node, key string) {
	t.Helper()
	now := time.Now().UnixMilli()
	mustPropose(t, nd, &fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{1024}, ReplicaNum: 2, ClientID: "c1"})
	mustPropose(t, nd, &fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"})
}

// put is put on whichever node leads: an overloaded machine may move the
// leadership between two calls. NOT_LEADER is a refusal before anything
// was applied, safe to retry; after OUTCOME_UNKNOWN the retried PutStart
// finds the key already there if the lost one was applied (PutEnd is
// idempotent).
func (c *cluster) put(t *testing.T, key string) {
	t.Helper()
	now := time.Now().UnixMilli()
	for _, cmd := range []fsm.Command{
		&fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{1024}, ReplicaNum: 2, ClientID: "c1"},
		&fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"},
	} {
		var r fsm.Result
		unknown := false
		require.Eventually(t, func() bool {
			var err error
			r, err = c.nodes[c.leader()].Propose(ctx(t), cmd)
			switch errcode.Of(err) {
			case errcode.NotLeader:
				return false
			case errcode.OutcomeUnknown:
				unknown = true
				return false
			}
			require.NoError(t, err)
			return true
		}, 10*time.Second, 10*time.Millisecond, "no leader took %s", key)
		if unknown && errcode.Of(r.Err) == errcode.ObjectAlreadyExists {
			continue
		}
		require.NoError(t, r.Err)
	}
}

func mountSegments(t *testing.T, nd *Node) {
	for i := 0; i < 3; i++ {
		mustPropose(t, nd, &fsm.MountSegment{NowMs: time.Now().UnixMilli(), ClientID: "c1",
			Segment: fsm.SegmentSpec{ID: fmt.Sprintf("s%d", i), Name: fmt.Sprintf("host%d", i), Base: uint64(i) << 40, Size: 1 << 30}})
	}
}

func TestBootstrapReplicateAndRedirect(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	for i := 0; i < 50; i++ {
		put(t, c.nodes[l], fmt.Sprintf("k%d", i))
	}
	c.converged()
	for i, nd := range c.nodes {
		st := nd.Status()
		assert.Equal(t, 50, int(st.Objects), "node %d", i)
		assert.GreaterOrEqual(t, st.LastLogIndex, st.CommitIndex, "node %d's log holds what it committed", i)
		if i == l {
			assert.Zero(t, st.LastContactMs, "a leader reports no contact")
			continue
		}
		assert.True(t, st.LastContactMs >= 0 && st.LastContactMs < time.Second.Milliseconds(),
			"follower %d heard from its leader within a second, not %d ms ago", i, st.LastContactMs)
		_, err := nd.Propose(ctx(t), &fsm.RemoveAll{NowMs: time.Now().UnixMilli(), Force: true})
		assert.Equal(t, errcode.NotLeader, errcode.Of(err), "a follower redirects writes")
		assert.Contains(t, err.Error(), c.cfgs[l].GRPCAddr, "NOT_LEADER names the leader's client address")
		_, _, err = nd.GetReplicaList(ctx(t), "k1")
		assert.Equal(t, errcode.NotLeader, errcode.Of(err), "and reads")
	}
}

func TestLinearizableReadsAndLeases(t *testing.T) {
	c := newCluster(t, 3, 50*time.Millisecond)
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	put(t, nd, "k")
	descs, g, err := nd.GetReplicaList(ctx(t), "k")
	require.NoError(t, err, "a write acknowledged is readable at once")
	assert.Len(t, descs, 2)
	assert.Greater(t, g.UntilMs, time.Now().UnixMilli())
	// The lease just returned blocks an unforced remove, although the
	// renewal had not been ticked yet: the removal flushes it first.
	r, err := nd.Propose(ctx(t), &fsm.Remove{NowMs: time.Now().UnixMilli(), Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, errcode.ObjectHasLease, r.Code())
	ok, _, err := nd.ExistKey(ctx(t), "k")
	require.NoError(t, err)
	assert.True(t, ok)
	r, err = nd.Propose(ctx(t), &fsm.Remove{NowMs: time.Now().UnixMilli(), Key: "k", Force: true})
	require.NoError(t, err)
	require.NoError(t, r.Err)
	_, _, err = nd.GetReplicaList(ctx(t), "k")
	assert.Equal(t, errcode.ObjectNotFound, errcode.Of(err))

	remount, err := nd.Ping(ctx(t), "c1")
	require.NoError(t, err)
	assert.False(t, remount)
	remount, err = nd.Ping(ctx(t), "stranger")
	require.NoError(t, err)
	assert.True(t, remount, "a client without a session must remount")
}

func TestLeadershipTransfer(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "before")
	target := (l + 1) % 3
	assert.Equal(t, errcode.InvalidParams, errcode.Of(c.nodes[l].TransferLeadership(ctx(t), c.cfgs[l].ID)), "to itself")
	require.NoError(t, c.nodes[l].TransferLeadership(ctx(t), c.cfgs[target].ID))
	require.Eventually(t, c.nodes[target].IsLeader, 5*time.Second, 10*time.Millisecond)
	put(t, c.nodes[target], "after")
	c.converged()
	assert.Equal(t, 2, int(c.nodes[l].Status().Objects))
	assert.Equal(t, c.cfgs[target].GRPCAddr, c.nodes[l].Status().LeaderGRPCAddr, "the new leader's Promote reached the old one")
}

// TestLeadershipTransferWithoutPeer: a lone node says there is nobody to
// hand leadership to, instead of raft's "cannot find peer".
func TestLeadershipTransferWithoutPeer(t *testing.T) {
	c := newCluster(t, 1, time.Hour)
	l := c.leader()
	err := c.nodes[l].TransferLeadership(ctx(t), "")
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", err)
	assert.ErrorContains(t, err, "no other voter")
	assert.True(t, c.nodes[l].IsLeader())
}

// TestFollowerWaitsOutElection: a request that reaches a follower while the
// leader is gone is held through the election and then sent to the new
// leader (or served, if that follower won) — not bounced back to the dead
// leader or refused while the client could simply wait.
func TestFollowerWaitsOutElection(t *testing.T) {
	c := newCluster(t, 3, 50*time.Millisecond)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	c.stop(l)
	f := (l + 1) % 3
	// Past half a heartbeat timeout the old leader is suspect; the margin
	// covers a last heartbeat still in flight when it stopped. Before a
	// whole one, no election can have ended yet.
	time.Sleep(c.cfgs[f].HeartbeatTimeout * 3 / 4)
	start := time.Now()
	_, err := c.nodes[f].Propose(ctx(t), &fsm.MountSegment{NowMs: time.Now().UnixMilli(), ClientID: "c2",
		Segment: fsm.SegmentSpec{ID: "s9", Name: "host9", Base: 9 << 40, Size: 1 << 30}})
	if errcode.Of(err) == errcode.UnavailableInCurrentStatus {
		// Only a slow election (a loaded machine) may outlast the hold,
		// and then the request was held for the whole bound.
		bound := 2 * (c.cfgs[f].HeartbeatTimeout + c.cfgs[f].ElectionTimeout)
		require.GreaterOrEqual(t, time.Since(start), bound, "refused without waiting out the election: %v", err)
		return
	}
	if err == nil {
		return // f won the election and served the request
	}
	require.Equal(t, errcode.NotLeader, errcode.Of(err), "%v", err)
	other := 3 - l - f
	assert.Contains(t, err.Error(), c.cfgs[other].GRPCAddr, "sent to the new leader, not the dead one (%s)", c.cfgs[l].GRPCAddr)
}

// TestPingDoesNotWaitOutElection: a ping that reaches a node with no
// promoted leader is answered at once, not held like other calls: its
// client pings again within a second, and thousands held then let go
// together would crowd the new leader.
func TestPingDoesNotWaitOutElection(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	f := (l + 1) % 3
	c.stop(l)
	c.stop(3 - l - f) // no quorum: no election can end
	time.Sleep(c.cfgs[f].HeartbeatTimeout * 3 / 4)
	bound := 2 * (c.cfgs[f].HeartbeatTimeout + c.cfgs[f].ElectionTimeout)
	start := time.Now()
	_, err := c.nodes[f].Ping(ctx(t), "c1")
	elapsed := time.Since(start)
	require.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(err), "%v", err)
	assert.Less(t, elapsed, bound/4, "answered at once, not held for the election (up to %v)", bound)
}

func TestRestartWithDataDir(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "a")
	f := (l + 1) % 3
	c.stop(f)
	put(t, c.nodes[l], "b")
	c.start(f) // same config: existing state, no second bootstrap
	put(t, c.nodes[l], "c")
	c.converged()
	assert.Equal(t, 3, int(c.nodes[f].Status().Objects))
}

// TestRestartKeepsItsLogToApply: a follower restarted on its data dir
// with entries after its snapshot has the log's check keep them for raft's
// own reads (its start's log line says how many), forgets them once they
// are applied, and ends with the others' state.
func TestRestartKeepsItsLogToApply(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "a")
	c.converged()
	f := (l + 1) % 3
	require.NoError(t, c.nodes[f].raft.Snapshot().Error())
	put(t, c.nodes[l], "b")
	put(t, c.nodes[l], "c")
	c.converged()
	c.stop(f)
	var logged syncBuf
	c.cfgs[f].Logger = hclog.New(&hclog.LoggerOptions{Name: c.cfgs[f].ID, Level: hclog.Info, Output: &logged})
	c.start(f)
	assert.Regexp(t, `raft log store opened.* kept_to_apply=[1-9]`, logged.String())
	require.Eventually(t, func() bool { return c.nodes[f].store.Kept() == 0 }, 10*time.Second, 20*time.Millisecond,
		"the kept entries forgotten once applied")
	c.converged()
	assert.Equal(t, 3, int(c.nodes[f].Status().Objects))
}

// TestLeadsWithPeer: the transport holds an append to a refusing peer
// only while this node leads the append's term with the peer a member.
func TestLeadsWithPeer(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	f := (l + 1) % 3
	term := c.nodes[l].raft.CurrentTerm()
	peer := raft.ServerID(c.cfgs[f].ID)
	assert.True(t, c.nodes[l].leadsWithPeer(term, peer), "the leader, in its term, of a member")
	assert.False(t, c.nodes[l].leadsWithPeer(term+1, peer), "another term")
	assert.False(t, c.nodes[l].leadsWithPeer(term, "n9"), "a peer not in the configuration")
	assert.False(t, c.nodes[f].leadsWithPeer(c.nodes[f].raft.CurrentTerm(), raft.ServerID(c.cfgs[l].ID)), "a follower")
}

// TestLogStoreKeptAndMigrated: a cluster on BoltDB logs; a follower
// restarted with the other store named is refused, migrated offline it
// rejoins on the WAL and catches up, a cluster of mixed stores.
func TestLogStoreKeptAndMigrated(t *testing.T) {
	c := newCluster(t, 3, time.Hour, func(cfg *Config) { cfg.RaftLogStore = raftstore.LogStoreBoltDB })
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "a")
	f := (l + 1) % 3
	c.stop(f)
	put(t, c.nodes[l], "b")

	c.cfgs[f].RaftLogStore = raftstore.LogStoreWAL
	_, err := Start(context.Background(), c.cfgs[f])
	require.Error(t, err)
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
	assert.Contains(t, err.Error(), "holds a boltdb Raft log, not wal")

	n, err := raftstore.MigrateLogStore(ctx(t), c.cfgs[f].DataDir, raftstore.LogStoreWAL)
	require.NoError(t, err)
	assert.Positive(t, n)
	c.cfgs[f].RaftLogStore = "" // whatever the data dir holds
	c.start(f)
	put(t, c.nodes[l], "c")
	c.converged()
	assert.Equal(t, 3, int(c.nodes[f].Status().Objects))
	ls, err := raftstore.DetectLogStore(c.cfgs[f].DataDir)
	require.NoError(t, err)
	assert.Equal(t, raftstore.LogStoreWAL, ls)
}

func TestLeaderLossKeepsAcknowledgedWrites(t *testing.T) {
	c := newCluster(t, 3, 50*time.Millisecond)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	for i := 0; i < 20; i++ {
		put(t, c.nodes[l], fmt.Sprintf("k%d", i))
	}
	c.stop(l)
	nl := c.leader()
	require.NotEqual(t, l, nl)
	for i := 0; i < 20; i++ {
		_, _, err := c.nodes[nl].GetReplicaList(ctx(t), fmt.Sprintf("k%d", i))
		require.NoError(t, err, "acknowledged k%d survives the leader", i)
	}
	put(t, c.nodes[nl], "after")
	c.start(l)
	require.Eventually(t, func() bool { return c.nodes[l].Status().Objects == 21 }, 10*time.Second, 20*time.Millisecond)
}

func TestSnapshotAndRestoreThroughRaft(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "a")
	require.NoError(t, c.nodes[l].raft.Snapshot().Error())
	f := (l + 1) % 3
	c.converged()
	require.NoError(t, c.nodes[f].raft.Snapshot().Error()) // restored when it starts again
	c.stop(f)
	put(t, c.nodes[l], "b")
	require.NoError(t, c.nodes[l].raft.Snapshot().Error())
	c.start(f)
	c.converged()
	assert.Equal(t, 2, int(c.nodes[f].Status().Objects))

	// What the restore took is in the metrics: the time, and within it
	// its own CPU.
	r := c.nodes[f].sm.lastRestore.Load()
	require.NotNil(t, r, "the follower restored a snapshot")
	assert.Equal(t, uint64(1), r.hdr.Objects, "its own, of one object")
	mfs, err := c.nodes[f].Registry().Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "moonraft_snapshot_restore_") {
			got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	took, cpu := got["moonraft_snapshot_restore_seconds"], got["moonraft_snapshot_restore_cpu_seconds"]
	assert.Equal(t, r.took.Seconds(), took)
	assert.Positive(t, took)
	if runtime.GOOS == "linux" {
		assert.Positive(t, cpu)
	}
	assert.LessOrEqual(t, cpu, took)
}

// TestJoin: a fresh node given --join of any member is added as a voter,
// catches up, and takes part in the quorum.
func TestJoin(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "before-join")
	cfg := c.cfgs[0]
	cfg.ID, cfg.RaftAddr, cfg.GRPCAddr, cfg.DataDir = "n3", freeAddr(t), freeAddr(t), t.TempDir()
	cfg.Bootstrap, cfg.Peers = false, nil
	cfg.Join = c.cfgs[(l+1)%3].GRPCAddr // a follower: the join follows NOT_LEADER
	c.cfgs = append(c.cfgs, cfg)
	c.start(3)
	members, err := c.nodes[l].Members(ctx(t))
	require.NoError(t, err)
	assert.Len(t, members, 4)
	put(t, c.nodes[l], "after-join")
	c.converged()
	assert.Equal(t, 2, int(c.nodes[3].Status().Objects))
	// Restarted, it rejoins from its data dir without joining again.
	c.stop(3)
	c.start(3)
	assert.True(t, c.nodes[3].HadState())
	c.converged()

	// Every node names every member's client address: the bootstrapped
	// ones announced theirs, the joiner gave its own.
	want := map[string]string{}
	for _, cfg := range c.cfgs {
		want[cfg.ID] = cfg.GRPCAddr
	}
	for i := range c.nodes {
		require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, memberAddrs(t, c.nodes[i])) },
			10*time.Second, 50*time.Millisecond, "node %s: %v", c.cfgs[i].ID, memberAddrs(t, c.nodes[i]))
	}
	// A removed member is forgotten.
	require.NoError(t, c.nodes[l].RemoveServer(ctx(t), "n3"))
	c.stop(3)
	delete(want, "n3")
	for i := range 3 {
		require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, memberAddrs(t, c.nodes[i])) },
			10*time.Second, 50*time.Millisecond, "node %s: %v", c.cfgs[i].ID, memberAddrs(t, c.nodes[i]))
	}
	c.converged()
	for i := range 3 {
		var addrs map[string]string
		c.nodes[i].sm.read(func(f *fsm.FSM) { addrs = f.MemberAddrs() })
		assert.Equal(t, want, addrs, "node %s: the replicated state forgot n3 too", c.cfgs[i].ID)
	}
}

// memberAddrs is what Members says of each member's client address.
func memberAddrs(t *testing.T, nd *Node) map[string]string {
	ms, err := nd.Members(ctx(t))
	require.NoError(t, err)
	out := map[string]string{}
	for _, m := range ms {
		out[m.ID] = m.GRPCAddr
	}
	return out
}

func TestHTTPHealth(t *testing.T) {
	c := newCluster(t, 1, time.Hour)
	h := serve.HTTPHandler(c.nodes[c.leader()], false)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	assert.Equal(t, 200, rec.Code)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	assert.Contains(t, rec.Body.String(), `"role":"leader"`)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	assert.Equal(t, "ok\n", rec.Body.String())
}

func TestConfigValidation(t *testing.T) {
	base := DefaultConfig()
	base.ID, base.DataDir, base.RaftAddr = "n0", t.TempDir(), "127.0.0.1:0"
	tests := []struct {
		name string
		mod  func(*Config)
	}{
		{"no id", func(c *Config) { c.ID = "" }},
		{"no data dir", func(c *Config) { c.DataDir = "" }},
		{"no raft addr", func(c *Config) { c.RaftAddr = "" }},
		{"zero tick", func(c *Config) { c.Tick = 0 }},
		{"negative export linger", func(c *Config) { c.ExportLinger = -time.Millisecond }},
		{"negative key index delay", func(c *Config) { c.KeyIndexAfter = -time.Millisecond }},
		{"bootstrap without peers", func(c *Config) { c.Bootstrap = true }},
		{"bootstrap without self", func(c *Config) { c.Bootstrap, c.Peers = true, []raftstore.Peer{{ID: "x", RaftAddr: "127.0.0.1:1"}} }},
		{"bad params", func(c *Config) { c.Params.LeaseTTLMs = 0 }},
		{"tls ca without a certificate", func(c *Config) { c.TLS.CA = "ca.pem" }},
		{"tls cert without a key", func(c *Config) { c.TLS.Cert = "n0.pem" }},
		{"http tls without a certificate", func(c *Config) { c.HTTPTLS = true }},
		{"unreadable certificate", func(c *Config) { c.TLS.Cert, c.TLS.Key = "/nonexistent.pem", "/nonexistent-key.pem" }},
		{"bad limits", func(c *Config) { c.Limits.MaxBatch = -1 }},
		{"regex limit over the state machine's", func(c *Config) { c.Limits.MaxRegexLen = fsm.MaxRegexLen + 1 }},
		{"unknown read mode", func(c *Config) { c.ReadMode = "fast" }},
		{"negative read lease", func(c *Config) { c.ReadLease = -time.Second }},
		{"read lease beyond the heartbeat timeout's bound", func(c *Config) { c.ReadLease = c.HeartbeatTimeout }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			tt.mod(&cfg)
			_, err := New(context.Background(), cfg)
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", err)
		})
	}
}

func TestProposeBatch(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	c.addressesRecorded()
	nd := c.nodes[l]
	mountSegments(t, nd)
	now := time.Now().UnixMilli()
	var cmds []fsm.Command
	for i := 0; i < 50; i++ {
		key := fmt.Sprintf("b%d", i)
		cmds = append(cmds, &fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{64}, ReplicaNum: 1, ClientID: "c1"},
			&fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"})
	}
	before := nd.Status().AppliedIndex
	rs, err := nd.ProposeBatch(ctx(t), cmds)
	require.NoError(t, err)
	require.Len(t, rs, 100)
	for _, r := range rs {
		require.NoError(t, r.Err)
	}
	assert.Equal(t, before+1, nd.Status().AppliedIndex, "one log entry for the whole batch")
	c.converged()
	_, err = nd.ProposeBatch(ctx(t), []fsm.Command{&fsm.RemoveAll{Force: true}})
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "removals are not batched: they need the lease flush")
	_, err = c.nodes[(l+1)%3].ProposeBatch(ctx(t), cmds[:1])
	assert.Equal(t, errcode.NotLeader, errcode.Of(err))
}

// TestRaftDial: nodes reach each other through the dial overrides (here a
// plain TCP relay per directed link) while the configuration keeps the
// advertised addresses; cutting the relays cuts the links.
func TestRaftDial(t *testing.T) {
	var relays []*relay
	c := newCluster(t, 3, time.Hour, func(cfg *Config) {
		cfg.RaftDial = map[string]string{}
		for _, p := range cfg.Peers {
			if p.ID != cfg.ID {
				r := newRelay(t, p.RaftAddr)
				relays = append(relays, r)
				cfg.RaftDial[p.ID] = r.addr
			}
		}
	})
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	put(t, nd, "k")
	c.converged()
	var used int64
	for _, r := range relays {
		used += r.conns.Load()
	}
	assert.Positive(t, used, "Raft traffic went through the relays")
	members, err := nd.Members(ctx(t))
	require.NoError(t, err)
	for _, m := range members {
		assert.NotContains(t, relayAddrs(relays), m.RaftAddr, "the configuration keeps advertised addresses")
	}
}

// relay forwards TCP connections to a target, counting them.
type relay struct {
	addr  string
	conns atomic.Int64
}

func newRelay(t testing.TB, target string) *relay {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &relay{addr: l.Addr().String()}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			r.conns.Add(1)
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return r
}

func relayAddrs(rs []*relay) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.addr)
	}
	return out
}

// TestHTTPTLSNeedsACertificate: the listeners refuse HTTP over TLS on a
// node without a certificate with a clear error, and open nothing.
func TestHTTPTLSNeedsACertificate(t *testing.T) {
	c := newCluster(t, 1, time.Hour)
	addr := freeAddr(t)
	_, err := serve.Open(c.nodes[c.leader()], serve.Config{HTTPAddr: addr, HTTPTLS: true})
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", err)
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err, "the address was let go")
	_ = l.Close()
}

func TestPprofOptIn(t *testing.T) {
	c := newCluster(t, 1, time.Hour)
	nd := c.nodes[c.leader()]
	rec := httptest.NewRecorder()
	serve.HTTPHandler(nd, false).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
	assert.Equal(t, 404, rec.Code, "off by default")
	rec = httptest.NewRecorder()
	serve.HTTPHandler(nd, true).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
	assert.Equal(t, 200, rec.Code)
}

func TestRaftErrShutdownAfterProposal(t *testing.T) {
	c := newCluster(t, 1, time.Hour)
	nd := c.nodes[c.leader()]
	assert.Equal(t, errcode.OutcomeUnknown, errcode.Of(nd.raftErr(raft.ErrRaftShutdown, true)),
		"a proposed write cut off by shutdown may have committed")
	assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(nd.raftErr(raft.ErrRaftShutdown, false)))
	// The new leader may still be applying its own entries (the member
	// record after its promotion): bracket Progress between two Statuses.
	before := nd.Status().AppliedIndex
	p := nd.Progress()
	after := nd.Status().AppliedIndex
	assert.Empty(t, p.Digest, "Progress skips the digests")
	assert.True(t, before <= p.AppliedIndex && p.AppliedIndex <= after,
		"Progress's applied index %d is between the Statuses' %d and %d", p.AppliedIndex, before, after)
}

// TestHaltOnEntryFromNewerRelease: a committed entry this build cannot
// decode (a command of a newer leader) stops every node that meets it —
// it applies nothing after it, takes no snapshot, and says what to do —
// and a restart on the same build stops at the same entry again.
func TestHaltOnEntryFromNewerRelease(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "before")
	c.converged()
	unknown := []byte{0x7e, 1, 2, 3} // a type this build does not know, without the ignorable bit
	require.NoError(t, c.nodes[l].raft.Apply(unknown, 5*time.Second).Error())
	for i, nd := range c.nodes {
		select {
		case <-nd.Halted():
		case <-time.After(10 * time.Second):
			t.Fatalf("node %d did not halt", i)
		}
		err := nd.HaltErr()
		assert.Equal(t, errcode.InvalidVersion, errcode.Of(err), "node %d", i)
		assert.Contains(t, err.Error(), "run the release the leader runs")
	}
	halted := c.nodes[l].Status().AppliedIndex
	f := c.nodes[l].raft.Apply(fsm.Encode(&fsm.RemoveAll{NowMs: time.Now().UnixMilli(), Force: true}), 5*time.Second)
	require.NoError(t, f.Error(), "Raft still commits")
	assert.Equal(t, errcode.InvalidVersion, errcode.Of(f.Response().(fsm.Result).Err), "but the entry is not applied")
	assert.Equal(t, halted, c.nodes[l].Status().AppliedIndex)
	assert.Equal(t, 1, int(c.nodes[l].Status().Objects), "the state stays where it stopped")
	assert.Error(t, c.nodes[l].raft.Snapshot().Error(), "no snapshot of a halted state")

	c.stop(l)
	c.start(l)
	select {
	case <-c.nodes[l].Halted():
	case <-time.After(10 * time.Second):
		t.Fatal("a restarted node skipped the entry it cannot apply")
	}
}

// TestGracefulUnmountThroughTheLeader: the leader drains a segment on its
// own once nothing on it is leased, and an upsert goes through the lease
// flush like a remove.
func TestGracefulUnmountThroughTheLeader(t *testing.T) {
	c := newCluster(t, 3, 50*time.Millisecond, func(cfg *Config) { cfg.Params.LeaseTTLMs = 300 })
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	put(t, nd, "k")
	time.Sleep(400 * time.Millisecond) // past the promotion's lease on every object
	now := time.Now().UnixMilli()
	r := mustPropose(t, nd, &fsm.UpsertStart{PutStart: fsm.PutStart{NowMs: now, Key: "k", SliceLengths: []uint64{2048}, ReplicaNum: 2, ClientID: "c1"}})
	require.Len(t, r.Replicas, 2)
	mustPropose(t, nd, &fsm.PutEnd{NowMs: now, Key: "k", ClientID: "c1"})
	read, _, err := nd.GetReplicaList(ctx(t), "k")
	require.NoError(t, err)
	r, err = nd.Propose(ctx(t), &fsm.UpsertStart{PutStart: fsm.PutStart{NowMs: time.Now().UnixMilli(), Key: "k", SliceLengths: []uint64{2048}, ReplicaNum: 2, ClientID: "c1"}, Copy: true})
	require.NoError(t, err)
	require.NoError(t, r.Err)
	readAt := map[uint64]bool{}
	for _, rd := range read {
		readAt[rd.Buffers[0].Address] = true
	}
	for _, rd := range r.Replicas {
		assert.False(t, readAt[rd.Buffers[0].Address], "the lease the read returned reached the log first: the upsert writes a fresh copy")
	}
	mustPropose(t, nd, &fsm.PutEnd{NowMs: time.Now().UnixMilli(), Key: "k", ClientID: "c1"})
	put(t, nd, "other")
	_, _, err = nd.GetReplicaList(ctx(t), "other")
	require.NoError(t, err)
	rs, err := nd.ProposeBatch(ctx(t), []fsm.Command{&fsm.Remove{NowMs: time.Now().UnixMilli(), Key: "other"}})
	require.NoError(t, err)
	assert.Equal(t, errcode.ObjectHasLease, rs[0].Code(), "a batched remove flushes leases too")

	mustPropose(t, nd, &fsm.GracefulUnmount{NowMs: time.Now().UnixMilli(), ClientID: "c1", SegmentID: "s0", GraceMs: 60_000})
	for i, n := range c.nodes {
		require.Eventually(t, func() bool {
			var err error
			n.sm.read(func(f *fsm.FSM) { _, err = f.SegmentStatus("s0", false) })
			return errcode.Of(err) == errcode.SegmentNotFound
		}, 15*time.Second, 50*time.Millisecond, "node %d: the idle draining segment was not unmounted", i)
	}
}

// TestRebootstrapRefused: a member whose data dir was lost is refused when
// started again with --bootstrap (it would have forgotten its vote), with
// an error that says how to rejoin, and that way back works; a member
// starting for the first time after the others formed the cluster is not
// refused.
func TestRebootstrapRefused(t *testing.T) {
	const late = 2
	c := newClusterWithout(t, 3, late, time.Hour, withEtcd(testEtcd(t)))
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "k1")
	c.start(late)
	c.converged()

	f := (l + 1) % 3
	c.stop(f)
	c.cfgs[f].DataDir = t.TempDir() // the disk was replaced
	_, err := Start(context.Background(), c.cfgs[f])
	require.Error(t, err)
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", err)
	assert.ErrorContains(t, err, "forgotten its vote")
	assert.ErrorContains(t, err, "members remove "+c.cfgs[f].ID)

	require.NoError(t, c.nodes[l].RemoveServer(ctx(t), c.cfgs[f].ID))
	c.cfgs[f].Bootstrap, c.cfgs[f].Peers, c.cfgs[f].Join = false, nil, c.cfgs[l].GRPCAddr
	c.start(f)
	c.converged()
	assert.Equal(t, 1, int(c.nodes[f].Status().Objects))
}
