// Package memlimit keeps a node's heap within a headroom of its live heap
// once the state is large: Go's collector lets the heap grow to
// (1 + GOGC/100) times the live heap, three times it at the node's default
// GOGC of 200, and that headroom, not the state, is most of a large
// node's resident memory (docs/OPERATIONS.md, "Memory"). Tune sets Go's
// soft memory limit to the live heap plus max(floor, headroom × live)
// after each collection, so a small state keeps GOGC's cheap collections
// and a large one spends CPU, not memory.
package memlimit

import (
	"context"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Limit is the soft memory limit for a live heap of live bytes: live plus
// the larger of floor and headroom × live.
func Limit(live uint64, headroom float64, floor uint64) int64 {
	l := float64(live) + max(float64(floor), headroom*float64(live))
	if l >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(l)
}

const liveMetric = "/gc/heap/live:bytes"

// holds counts the Holds in force: a state being rebuilt (a snapshot's
// restore) grows its live heap from nothing, and a limit that trails the
// live heap would collect over and over; at three million objects it
// made a restart or a join 2.5 times slower.
var holds atomic.Int64

// Hold lifts the limit until the returned release is called.
func Hold() (release func()) {
	holds.Add(1)
	var once sync.Once
	return func() { once.Do(func() { holds.Add(-1) }) }
}

// Tune sets the soft memory limit from the live heap every interval until
// ctx ends, then lifts it. A limit given in $GOMEMLIMIT is the operator's
// and is left alone: the caller does not call Tune then.
func Tune(ctx context.Context, headroom float64, floor uint64, interval time.Duration) {
	sample := []metrics.Sample{{Name: liveMetric}}
	var set int64
	t := time.NewTicker(interval)
	defer t.Stop()
	defer debug.SetMemoryLimit(math.MaxInt64)
	for {
		metrics.Read(sample)
		switch {
		case holds.Load() > 0:
			if set != math.MaxInt64 {
				debug.SetMemoryLimit(math.MaxInt64)
				set = math.MaxInt64
			}
		case sample[0].Value.Kind() == metrics.KindUint64:
			// Set only when it moves by more than 1 %: each call takes
			// the runtime's heap lock.
			if l := Limit(sample[0].Value.Uint64(), headroom, floor); set == 0 || math.Abs(float64(l)-float64(set)) > float64(set)/100 {
				debug.SetMemoryLimit(l)
				set = l
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
