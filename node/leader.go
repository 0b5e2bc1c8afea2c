package node

import (
	"context"
	"sync"
	"time"

	"github.com/moonraft/moonraft/fsm"
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

// leaderLoop runs DESIGN.md's promotion steps, then the ticker, until the
// node loses leadership. Client writes are refused until promotion is done.
func (n *Node) leaderLoop(ctx context.Context) {
	defer n.promoted.Store(false)
	n.log.Info("became leader, promoting")
	for !n.promote(ctx) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.cfg.Tick):
		}
	}
	if n.etcd != nil {
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
	n.promoted.Store(true)
	n.leaderSignal.fire()
	n.log.Info("promotion done, serving")
	t := time.NewTicker(n.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.batcher.Urgent():
		}
		if _, err := n.tick(ctx); err != nil {
			n.log.Warn("tick failed", "error", err)
		}
	}
}

// promote makes every committed entry applied (Barrier) and proposes
// Promote, which leases every object and extends every session as if the
// last tick of the old leader had been lost.
func (n *Node) promote(ctx context.Context) bool {
	if err := n.raft.Barrier(n.cfg.ElectionTimeout * 4).Error(); err != nil {
		n.log.Warn("barrier failed", "error", err)
		return false
	}
	cmd := &fsm.Promote{NowMs: n.now(), LeaderID: n.cfg.ID, LeaderAddr: n.cfg.GRPCAddr, Term: n.raft.CurrentTerm(), Params: n.cfg.Params}
	if _, err := n.apply(ctx, cmd); err != nil {
		n.log.Warn("promote failed", "error", err)
		return false
	}
	return true
}

// tick proposes one Tick with every renewal and ping batched since the
// last one. Ticks are serialised so renewals are applied in order. Only a
// tick marked Evict evicts, and it holds every read until it is applied: a
// lease granted by a read between the drain and the eviction would
// otherwise be broken.
func (n *Node) tick(ctx context.Context) (fsm.Result, error) {
	n.tickMu.Lock()
	defer n.tickMu.Unlock()
	var evict bool
	n.sm.read(func(f *fsm.FSM) { evict = f.EvictionDue() })
	evict = n.needSpace.Swap(false) || evict
	if evict {
		release := n.gate.closeAll()
		defer release()
	}
	renewals, pings := n.batcher.Drain()
	n.noteRenewed(renewals)
	start := time.Now()
	r, err := n.apply(ctx, &fsm.Tick{NowMs: n.now(), Renewals: renewals, Pings: pings, Evict: evict})
	n.metrics.tickDur.Observe(time.Since(start).Seconds())
	return r, err
}
