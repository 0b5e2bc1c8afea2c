package memlimit

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLimit(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, other uint64
		headroom    float64
		floor       uint64
		want        int64
	}{
		{0, 0, 0.5, 256 * mib, 256 * mib},                     // an empty node: the floor
		{100 * mib, 0, 0.5, 256 * mib, 356 * mib},             // a small state: the floor, looser than GOGC's
		{1024 * mib, 0, 0.5, 256 * mib, 1536 * mib},           // a large one: half its live heap more
		{1024 * mib, 400 * mib, 0.5, 256 * mib, 1936 * mib},   // the runtime's other memory comes on top
		{1024 * mib, 0, 1, 0, 2048 * mib},                     // no floor
		{math.MaxUint64, math.MaxUint64, 2, 0, math.MaxInt64}, // no overflow
	} {
		assert.Equal(t, tc.want, Limit(tc.live, tc.other, tc.headroom, tc.floor), "live %d, other %d, headroom %g, floor %d", tc.live, tc.other, tc.headroom, tc.floor)
	}
}

// TestTuneLeavesRoomAfterRemovals: when half of many small objects are
// dropped, the live heap halves but their spans stay part-filled; the
// heap goal must still leave the headroom above the live heap, not
// collapse onto it (which made the collector run back to back on a node
// whose clients left by the thousand).
func TestTuneLeavesRoomAfterRemovals(t *testing.T) {
	objs := make([]*[48]byte, 1<<20)
	for i := range objs {
		objs[i] = new([48]byte)
	}
	for i := 0; i < len(objs); i += 2 {
		objs[i] = nil
	}
	runtime.GC()
	runtime.GC()
	stop := tune(0.5)
	defer stop()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/goal:bytes"}}
	assert.Eventually(t, func() bool {
		metrics.Read(s)
		live, goal := s[0].Value.Uint64(), s[1].Value.Uint64()
		return debug.SetMemoryLimit(-1) < math.MaxInt64 && float64(goal) >= 1.4*float64(live)
	}, 5*time.Second, 10*time.Millisecond, "a heap goal of at least 1.4 times the live heap at a headroom of 0.5")
	runtime.KeepAlive(objs)
}

// TestTune: the limit follows the live heap while Tune runs, is lifted
// while a Hold is in force, and is lifted when Tune stops.
func TestTune(t *testing.T) {
	ballast := make([]byte, 64<<20)
	runtime.GC()
	stop := tune(1)
	assert.Eventually(t, func() bool {
		l := debug.SetMemoryLimit(-1)
		return l >= 2*int64(len(ballast)) && l < math.MaxInt64
	}, 5*time.Second, 10*time.Millisecond, "at least twice the 64 MiB held live")
	release := Hold()
	assert.Eventually(t, func() bool { return debug.SetMemoryLimit(-1) == math.MaxInt64 }, 5*time.Second, 10*time.Millisecond, "lifted while held")
	release()
	release()
	assert.Eventually(t, func() bool { return debug.SetMemoryLimit(-1) < math.MaxInt64 }, 5*time.Second, 10*time.Millisecond, "back once released (once)")
	runtime.KeepAlive(ballast)
	stop()
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "lifted when Tune stops")
}

// tune runs Tune with headroom and no floor until stop is called.
func tune(headroom float64) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Tune(ctx, headroom, 0, 10*time.Millisecond)
	}()
	return func() { cancel(); <-done }
}

// TestHoldStopsCollections: while a Hold is in force, allocating runs no
// collection; GOGC comes back when the last of overlapping Holds is
// released, and not before.
func TestHoldStopsCollections(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(150))
	var stats runtime.MemStats
	runtime.ReadMemStats(&stats)
	before := stats.NumGC
	first, second := Hold(), Hold()
	keep := make([][]byte, 0, 1024)
	for range cap(keep) {
		keep = append(keep, make([]byte, 64<<10)) // 64 MiB in all
	}
	runtime.ReadMemStats(&stats)
	assert.Equal(t, before, stats.NumGC, "collections while held")
	first()
	first()
	assert.Equal(t, -1, debug.SetGCPercent(-1), "GOGC while the second Hold is in force")
	second()
	assert.Equal(t, 150, debug.SetGCPercent(150), "GOGC once both are released")
	runtime.KeepAlive(keep)
}
