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

func TestAllocatorAllocAt(t *testing.T) {
	// Free extents of the fixture: [0,10) and [20,50) in a 100-byte space.
	fixture := func() *allocator {
		a, ok := rebuildAllocator(100, []freeRange{{10, 10}, {50, 50}})
		require.True(t, ok)
		return a
	}
	tests := []struct {
		name    string
		off, n  uint64
		ok      bool
		extents []freeRange // after the call
	}{
		{"inside an extent", 25, 5, true, []freeRange{{0, 10}, {20, 5}, {30, 20}}},
		{"at an extent's start", 20, 5, true, []freeRange{{0, 10}, {25, 25}}},
		{"at an extent's end", 45, 5, true, []freeRange{{0, 10}, {20, 25}}},
		{"a whole extent", 0, 10, true, []freeRange{{20, 30}}},
		{"spans two extents", 5, 20, false, nil},
		{"runs past an extent", 40, 11, false, nil},
		{"inside live data", 12, 2, false, nil},
		{"starts in live data", 15, 10, false, nil},
		{"past the end", 100, 1, false, nil},
		{"zero length", 25, 0, false, nil},
		{"wraps around", 30, ^uint64(0), false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := fixture()
			before := a.extents()
			require.Equal(t, tt.ok, a.allocAt(tt.off, tt.n))
			if !tt.ok {
				require.Equal(t, before, a.extents(), "a refused allocAt changes nothing")
				require.Equal(t, uint64(40), a.free)
				return
			}
			require.Equal(t, tt.extents, a.extents())
			require.Equal(t, 40-tt.n, a.free)
			// release undoes it exactly: extents stay maximal.
			a.release(tt.off, tt.n)
			require.Equal(t, before, a.extents())
		})
	}
}

// TestAllocatorAllocAtMatchesRebuild takes random free ranges with allocAt
// and checks the allocator against the one rebuilt from the live set.
func TestAllocatorAllocAtMatchesRebuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	const size = 1 << 12
	a := newAllocator(size)
	var live []freeRange
	for step := 0; step < 2000; step++ {
		off, n := uint64(rng.IntN(size)), uint64(1+rng.IntN(64))
		overlaps := off+n > size || slices.ContainsFunc(live, func(b freeRange) bool {
			return off < b.off+b.len && b.off < off+n
		})
		require.Equal(t, !overlaps, a.allocAt(off, n), "step %d: [%d,+%d)", step, off, n)
		if !overlaps {
			live = append(live, freeRange{off, n})
		}
		if len(live) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(live))
			a.release(live[i].off, live[i].len)
			live = slices.Delete(live, i, i+1)
		}
		sorted := slices.Clone(live)
		slices.SortFunc(sorted, func(x, y freeRange) int { return int(x.off) - int(y.off) })
		want, ok := rebuildAllocator(size, sorted)
		require.True(t, ok)
		require.Equal(t, want.extents(), a.extents(), "step %d", step)
		require.Equal(t, want.free, a.free, "step %d", step)
	}
}

// TestFreeAll: freeing a bulk removal's buffers together, sorted and with
// neighbours merged, leaves the allocators and the used count as freeing
// them one at a time does.
func TestFreeAll(t *testing.T) {
	for _, tc := range []struct {
		name string
		pick func(i int) bool // which of the buffers are freed
	}{
		{"every buffer (all neighbours)", func(int) bool { return true }},
		{"every other (no neighbours)", func(i int) bool { return i%2 == 0 }},
		{"runs of three", func(i int) bool { return i%5 < 3 }},
		{"none", func(int) bool { return false }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Two segments of 40 buffers each; the picked ones freed in
			// a random order.
			build := func() (f *FSM, freed []buffer, extents func() [][]freeRange) {
				f = New()
				var segs []*segment
				for _, id := range []string{"seg-b", "seg-a"} {
					s := &segment{id: id, size: 1000, alloc: newAllocator(1000)}
					segs = append(segs, s)
					for i := range 40 {
						off, ok := s.alloc.alloc(10)
						require.True(t, ok)
						f.used += 10
						if tc.pick(i) {
							freed = append(freed, buffer{s, off, 10})
						}
					}
				}
				rand.New(rand.NewPCG(1, 2)).Shuffle(len(freed), func(i, j int) { freed[i], freed[j] = freed[j], freed[i] })
				return f, freed, func() [][]freeRange {
					var out [][]freeRange
					for _, s := range segs {
						out = append(out, s.alloc.extents())
					}
					return out
				}
			}
			one, bufs, oneExtents := build()
			for _, b := range bufs {
				one.freeBuffers([]replica{{buffers: []buffer{b}}})
			}
			all, bufs, allExtents := build()
			all.freeAll(bufs)
			require.Equal(t, one.used, all.used)
			require.Equal(t, oneExtents(), allExtents())
		})
	}
}
