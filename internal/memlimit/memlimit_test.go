package memlimit

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLimit(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live     uint64
		headroom float64
		floor    uint64
		want     int64
	}{
		{0, 0.5, 256 * mib, 256 * mib},           // an empty node: the floor
		{100 * mib, 0.5, 256 * mib, 356 * mib},   // a small state: the floor, looser than GOGC's
		{1024 * mib, 0.5, 256 * mib, 1536 * mib}, // a large one: half its live heap more
		{1024 * mib, 1, 0, 2048 * mib},           // no floor
		{math.MaxUint64, 2, 0, math.MaxInt64},    // no overflow
	} {
		assert.Equal(t, tc.want, Limit(tc.live, tc.headroom, tc.floor), "live %d, headroom %g, floor %d", tc.live, tc.headroom, tc.floor)
	}
}

// TestTune: the limit follows the live heap while Tune runs, is lifted
// while a Hold is in force, and is lifted when Tune stops.
func TestTune(t *testing.T) {
	ballast := make([]byte, 64<<20)
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Tune(ctx, 1, 0, 10*time.Millisecond)
	}()
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
	cancel()
	<-done
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "lifted when Tune stops")
}
