package client

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moonraft/moonraft/fsm"
)

// maxPingInterval is the longest wait between pings: clients ping every
// second against the default 10 s session TTL.
const maxPingInterval = time.Second

// Keeper keeps a client's session alive: it pings, and remounts the
// client's segments when the master answers NEED_REMOUNT (the session
// expired, or a restored master never knew it).
type Keeper struct {
	cancel   context.CancelFunc
	done     chan struct{}
	remounts atomic.Int64

	mu      sync.Mutex
	lastErr error
}

// KeepAlive starts a Keeper for clientID, whose mounted segments are
// segments. It pings at once, then every interval; with interval ≤ 0, every
// third of the TTL the master answers, at most every second. It stops when
// ctx is done or Stop is called.
func (c *Client) KeepAlive(ctx context.Context, clientID string, segments []fsm.SegmentSpec, interval time.Duration) *Keeper {
	ctx, cancel := context.WithCancel(ctx)
	k := &Keeper{cancel: cancel, done: make(chan struct{})}
	go k.run(ctx, c, clientID, slices.Clone(segments), interval)
	return k
}

func (k *Keeper) run(ctx context.Context, c *Client, clientID string, segs []fsm.SegmentSpec, interval time.Duration) {
	defer close(k.done)
	every := interval
	if every <= 0 {
		every = maxPingInterval
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ttl := k.once(ctx, c, clientID, segs, every)
		if interval <= 0 && ttl > 0 {
			every = min(time.Duration(ttl)*time.Millisecond/3, maxPingInterval)
		}
		t.Reset(every)
	}
}

// once pings (and remounts if told to) and returns the session TTL in ms,
// 0 if the ping failed. A ping tries each endpoint once, following a
// redirect, and a failed one waits for the next round, as Mooncake's
// clients do: backing off within the round would bring every client that
// pinged during an election to the new leader at once. A remount retries
// for at least a second, or one interval if longer.
func (k *Keeper) once(ctx context.Context, c *Client, clientID string, segs []fsm.SegmentSpec, every time.Duration) int64 {
	budget := max(every, time.Second)
	pctx, cancel := context.WithTimeout(ctx, budget)
	p, err := c.ping(pctx, clientID, retryMode{idempotent: true, onePass: true})
	cancel()
	ttl := p.TTLMs
	if err == nil && p.NeedRemount {
		rctx, cancel := context.WithTimeout(ctx, budget)
		err = c.ReMountSegment(rctx, clientID, segs)
		cancel()
		if err == nil {
			k.remounts.Add(1)
		}
	}
	if ctx.Err() == nil {
		k.mu.Lock()
		k.lastErr = err
		k.mu.Unlock()
	}
	return ttl
}

// Stop stops the Keeper and waits for its goroutine to end.
func (k *Keeper) Stop() {
	k.cancel()
	<-k.done
}

// Remounts is how many times the Keeper has remounted the segments.
func (k *Keeper) Remounts() int { return int(k.remounts.Load()) }

// Err is the error of the last ping or remount, nil if it succeeded.
func (k *Keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lastErr
}
