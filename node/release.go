package node

import (
	"context"
	"math"
	"time"

	"github.com/moonraft/moonraft/fsm"
)

const (
	// bulkDirect is how many REMOVEs one bulk removal exports at once
	// (fsm.ReleaseRemovals.Direct): as many as a small unmount has, so
	// only a large one defers.
	bulkDirect = 1024
	// maxRelease bounds one ReleaseRemovals, so that its apply holds the
	// state for milliseconds: at one a tick, ten times etcd's rate here.
	maxRelease = 16_384
)

// releaseRemovals is the leader's part in deferral (fsm/deferred.go): it
// turns deferral on, then, each tick, moves deferred REMOVEs into the
// export ring at the pace the pacer gives, until none waits.
func (n *Node) releaseRemovals(ctx context.Context) error {
	var (
		on      bool
		waiting int
	)
	n.sm.read(func(f *fsm.FSM) {
		on = f.DeferringRemovals()
		waiting, _, _ = f.DeferredRemovals()
	})
	if on && waiting == 0 {
		return nil
	}
	share := uint64(math.MaxUint64) // no etcd: nothing to wait for
	if n.etcd != nil {
		share = n.pacer.removalShare(n.cfg.Tick)
	}
	if on && share == 0 {
		return nil
	}
	_, err := n.apply(ctx, &fsm.ReleaseRemovals{NowMs: n.now(), Max: min(share, maxRelease), Direct: bulkDirect})
	return err
}

// removalShare is how many deferred REMOVEs may enter the export ring in
// the next interval: the room under the soft bound or, while writes wait
// for room, half of what etcd takes in an interval (the writes get the
// other half). None while etcd is unreachable: the queue, not the ring,
// then holds them.
func (p *pacer) removalShare(interval time.Duration) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.active || p.down != nil {
		return 0
	}
	if len(p.queue) > 0 {
		if p.rate.perSec <= 0 {
			return bulkDirect
		}
		return max(1, uint64(p.rate.perSec*interval.Seconds()/2))
	}
	b := p.backlog() + p.reserved
	if b >= p.softEntries {
		return 0
	}
	return p.softEntries - b
}
