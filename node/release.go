package node

import (
	"context"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
)

const (
	// bulkDirect is how many REMOVEs one bulk removal exports at once
	// (fsm.ReleaseRemovals.Direct), and how many one release moves into
	// the export ring: as many as a small unmount has, so only a large
	// one defers.
	bulkDirect = 1024
	// releaseWait bounds a release's wait for its turn at the pacer; a
	// release refused is tried again the next tick.
	releaseWait = 30 * time.Second
)

// releaseLoop is the leader's part in deferral (fsm/deferred.go): it turns
// deferral on, then moves deferred REMOVEs into the export ring while any
// wait, bulkDirect at a time, each admitted by the pacer's
// admitBackground: they keep the backlog under a quarter of the soft bound
// (backgroundShare) while client writes go at once, and take turns with
// them, first come first served, once writes must wait.
func (n *Node) releaseLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.Tick)
	defer t.Stop()
	for {
		if err := n.releaseRemovals(ctx); err != nil && ctx.Err() == nil {
			n.log.Warn("deferred removals not released; trying again", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// releaseRemovals releases deferred REMOVEs until none waits.
func (n *Node) releaseRemovals(ctx context.Context) error {
	for ctx.Err() == nil {
		var (
			on      bool
			waiting int
		)
		n.sm.read(func(f *fsm.FSM) {
			on = f.DeferringRemovals()
			waiting, _, _ = f.DeferredRemovals()
		})
		if on && (waiting == 0 || n.pacer.stats().EtcdDown()) {
			return nil // while etcd is down the queue, not the ring, holds them
		}
		chunk := min(uint64(min(waiting, bulkDirect)), n.pacer.releaseSize())
		wctx, cancel := context.WithTimeout(ctx, releaseWait)
		paced, err := n.pacer.admitBackground(wctx, chunk)
		cancel()
		if errcode.Of(err) == errcode.TooManyRequests {
			return nil // its turn is not near: the next tick asks again
		}
		if err != nil {
			return err
		}
		_, err = n.apply(ctx, &fsm.ReleaseRemovals{NowMs: n.now(), Max: chunk, Direct: bulkDirect})
		paced()
		if err != nil {
			return err
		}
	}
	return nil
}
