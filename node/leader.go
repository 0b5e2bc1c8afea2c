package node

import (
	"context"
	"sync"
	"time"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/lease"
)

// monitorLeadership starts the leader loop when this node becomes leader
// and stops it when it is not any more.
func (n *Node) monitorLeadership(ctx context.Context) {
	var stop context.CancelFunc
	done := make(chan struct{})
	close(done)
	stopLeading := func() {
		if stop != nil {
			stop()
			<-done
			stop = nil
		}
	}
	defer stopLeading()
	for {
		select {
		case <-ctx.Done():
			return
		case leader := <-n.notifyCh:
			stopLeading()
			if !leader {
				continue
			}
			lctx, cancel := context.WithCancel(ctx)
			stop = cancel
			done = make(chan struct{})
			go func() {
				defer close(done)
				n.leaderLoop(lctx)
			}()
		}
	}
}

// leaderLoop runs the promotion steps (docs/ARCHITECTURE.md, "A failover"),
// then the ticker, until the node loses leadership. Client writes are
// refused until promotion is done.
func (n *Node) leaderLoop(ctx context.Context) {
	// No lease outlives a term: reads of this term wait for its Promote and
	// a round of its own.
	n.leadership.drop()
	defer n.leadership.drop()
	if n.clock != nil {
		n.clock.reset() // a new term reads the wall clock again (clock.go)
	}
	defer n.promotedTerm.Store(0)
	defer n.sm.setIndexKeys(false)
	n.log.Info("became leader, promoting")
	var term uint64
	for {
		if term = n.promote(ctx); term != 0 {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.cfg.Tick):
		}
	}
	if n.etcd != nil {
		// What this node last knew of the export may be another term's,
		// or nothing: until the export loop has read etcd's latest, the
		// ring says what is surely exported (every entry before it was
		// acknowledged), so a status never reports the whole applied seq
		// as a backlog after a leader change.
		n.sm.read(func(f *fsm.FSM) {
			st := f.Stats()
			n.exportedSeq.Store(st.AppliedSeq - uint64(st.RingLen))
		})
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Add(2)
		go func() {
			defer wg.Done()
			n.publishMasterView(ctx)
		}()
		go func() {
			defer wg.Done()
			n.exportLoop(ctx)
		}()
		if n.cfg.ExportRenewals {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.renewalLoop(ctx)
			}()
		}
	}
	n.sm.setIndexKeys(true)
	// The key index builds beside the ticker, which must not wait for it,
	// once the failover's rush is over (DefaultKeyIndexAfter).
	built := make(chan struct{})
	go func() {
		defer close(built)
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.cfg.KeyIndexAfter):
		}
		n.sm.buildKeyIndex(ctx)
	}()
	defer func() { <-built }()
	releasing := make(chan struct{})
	go func() {
		defer close(releasing)
		n.releaseLoop(ctx)
	}()
	defer func() { <-releasing }()
	n.promotedTerm.Store(term)
	n.leaderSignal.fire()
	n.log.Info("promotion done, serving")
	if err := n.recordMember(ctx, n.cfg.ID, n.cfg.GRPCAddr); err != nil {
		n.log.Warn("could not record this node's client address", "error", err)
	}
	t := time.NewTicker(n.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := n.tick(ctx, false); err != nil {
			n.log.Warn("tick failed", "error", err)
		}

	}
}

// promote makes every committed entry applied (Barrier) and proposes
// Promote, which leases every object and gives every session two client
// TTLs from now, as Consul's new leader does: one as if the old leader's
// last tick had been lost, and one for its client to find this leader
// (docs/RELIABILITY.md, finding 33). It returns the term the Promote was
// proposed in, 0 if it failed.
func (n *Node) promote(ctx context.Context) uint64 {
	if err := n.wait(n.raft.Barrier(n.cfg.ElectionTimeout * 4)); err != nil {
		n.log.Warn("barrier failed", "error", err)
		return 0
	}
	cmd := &fsm.Promote{NowMs: n.now(), LeaderID: n.cfg.ID, LeaderAddr: n.cfg.GRPCAddr, Term: n.raft.CurrentTerm(), Params: n.cfg.Params,
		MooncakeAddr: n.cfg.MooncakeAddr, SessionGraceMs: min(n.cfg.Params.ClientTTLMs, fsm.MaxSessionGraceMs)}
	if _, err := n.apply(ctx, cmd); err != nil {
		n.log.Warn("promote failed", "error", err)
		return 0
	}
	return cmd.Term
}

// tick proposes one Tick with the renewals and pings batched since the
// last one: every renewal when flush is set or the tick evicts (both must
// see every lease a read returned), else those due (lease.Batcher.DrainDue).
// Ticks are serialised so renewals are applied in order. Only a tick marked
// Evict evicts, and it holds every read until it is applied: a lease
// granted by a read between the drain and the eviction would otherwise be
// broken.
//
// While a segment drains, a tick at most every drainEvery is followed by
// DrainSegments, under the same hold and full flush: it unmounts what no
// lease holds any more.
func (n *Node) tick(ctx context.Context, flush bool) (fsm.Result, error) {
	n.tickMu.Lock()
	defer n.tickMu.Unlock()
	var evict, draining bool
	n.sm.read(func(f *fsm.FSM) { evict, draining = f.EvictionDue(), f.Draining() })
	evict = n.needSpace.Swap(false) || evict
	drain := draining && time.Since(n.lastDrain) >= drainEvery
	if evict || drain {
		release := n.gate.closeAll()
		defer release()
	}
	now := n.now()
	var renewals []lease.Renewal
	var pings []lease.Ping
	if flush || evict || drain {
		renewals, pings = n.batcher.Drain()
	} else {
		renewals, pings = n.batcher.DrainDue()
	}
	n.noteRenewed(renewals)
	start := time.Now()
	r, err := n.apply(ctx, &fsm.Tick{NowMs: now, Renewals: renewals, Pings: pings, Evict: evict, ExpireMax: expireMax})
	n.metrics.tickDur.Observe(time.Since(start).Seconds())
	if err != nil {
		// The Tick may not be in the log (a proposal that timed out before
		// Raft took it): the leases it carried must reach the next flush
		// (RELIABILITY finding 30).
		n.batcher.Requeue(renewals, pings)
		return r, err
	}
	if !drain {
		return r, nil
	}
	n.lastDrain = time.Now()
	d, err := n.apply(ctx, &fsm.DrainSegments{NowMs: now})
	if err == nil {
		err = d.Err
	}
	r.Removed += d.Removed
	return r, err
}

// expireMax is the objects one tick's expired sessions may hold
// (fsm.Tick.ExpireMax): their removal takes ~20 ms of the state's lock on
// the 2-core machine of docs/BENCHMARKS.md, on every node at once, and a
// tick comes every --tick (100 ms), so clients leaving by the thousand are
// expired at up to ~20,000 objects a second, about what etcd takes of the
// OpLog. At 16,384 the ticks ran back to back, each node spent a core on
// them, and the cluster lost its leader (RELIABILITY finding 24).
const expireMax = 2048

// drainEvery is how often the leader checks draining segments: each check
// scans every object, as an unmount does.
const drainEvery = time.Second
