package node

import (
	"context"
	"sync"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/service"
)

// errWouldWait is what a read under service.NoWait returns where it
// would wait; its caller runs it again where it may.
var errWouldWait = errcode.New(errcode.UnavailableInCurrentStatus, "the read would wait")

// gate keeps the lease invariant (docs/ARCHITECTURE.md) on the leader: a read that grants
// a lease must not slip between a removal's flush of pending renewals and
// the removal's apply. Reads hold the gate shared while they check the
// state and record their renewal; a removal marks its key (or all keys)
// under the exclusive lock, so every read already past the gate has
// recorded its renewal, and reads that come later wait until the removal
// is applied.
type gate struct {
	mu   sync.RWMutex
	keys map[string]int // single-key removals in flight
	all  int            // removals in flight that may touch any key
	done chan struct{}  // closed and replaced whenever a removal ends
}

func newGate() *gate {
	return &gate{keys: map[string]int{}, done: make(chan struct{})}
}

// readKeys runs fn once no removal of any of keys is in flight (a batch
// read passes once for all its keys).
func (g *gate) readKeys(ctx context.Context, keys []string, fn func()) error {
	return g.when(ctx, func() bool {
		if g.all > 0 {
			return false
		}
		for _, k := range keys {
			if g.keys[k] > 0 {
				return false
			}
		}
		return true
	}, fn)
}

// readAll runs fn once no removal at all is in flight (reads by regex).
func (g *gate) readAll(ctx context.Context, fn func()) error {
	return g.when(ctx, func() bool { return g.all == 0 && len(g.keys) == 0 }, fn)
}

// when runs fn under the shared lock once open holds, waiting for removals
// to end meanwhile.
func (g *gate) when(ctx context.Context, open func() bool, fn func()) error {
	for {
		g.mu.RLock()
		if open() {
			fn()
			g.mu.RUnlock()
			return nil
		}
		done := g.done
		g.mu.RUnlock()
		if service.MustNotWait(ctx) {
			return errWouldWait
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// closeKey marks a removal of key in flight; the returned func ends it.
func (g *gate) closeKey(key string) func() {
	g.mu.Lock()
	g.keys[key]++
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		if g.keys[key]--; g.keys[key] == 0 {
			delete(g.keys, key)
		}
		g.wake()
		g.mu.Unlock()
	}
}

// closeAll marks a removal of any key in flight; the returned func ends it.
func (g *gate) closeAll() func() {
	g.mu.Lock()
	g.all++
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.all--
		g.wake()
		g.mu.Unlock()
	}
}

func (g *gate) wake() {
	close(g.done)
	g.done = make(chan struct{})
}
