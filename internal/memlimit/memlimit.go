// Package memlimit keeps a node's heap within a headroom of its live heap
// once the state is large: Go's collector lets the heap grow to
// (1 + GOGC/100) times the live heap, three times it at the node's default
// GOGC of 200, and that headroom, not the state, is most of a large
// node's resident memory (docs/OPERATIONS.md, "Memory"). Tune sets Go's
// soft memory limit so that the heap may grow by max(floor, headroom ×
// live) past the live heap and the runtime's other memory, after each
// collection, so a small state keeps GOGC's cheap collections and a large
// one spends CPU, not memory.
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

// Limit is the soft memory limit for a live heap of live bytes in a
// process whose runtime holds other bytes beside its heap's objects and
// free pages: room for the heap to grow by the larger of floor and
// headroom × live. Go aims the heap at the limit less that other memory
// (stacks, metadata, and the unused room in part-filled spans); after a
// mass removal the removed objects' spans stay part-filled, and a limit of
// live × (1 + headroom) alone left the heap no room, so the collector ran
// back to back (docs/RELIABILITY.md, finding 25).
func Limit(live, other uint64, headroom float64, floor uint64) int64 {
	l := float64(live) + float64(other) + max(float64(floor), headroom*float64(live))
	if l >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(l)
}

// The runtime's figures Tune reads, in the order read takes them.
var samples = [...]string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/objects:bytes",
}

// read returns the live heap and the memory the runtime holds beside its
// objects and free pages, or false if a figure is missing.
func read(s []metrics.Sample) (live, other uint64, ok bool) {
	metrics.Read(s)
	var v [len(samples)]uint64
	for i := range s {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0, 0, false
		}
		v[i] = s[i].Value.Uint64()
	}
	total, released, free, objects := v[1], v[2], v[3], v[4]
	if released+free+objects > total {
		return v[0], 0, true
	}
	return v[0], total - released - free - objects, true
}

// holds counts the Holds in force: a state being rebuilt (a snapshot's
// restore) grows its live heap from nothing, and a limit that trails the
// live heap would collect over and over; at three million objects it
// made a restart or a join 2.5 times slower. Nor does GOGC help there:
// 70 % of what a restore allocates stays live, so each of its collections
// (at 4, 12, 36 ... MB) marks what the next will mark again, for little
// freed; without them a restarted node loaded 243 MB at 3M objects in
// 6.7 s against 7.7 s (one run each, on cores shared with the cluster).
var (
	holds       atomic.Int64
	holdMu      sync.Mutex // orders the GOGC changes of Hold and release
	heldPercent int        // GOGC before the first Hold in force
)

// Hold turns GOGC off, and Tune lifts its limit, until the returned release
// is called; the heap meanwhile grows by what is allocated, a restore's
// garbage (two fifths of its live heap) included. A limit set in $GOMEMLIMIT
// still holds: Go collects at it whatever GOGC says.
func Hold() (release func()) {
	holdMu.Lock()
	if holds.Add(1) == 1 {
		heldPercent = debug.SetGCPercent(-1)
	}
	holdMu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			holdMu.Lock()
			defer holdMu.Unlock()
			if holds.Add(-1) == 0 {
				debug.SetGCPercent(heldPercent)
			}
		})
	}
}

// Tune sets the soft memory limit from the live heap every interval until
// ctx ends, then lifts it. A limit given in $GOMEMLIMIT is the operator's
// and is left alone: the caller does not call Tune then.
func Tune(ctx context.Context, headroom float64, floor uint64, interval time.Duration) {
	sample := make([]metrics.Sample, len(samples))
	for i, name := range samples {
		sample[i].Name = name
	}
	var set int64
	t := time.NewTicker(interval)
	defer t.Stop()
	defer debug.SetMemoryLimit(math.MaxInt64)
	for {
		live, other, ok := read(sample)
		switch {
		case holds.Load() > 0:
			if set != math.MaxInt64 {
				debug.SetMemoryLimit(math.MaxInt64)
				set = math.MaxInt64
			}
		case ok:
			// Set only when it moves by more than 1 %: each call takes
			// the runtime's heap lock.
			if l := Limit(live, other, headroom, floor); set == 0 || math.Abs(float64(l)-float64(set)) > float64(set)/100 {
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
