package fsm

import "github.com/moonraft/moonraft/internal/btree"

// freeRange is a free extent [off, off+len) inside one segment, offsets
// relative to the segment's base.
type freeRange struct{ off, len uint64 }

// allocator is a best-fit offset allocator over [0, size). Free extents are
// kept twice — by offset for coalescing and by (length, offset) for best
// fit — so both allocate and release are O(log n). It is a pure function of
// the sequence of calls, and its free extents are always the maximal gaps
// between live buffers, so a restore can rebuild it from the buffers alone.
type allocator struct {
	byOff  *btree.BTreeG[freeRange]
	bySize *btree.BTreeG[freeRange]
	size   uint64
	free   uint64
}

const btreeDegree = 16

func lessByOff(a, b freeRange) bool { return a.off < b.off }

func lessBySize(a, b freeRange) bool {
	if a.len != b.len {
		return a.len < b.len
	}
	return a.off < b.off
}

func newAllocator(size uint64) *allocator {
	a := &allocator{
		byOff:  btree.NewG(btreeDegree, lessByOff),
		bySize: btree.NewG(btreeDegree, lessBySize),
		size:   size,
	}
	a.insert(freeRange{0, size})
	return a
}

func (a *allocator) insert(r freeRange) {
	a.byOff.ReplaceOrInsert(r)
	a.bySize.ReplaceOrInsert(r)
	a.free += r.len
}

func (a *allocator) delete(r freeRange) {
	a.byOff.Delete(r)
	a.bySize.Delete(r)
	a.free -= r.len
}

// largest is the longest free extent: the biggest buffer alloc can return.
func (a *allocator) largest() uint64 {
	r, ok := a.bySize.Max()
	if !ok {
		return 0
	}
	return r.len
}

// alloc returns the offset of a buffer of n bytes taken from the smallest
// free extent that holds it (lowest offset among equals).
func (a *allocator) alloc(n uint64) (uint64, bool) {
	var best freeRange
	found := false
	a.bySize.AscendGreaterOrEqual(freeRange{len: n}, func(r freeRange) bool {
		best, found = r, true
		return false
	})
	if !found || n == 0 {
		return 0, false
	}
	a.delete(best)
	if best.len > n {
		a.insert(freeRange{best.off + n, best.len - n})
	}
	return best.off, true
}

// allocAt takes exactly [off, off+n), which must lie inside one free extent,
// splitting that extent. Replay uses it: an OpLog entry says where a buffer
// is, so best fit has no say. It reports false, changing nothing, if the
// range is empty, wraps, or is not entirely free. Free extents are maximal,
// so a free range never spans two of them.
func (a *allocator) allocAt(off, n uint64) bool {
	end := off + n
	if n == 0 || end < off {
		return false
	}
	r, ok := a.floor(off)
	if !ok || r.off+r.len < end {
		return false
	}
	a.delete(r)
	if off > r.off {
		a.insert(freeRange{r.off, off - r.off})
	}
	if rEnd := r.off + r.len; rEnd > end {
		a.insert(freeRange{end, rEnd - end})
	}
	return true
}

// release returns [off, off+n) to the free extents, merging it with the
// free neighbours on either side.
func (a *allocator) release(off, n uint64) {
	r := freeRange{off, n}
	if prev, ok := a.floor(off); ok && prev.off+prev.len == off {
		a.delete(prev)
		r = freeRange{prev.off, prev.len + r.len}
	}
	if next, ok := a.byOff.Get(freeRange{off: off + n}); ok {
		a.delete(next)
		r.len += next.len
	}
	a.insert(r)
}

// floor is the free extent with the greatest offset at or below off; none
// starts at off itself while [off, …) is allocated.
func (a *allocator) floor(off uint64) (freeRange, bool) {
	var got freeRange
	found := false
	a.byOff.DescendLessOrEqual(freeRange{off: off}, func(r freeRange) bool {
		got, found = r, true
		return false
	})
	return got, found
}

// extents lists the free extents in offset order.
func (a *allocator) extents() []freeRange {
	out := make([]freeRange, 0, a.byOff.Len())
	a.byOff.Ascend(func(r freeRange) bool {
		out = append(out, r)
		return true
	})
	return out
}

// rebuild makes an allocator whose free extents are the gaps between the
// given buffers, which must be sorted by offset, inside [0,size) and
// disjoint; it reports the first violation instead.
func rebuildAllocator(size uint64, used []freeRange) (*allocator, bool) {
	a := &allocator{
		byOff:  btree.NewG(btreeDegree, lessByOff),
		bySize: btree.NewG(btreeDegree, lessBySize),
		size:   size,
	}
	var pos uint64
	for _, u := range used {
		if u.off < pos || u.len == 0 || u.off+u.len < u.off || u.off+u.len > size {
			return nil, false
		}
		if u.off > pos {
			a.insert(freeRange{pos, u.off - pos})
		}
		pos = u.off + u.len
	}
	if pos < size {
		a.insert(freeRange{pos, size - pos})
	}
	return a, true
}
