package fsm

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAllocatorBestFitAndCoalesce(t *testing.T) {
	a := newAllocator(100)
	o1, _ := a.alloc(10) // [0,10)
	o2, _ := a.alloc(20) // [10,30)
	o3, _ := a.alloc(5)  // [30,35)
	_, _ = a.alloc(15)   // [35,50)
	require.Equal(t, []uint64{0, 10, 30}, []uint64{o1, o2, o3})
	a.release(o2, 20) // free: [10,30) len 20, [50,100) len 50
	a.release(o1, 10) // coalesces into [0,30)
	require.Equal(t, []freeRange{{0, 30}, {50, 50}}, a.extents())
	off, ok := a.alloc(25) // best fit is [0,30), not the larger [50,100)
	require.True(t, ok)
	require.Equal(t, uint64(0), off)
	a.release(o3, 5)
	require.Equal(t, []freeRange{{25, 10}, {50, 50}}, a.extents())
	_, ok = a.alloc(51)
	require.False(t, ok, "no extent holds 51 bytes")
	_, ok = a.alloc(0)
	require.False(t, ok, "zero-byte buffers are refused")
	require.Equal(t, uint64(60), a.free)
	require.Equal(t, uint64(50), a.largest())
}

// TestAllocatorProperty drives random allocate/free sequences and checks,
// after every step, that live buffers never overlap, free space is exact,
// and free extents are coalesced (no two adjacent), by comparing with the
// allocator rebuilt from the live set.
func TestAllocatorProperty(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		const size = 1 << 16
		a := newAllocator(size)
		var live []freeRange
		var liveBytes uint64
		for step := 0; step < 3000; step++ {
			if len(live) > 0 && rng.IntN(3) == 0 {
				i := rng.IntN(len(live))
				b := live[i]
				live = slices.Delete(live, i, i+1)
				a.release(b.off, b.len)
				liveBytes -= b.len
			} else {
				n := uint64(1 + rng.IntN(2048))
				largest := a.largest()
				off, ok := a.alloc(n)
				require.Equal(t, n <= largest, ok, "alloc succeeds iff an extent holds it")
				if ok {
					live = append(live, freeRange{off, n})
					liveBytes += n
				}
			}
			require.Equal(t, size-liveBytes, a.free, "seed %d step %d: free space", seed, step)
			sorted := slices.Clone(live)
			slices.SortFunc(sorted, func(x, y freeRange) int { return int(x.off) - int(y.off) })
			want, ok := rebuildAllocator(size, sorted)
			require.True(t, ok, "seed %d step %d: live buffers overlap", seed, step)
			require.Equal(t, want.extents(), a.extents(), "seed %d step %d: extents not coalesced", seed, step)
		}
	}
}

func TestRebuildAllocatorRejectsOverlap(t *testing.T) {
	_, ok := rebuildAllocator(100, []freeRange{{0, 10}, {5, 10}})
	require.False(t, ok)
	_, ok = rebuildAllocator(100, []freeRange{{95, 10}})
	require.False(t, ok)
	_, ok = rebuildAllocator(100, []freeRange{{5, 0}})
	require.False(t, ok)
	a, ok := rebuildAllocator(100, []freeRange{{10, 10}, {20, 5}})
	require.True(t, ok)
	require.Equal(t, []freeRange{{0, 10}, {25, 75}}, a.extents())
}
