package fsm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSegmentsInfo: Segments lists every segment by id with the bytes its
// live buffers take, and totals match Stats.
func TestSegmentsInfo(t *testing.T) {
	x := newH(t)
	require.Empty(t, x.f.Segments())
	x.mount("c2", "s2", 0x2000_0000, 1<<20)
	x.mount("c1", "s1", 0x1000_0000, 1<<20)
	x.put("k1", "c1", 4096)
	x.put("k2", "c1", 8192, 100)

	segs := x.f.Segments()
	require.Len(t, segs, 2)
	require.Equal(t, "s1", segs[0].ID)
	require.Equal(t, "name-s1", segs[0].Name)
	require.Equal(t, "c1", segs[0].ClientID)
	require.Equal(t, uint64(0x1000_0000), segs[0].Base)
	require.Equal(t, "s2", segs[1].ID)
	var used, size uint64
	for _, s := range segs {
		require.Equal(t, uint64(1<<20), s.Size)
		used, size = used+s.Used, size+s.Size
	}
	st := x.f.Stats()
	require.Equal(t, st.UsedBytes, used)
	require.Equal(t, uint64(4096+8192+100), used)
	require.Equal(t, st.CapacityBytes, size)

	x.ok(&Remove{NowMs: x.now, Key: "k1", Force: true})
	used = 0
	for _, s := range x.f.Segments() {
		used += s.Used
	}
	require.Equal(t, uint64(8192+100), used)
}
