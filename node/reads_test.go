package node

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/service"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func withReadMode(m ReadMode) func(*Config) {
	return func(c *Config) { c.ReadMode = m }
}

// TestReadModes: under a read lease, reads need no quorum round each (a
// background renewal now and then); in quorum mode every read waits for
// one. Both are reported in Status and counted in the metrics. One node:
// what is counted is the rounds, and a three-node cluster's leader could
// lose its leadership to a loaded machine midway through 200 rounds.
func TestReadModes(t *testing.T) {
	for _, tt := range []struct {
		mode      ReadMode
		maxRounds uint64
		minRounds uint64
	}{
		{ReadLease, 10, 1},
		{ReadQuorum, 1 << 20, 200},
	} {
		t.Run(string(tt.mode), func(t *testing.T) {
			c := newCluster(t, 1, time.Hour, withReadMode(tt.mode))
			nd := c.nodes[c.leader()]
			mountSegments(t, nd)
			put(t, nd, "k")
			r0 := nd.leadership.rounds.Load()
			for range 200 {
				_, _, err := nd.GetReplicaList(ctx(t), "k")
				require.NoError(t, err)
			}
			rounds := nd.leadership.rounds.Load() - r0
			assert.LessOrEqual(t, rounds, tt.maxRounds)
			assert.GreaterOrEqual(t, rounds, tt.minRounds)
			st := nd.Status()
			assert.Equal(t, string(tt.mode), st.ReadMode)
			if tt.mode == ReadLease {
				assert.GreaterOrEqual(t, testutil.ToFloat64(nd.metrics.leaseReads), 190.0)
				assert.Positive(t, st.ReadLeaseRemainingMs, "the leader reports the lease it holds")
			} else {
				assert.Zero(t, testutil.ToFloat64(nd.metrics.leaseReads))
				assert.Equal(t, 200.0, testutil.ToFloat64(nd.metrics.quorumReads))
				assert.Zero(t, st.ReadLeaseRemainingMs)
			}
		})
	}
}

// installClock gives n's read lease a clock the test moves; no round may
// run meanwhile.
func installClock(n *Node) *fakeClock {
	clk := &fakeClock{t: time.Now()}
	n.leadership.mu.Lock()
	n.leadership.now = clk.now
	n.leadership.mu.Unlock()
	return clk
}

// TestLapseDuringReadFallsBackToQuorum: a read that began under the lease
// and ended after it lapsed (the process paused between the check and the
// read) is not answered from what it read: a quorum round confirms the
// leadership and the read runs again — no error for the client.
func TestLapseDuringReadFallsBackToQuorum(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	nd := c.nodes[c.leader()]
	clk := installClock(nd)
	require.NoError(t, nd.confirmLeader(ctx(t)))
	_, ok := nd.leadership.lease()
	require.True(t, ok)

	lease0, quorum0, rounds0 := testutil.ToFloat64(nd.metrics.leaseReads), testutil.ToFloat64(nd.metrics.quorumReads), nd.leadership.rounds.Load()
	calls := 0
	require.NoError(t, nd.linearizable(ctx(t), func() error {
		calls++
		if calls == 1 {
			clk.advance(time.Hour) // paused between the lease check and the read
		}
		return nil
	}))
	assert.Equal(t, 2, calls, "read again after a quorum round")
	assert.Equal(t, lease0, testutil.ToFloat64(nd.metrics.leaseReads), "not served under the lapsed lease")
	assert.Equal(t, quorum0+1, testutil.ToFloat64(nd.metrics.quorumReads))
	assert.Equal(t, rounds0+1, nd.leadership.rounds.Load())
}

// TestNoWaitReadsGiveUp: a read the Mooncake protocol's event loop runs
// (under service.NoWait) gives up, without a quorum round or a wait,
// where it would wait — the lease lapsed, a removal of its key in flight,
// on a follower — and is answered where it need not.
func TestNoWaitReadsGiveUp(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	li := c.leader()
	nd := c.nodes[li]
	mountSegments(t, nd)
	put(t, nd, "k")
	clk := installClock(nd)
	require.NoError(t, nd.confirmLeader(ctx(t)))

	read := func(nd *Node, key string) (waited bool, err error) {
		nctx := service.NoWait(ctx(t))
		_, _, err = nd.GetReplicaList(nctx, key)
		return nctx.Waited(), err
	}
	waited, err := read(nd, "k")
	require.NoError(t, err)
	assert.False(t, waited, "under the lease the read is answered")

	endRemoval := nd.gate.closeKey("k")
	waited, _ = read(nd, "k")
	assert.True(t, waited, "a removal of the key is in flight")
	endRemoval()

	rounds := nd.leadership.rounds.Load()
	clk.advance(time.Hour)
	waited, _ = read(nd, "k")
	assert.True(t, waited, "the lease lapsed")
	assert.Equal(t, rounds, nd.leadership.rounds.Load(), "no quorum round for a read that must not wait")

	waited, _ = read(c.nodes[(li+1)%3], "k")
	assert.True(t, waited, "a follower forwards")
}

// TestRestartedNodeVotesOnlyAfterALease: a restarted node has forgotten
// the leader it acknowledged and would grant its vote at once; it must not
// grant one within a read lease of starting, or a leader still serving
// under a lease it helped confirm could be deposed meanwhile.
func TestRestartedNodeVotesOnlyAfterALease(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	c.leader()
	for i := range c.nodes {
		c.stop(i)
	}
	// A fake candidate on n0's address asks n1, restarting alone, for its
	// vote in a far later term with a longer log.
	cand, err := raft.NewTCPTransport(c.cfgs[0].RaftAddr, nil, 2, time.Second, io.Discard)
	require.NoError(t, err)
	defer cand.Close()
	req := &raft.RequestVoteRequest{
		RPCHeader:    raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(c.cfgs[0].ID), Addr: cand.EncodePeer(raft.ServerID(c.cfgs[0].ID), cand.LocalAddr())},
		Term:         1 << 20,
		LastLogIndex: 1 << 40,
		LastLogTerm:  1 << 20,
	}
	started := time.Now()
	type result struct {
		nd  *Node
		err error
	}
	restarted := make(chan result, 1)
	go func() {
		nd, err := Start(context.Background(), c.cfgs[1])
		restarted <- result{nd, err}
	}()
	defer func() {
		r := <-restarted
		require.NoError(t, r.err)
		c.nodes[1] = r.nd // closed by the cluster's cleanup
	}()
	var granted time.Time
	require.Eventually(t, func() bool {
		var resp raft.RequestVoteResponse
		err := cand.RequestVote(raft.ServerID(c.cfgs[1].ID), raft.ServerAddress(c.cfgs[1].RaftAddr), req, &resp)
		if err == nil && resp.Granted {
			granted = time.Now()
			return true
		}
		return false
	}, 15*time.Second, 5*time.Millisecond, "a node with no leader around grants the vote in the end")
	assert.GreaterOrEqual(t, granted.Sub(started), c.cfgs[1].readLease(), "no vote within one read lease of starting")
}

// hammerReads keeps n's read lease in use (and so renewed) until stop.
func hammerReads(t *testing.T, n *Node, key string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			_, _, _ = n.GetReplicaList(rctx, key)
			rcancel()
		}
	})
	return func() { cancel(); wg.Wait() }
}

// TestTransferDropsTheLeaseFirst: by the time any node sees the vote
// request of a leadership transfer (which it grants although it knows a
// leader), the old leader no longer holds its read lease.
func TestTransferDropsTheLeaseFirst(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	old := c.nodes[l]
	mountSegments(t, old)
	put(t, old, "k")
	var seen, heldAtVote atomic.Int32
	for _, nd := range c.nodes {
		nd.raft.RegisterObserver(raft.NewObserver(nil, false, func(o *raft.Observation) bool {
			if rv, ok := o.Data.(raft.RequestVoteRequest); ok && rv.LeadershipTransfer {
				seen.Add(1)
				if _, held := old.leadership.lease(); held {
					heldAtVote.Add(1)
				}
			}
			return false
		}))
	}
	stop := hammerReads(t, old, "k")
	require.Eventually(t, func() bool { _, ok := old.leadership.lease(); return ok }, 5*time.Second, time.Millisecond)
	require.NoError(t, old.TransferLeadership(ctx(t), ""))
	// The transfer returns once this node steps down, which can be before
	// the other follower has the vote request.
	require.Eventually(t, func() bool { return seen.Load() >= 2 }, 5*time.Second, time.Millisecond, "the transfer's vote requests were observed")
	stop()
	assert.Zero(t, heldAtVote.Load(), "the old leader still held its lease when followers were asked to vote")
}

// TestFailedTransferKeepsTheLeaseAway: a transfer that fails may still
// have started the target's election (TimeoutNow), whose vote requests
// followers grant although they know a leader: the old leader takes no
// lease for a while after the failure, and does again later.
func TestFailedTransferKeepsTheLeaseAway(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	nd := c.nodes[l]
	mountSegments(t, nd)
	put(t, nd, "k")
	target := (l + 1) % 3
	c.stop(target)
	stop := hammerReads(t, nd, "k")
	defer stop()
	require.Eventually(t, func() bool { _, ok := nd.leadership.lease(); return ok }, 5*time.Second, time.Millisecond)
	require.Error(t, nd.TransferLeadership(ctx(t), c.cfgs[target].ID), "the target is down")
	for deadline := time.Now().Add(nd.cfg.ElectionTimeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		_, held := nd.leadership.lease()
		require.False(t, held, "a lease right after a failed transfer")
	}
	require.Eventually(t, func() bool { _, ok := nd.leadership.lease(); return ok }, 10*time.Second, 5*time.Millisecond, "the lease comes back")
}

// TestRestoreDropsTheLeaseFirst: a snapshot restore replaces the state
// under the reads; the lease is gone before the state machine starts to.
func TestRestoreDropsTheLeaseFirst(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	put(t, nd, "k")
	var snap bytes.Buffer
	require.NoError(t, nd.SnapshotSave(ctx(t), &snap))

	var restores, heldAtRestore atomic.Int32
	drop := nd.sm.onRestore
	nd.sm.onRestore = func() {
		restores.Add(1)
		if _, held := nd.leadership.lease(); held {
			heldAtRestore.Add(1)
		}
		drop()
	}
	stop := hammerReads(t, nd, "k")
	require.Eventually(t, func() bool { _, ok := nd.leadership.lease(); return ok }, 5*time.Second, time.Millisecond)
	require.NoError(t, nd.SnapshotRestore(ctx(t), &snap))
	stop()
	assert.Equal(t, int32(1), restores.Load())
	assert.Zero(t, heldAtRestore.Load(), "the leader held its lease while its state was replaced")
	_, _, err := nd.GetReplicaList(ctx(t), "k")
	require.NoError(t, err, "reads go on after the restore")
}

// TestNoRaftEntryPerRead: reads add no Raft entry, whether the lease they
// renew has lapsed or is about to; their renewals wait in the batcher, and
// a removal's flush brings them to the log on every node. A soft-pinned
// key's renewal rides the next regular tick.
func TestNoRaftEntryPerRead(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	// Ticks every hour: any entry the reads cause is one they asked for.
	c := newCluster(t, 3, time.Hour, func(cfg *Config) { cfg.Now = clock.Load })
	nd := c.nodes[c.leader()]
	c.addressesRecorded()
	mountSegments(t, nd)
	for i := range 20 {
		put(t, nd, fmt.Sprintf("k%d", i))
	}
	// Past the lease Promote granted every object.
	clock.Add(2 * nd.cfg.Params.LeaseTTLMs)
	index := func() uint64 { return nd.sm.appliedIndex.Load() }
	read := func() {
		for i := range 20 {
			_, _, err := nd.GetReplicaList(ctx(t), fmt.Sprintf("k%d", i))
			require.NoError(t, err)
		}
	}
	// The segments' client pings, or its session would lapse with the clock.
	ping := func() {
		_, err := nd.Ping(ctx(t), "c1")
		require.NoError(t, err)
	}
	ping()
	read()
	// A tick with every renewal: each key now holds a live lease, which
	// the reads below extend while it is about to lapse.
	_, err := nd.tick(ctx(t), true)
	require.NoError(t, err)
	clock.Add(nd.cfg.Params.LeaseTTLMs - 50)
	ping()
	before := index()
	read()
	read()
	time.Sleep(200 * time.Millisecond) // room for an entry, had one been asked for
	assert.Equal(t, before, index(), "no entry for reads, lapsed leases or live ones")
	_, err = nd.tick(ctx(t), false)
	require.NoError(t, err)
	waiting, _ := nd.batcher.Len()
	assert.Equal(t, 20, waiting, "a regular tick leaves them waiting")

	now := clock.Load()
	r, err := nd.Propose(ctx(t), &fsm.Remove{NowMs: now, Key: "k0"})
	require.NoError(t, err)
	assert.Equal(t, errcode.ObjectHasLease, r.Code(), "the removal's flush logged the lease the read returned")
	c.converged()
	for _, f := range c.nodes {
		for i := range 20 {
			l, ok := leaseOf(f, fmt.Sprintf("k%d", i))
			require.True(t, ok)
			assert.Equal(t, now+nd.cfg.Params.LeaseTTLMs, l, "%s k%d: every waiting renewal reached every node", f.cfg.ID, i)
		}
	}

	mustPropose(t, nd, &fsm.PutStart{NowMs: now, Key: "pinned", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c1", SoftPin: true})
	mustPropose(t, nd, &fsm.PutEnd{NowMs: now, Key: "pinned", ClientID: "c1"})
	clock.Add(nd.cfg.Params.LeaseTTLMs)
	_, _, err = nd.GetReplicaList(ctx(t), "pinned")
	require.NoError(t, err)
	_, err = nd.tick(ctx(t), false)
	require.NoError(t, err)
	waiting, _ = nd.batcher.Len()
	assert.Zero(t, waiting, "a soft-pinned key's renewal goes with the next regular tick")
}

// TestFailedFlushKeepsLeases: a flush whose Tick never reached the log
// (its proposal's deadline passed) puts the renewals it took back, so the
// next removal's flush still logs the lease a read returned and the
// removal is refused (RELIABILITY finding 30: a removal broke a lease under
// slow log writes).
func TestFailedFlushKeepsLeases(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	c := newCluster(t, 3, time.Hour, func(cfg *Config) { cfg.Now = clock.Load })
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	put(t, nd, "k")
	// Past the lease Promote granted every object: only the read's holds.
	clock.Add(2 * nd.cfg.Params.LeaseTTLMs)
	_, err := nd.Ping(ctx(t), "c1")
	require.NoError(t, err)
	_, _, err = nd.GetReplicaList(ctx(t), "k")
	require.NoError(t, err)

	expired, cancel := context.WithDeadline(ctx(t), time.Now().Add(-time.Second))
	defer cancel()
	_, err = nd.tick(expired, true)
	require.Error(t, err, "a flush past its deadline is not proposed")
	waiting, _ := nd.batcher.Len()
	assert.Equal(t, 1, waiting, "the renewal it took waits again")

	r, err := nd.Propose(ctx(t), &fsm.Remove{NowMs: clock.Load(), Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, errcode.ObjectHasLease, r.Code(), "the next removal's flush logged the lease the read returned")
}

// leaseOf returns the read lease nd's state gives key.
func leaseOf(nd *Node, key string) (leaseMs int64, ok bool) {
	nd.sm.read(func(f *fsm.FSM) { leaseMs, _, ok = f.Lease(key) })
	return leaseMs, ok
}

// TestUnloggedLeaseSurvivesFailover: a lease the old leader returned and
// never logged holds on the new leader, through its Promote.
func TestUnloggedLeaseSurvivesFailover(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	c := newCluster(t, 3, time.Hour, func(cfg *Config) { cfg.Now = clock.Load })
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "k")
	clock.Add(2 * c.nodes[l].cfg.Params.LeaseTTLMs) // past Promote's lease
	_, g, err := c.nodes[l].GetReplicaList(ctx(t), "k")
	require.NoError(t, err)
	for _, f := range c.nodes {
		l, _ := leaseOf(f, "k")
		require.Less(t, l, clock.Load(), "%s: the read's renewal is in no log", f.cfg.ID)
	}

	target := (l + 1) % 3
	require.NoError(t, c.nodes[l].TransferLeadership(ctx(t), c.cfgs[target].ID))
	require.Eventually(t, c.nodes[target].IsLeader, 5*time.Second, 10*time.Millisecond)
	clock.Add(c.nodes[l].cfg.Params.LeaseTTLMs - 1)
	require.Greater(t, g.UntilMs, clock.Load())
	r, err := c.nodes[target].Propose(ctx(t), &fsm.Remove{NowMs: clock.Load(), Key: "k"})
	require.NoError(t, err)
	assert.Equal(t, errcode.ObjectHasLease, r.Code(), "the lease returned by the old leader holds")
}

// TestBatchReadsInOnePass: a batch read answers each key (found, missing,
// still being written, invalid) with one leadership check for the whole
// batch, and leases what it found.
func TestBatchReadsInOnePass(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	c := newCluster(t, 3, time.Hour, withReadMode(ReadQuorum), func(cfg *Config) { cfg.Now = clock.Load })
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	var keys []string
	for i := range 30 {
		k := fmt.Sprintf("k%d", i)
		put(t, nd, k)
		keys = append(keys, k)
	}
	now := time.Now().UnixMilli()
	mustPropose(t, nd, &fsm.PutStart{NowMs: now, Key: "writing", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c1"})
	keys = append(keys, "missing", "writing", "")
	// Past the lease Promote granted; the renewals the reads below record
	// wait in the batcher.
	clock.Add(2 * nd.cfg.Params.LeaseTTLMs)
	now = clock.Load()
	_, _ = nd.batcher.Drain()

	r0 := nd.leadership.rounds.Load()
	got, err := nd.BatchGetReplicaList(ctx(t), keys)
	require.NoError(t, err)
	assert.Equal(t, r0+1, nd.leadership.rounds.Load(), "one quorum round for the whole batch")
	require.Len(t, got, len(keys))
	for i := range 30 {
		assert.True(t, got[i].Found, keys[i])
		assert.NoError(t, got[i].Err)
		assert.Len(t, got[i].Replicas, 2)
		assert.Greater(t, got[i].Grant.UntilMs, now)
	}
	assert.Equal(t, errcode.ObjectNotFound, errcode.Of(got[30].Err))
	assert.Equal(t, errcode.ReplicaIsNotReady, errcode.Of(got[31].Err))
	assert.Equal(t, errcode.InvalidKey, errcode.Of(got[32].Err))
	renewals, _ := nd.batcher.Len()
	assert.Equal(t, 30, renewals, "every found key's lease is recorded for the next tick")

	ex, err := nd.BatchExistKey(ctx(t), keys)
	require.NoError(t, err)
	assert.Equal(t, r0+2, nd.leadership.rounds.Load())
	for i := range 30 {
		assert.True(t, ex[i].Found)
	}
	assert.False(t, ex[30].Found)
	assert.False(t, ex[31].Found, "an object being written does not exist for readers")
	assert.Equal(t, errcode.InvalidKey, errcode.Of(ex[32].Err))

	f := c.nodes[(c.leader()+1)%3]
	_, err = f.BatchGetReplicaList(ctx(t), keys)
	assert.Equal(t, errcode.NotLeader, errcode.Of(err), "a follower refuses the whole batch")
}

// TestNoLeaseReadBeforeThisTermsPromote: a leader whose Promote was applied
// in an older term (it lost leadership and won it back, and the new
// Promote is not applied yet) serves no read, lease or not, until it is.
func TestNoLeaseReadBeforeThisTermsPromote(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	put(t, nd, "k")
	_, _, err := nd.GetReplicaList(ctx(t), "k")
	require.NoError(t, err)
	_, held := nd.leadership.lease()
	require.True(t, held)

	term := nd.promotedTerm.Load()
	nd.promotedTerm.Store(term - 1) // as if promoted in an earlier term only
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, _, err = nd.GetReplicaList(short, "k")
	assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(err), "%v", err)
	nd.promotedTerm.Store(term)
	_, _, err = nd.GetReplicaList(ctx(t), "k")
	assert.NoError(t, err)
}

// TestLeaderKeepsTheKeyIndex: the leader fills its key index once it has
// served KeyIndexAfter, serving reads through the tree until then, and
// drops it when it steps down; followers keep none, and a new leader
// serves reads through its own.
func TestLeaderKeepsTheKeyIndex(t *testing.T) {
	const after = 3 * time.Second
	c := newCluster(t, 3, time.Hour, func(c *Config) { c.KeyIndexAfter = after })
	l := c.leader()
	indexed := func(n *Node) (on bool) {
		n.sm.read(func(f *fsm.FSM) { on = f.Stats().KeyIndex })
		return on
	}
	mountSegments(t, c.nodes[l])
	for i := range 20 {
		put(t, c.nodes[l], fmt.Sprintf("k%d", i))
	}
	require.False(t, indexed(c.nodes[l]), "the new leader indexed its keys at once")
	_, _, err := c.nodes[l].GetReplicaList(ctx(t), "k0")
	require.NoError(t, err, "a read before the index")
	require.Eventually(t, func() bool { return indexed(c.nodes[l]) }, after+5*time.Second, 10*time.Millisecond, "the leader's index fills")
	for i, n := range c.nodes {
		if i != l {
			assert.False(t, indexed(n), "%s is a follower", n.cfg.ID)
		}
	}

	target := (l + 1) % 3
	require.NoError(t, c.nodes[l].TransferLeadership(ctx(t), c.cfgs[target].ID))
	require.Eventually(t, c.nodes[target].IsLeader, 5*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return indexed(c.nodes[target]) && !indexed(c.nodes[l]) }, after+5*time.Second, 10*time.Millisecond,
		"the new leader indexes, the old one drops its index")
	put(t, c.nodes[target], "after")
	for _, k := range []string{"k0", "k19", "after"} {
		reps, _, err := c.nodes[target].GetReplicaList(ctx(t), k)
		require.NoError(t, err, k)
		assert.Len(t, reps, 2, k)
	}
}
