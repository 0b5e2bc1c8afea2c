package fsm

import (
	"cmp"
	"fmt"
	"slices"
)

// CheckInvariants verifies what must hold after every command: live buffers
// lie inside their segment and never overlap; each allocator's free extents
// are exactly the gaps between them, maximal (coalesced); the used and
// capacity counters match; every segment belongs to its client's session;
// the PROCESSING index and the key index match the objects; the export
// ring is gapless and ends at the applied seq. Tests and the fault suite
// call it; it is O(state).
func (f *FSM) CheckInvariants() error {
	used := map[*segment][]freeRange{}
	onSeg := map[*segment]int{}
	var err error
	procs, indexed := 0, 0
	f.objects.Ascend(func(it objItem) bool {
		o := it.obj
		if len(o.replicas) == 0 {
			err = fmt.Errorf("object %q has no replica", it.key)
			return false
		}
		segs := map[*segment]bool{}
		for _, r := range o.replicas {
			var sum uint64
			for _, b := range r.buffers {
				if f.segments[b.seg.id] != b.seg {
					err = fmt.Errorf("object %q has a buffer on unmounted segment %q", it.key, b.seg.id)
					return false
				}
				if !b.seg.objs.has(it.key) {
					err = fmt.Errorf("object %q is not in the object index of segment %q", it.key, b.seg.id)
					return false
				}
				if !segs[b.seg] {
					segs[b.seg] = true
					onSeg[b.seg]++
				}
				used[b.seg] = append(used[b.seg], freeRange{b.offset, b.length})
				sum += b.length
			}
			if sum != o.size {
				err = fmt.Errorf("object %q: replica holds %d bytes, object is %d", it.key, sum, o.size)
				return false
			}
		}
		if io, ok := f.byKey[it.key]; ok {
			indexed++
			if io != o {
				err = fmt.Errorf("object %q is not what the key index holds", it.key)
				return false
			}
		} else if f.byKey != nil {
			err = fmt.Errorf("object %q is missing from the key index", it.key)
			return false
		}
		if o.processing() {
			procs++
			if !f.processing.holds(it.key, o) {
				err = fmt.Errorf("PROCESSING object %q missing from the index, or started before its bound", it.key)
				return false
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	held := func(rs []replica) {
		for _, r := range rs {
			for _, b := range r.buffers {
				used[b.seg] = append(used[b.seg], freeRange{b.offset, b.length})
			}
		}
	}
	for key, old := range f.replaced {
		if o, ok := f.getObject(key); !ok || !o.processing() || len(old) == 0 {
			return fmt.Errorf("replaced replicas of %q, which is not an upsert in progress", key)
		}
		held(old)
	}
	for _, d := range f.discarded {
		held(d.replicas)
	}
	if len(f.byKey) != indexed {
		return fmt.Errorf("key index holds %d keys that are no object", len(f.byKey)-indexed)
	}
	if procs != f.processing.len() {
		return fmt.Errorf("PROCESSING index holds %d entries for %d objects", f.processing.len(), procs)
	}
	var capacity, totalUsed uint64
	for i, s := range f.segOrder {
		if i > 0 && f.segOrder[i-1].id >= s.id {
			return fmt.Errorf("segment order broken at %q", s.id)
		}
		if f.segments[s.id] != s || f.segNames[s.name] != s {
			return fmt.Errorf("segment %q missing from an index", s.id)
		}
		sess, ok := f.sessions[s.clientID]
		if !ok || !slices.Contains(sess.segments, s) {
			return fmt.Errorf("segment %q is not in the session of client %q", s.id, s.clientID)
		}
		if s.objs.len() != onSeg[s] {
			return fmt.Errorf("segment %q's object index holds %d keys for %d objects", s.id, s.objs.len(), onSeg[s])
		}
		u := used[s]
		slices.SortFunc(u, func(a, b freeRange) int { return cmp.Compare(a.off, b.off) })
		want, ok := rebuildAllocator(s.size, u)
		if !ok {
			return fmt.Errorf("buffers overlap or overflow in segment %q", s.id)
		}
		if got := s.alloc.extents(); !slices.Equal(got, want.extents()) || s.alloc.free != want.free {
			return fmt.Errorf("segment %q: free extents %v, expected %v", s.id, got, want.extents())
		}
		capacity += s.size
		totalUsed += s.size - s.alloc.free
	}
	if len(f.segments) != len(f.segOrder) || len(f.segNames) != len(f.segOrder) {
		return fmt.Errorf("segment indexes disagree: %d/%d/%d", len(f.segments), len(f.segNames), len(f.segOrder))
	}
	if capacity != f.capacity || totalUsed != f.used {
		return fmt.Errorf("capacity/used counters %d/%d, actual %d/%d", f.capacity, f.used, capacity, totalUsed)
	}
	if len(f.sessions) != f.deadlines.Len() {
		return fmt.Errorf("%d sessions but %d deadlines", len(f.sessions), f.deadlines.Len())
	}
	i := 0
	for _, run := range f.Ring().runs {
		for _, e := range run {
			if want := f.appliedSeq - uint64(f.ring.len()-1-i); e.seq != want {
				return fmt.Errorf("export ring entry %d has seq %d, expected %d", i, e.seq, want)
			}
			i++
		}
	}
	return f.deferral.check(f)
}

// check: every waiting REMOVE is in the queue where the map says, the head
// is live, and a removed key's waiting REMOVE is not behind its tombstone.
func (d *deferral) check(f *FSM) error {
	if len(d.at) > 0 && d.direct == 0 {
		return fmt.Errorf("%d REMOVEs deferred with deferral off", len(d.at))
	}
	for key, pos := range d.at {
		if pos < d.first || pos-d.first >= uint64(len(d.queue)) || d.queue[pos-d.first].key != key {
			return fmt.Errorf("deferred REMOVE of %q is not at queue position %d", key, pos)
		}
		if t, ok := f.tombstones.Get(tombstone{key: key}); ok && t.keySeq < d.queue[pos-d.first].keySeq {
			return fmt.Errorf("deferred REMOVE of %q has key sequence %d past its tombstone's %d", key, d.queue[pos-d.first].keySeq, t.keySeq)
		}
	}
	if len(d.queue) > 0 {
		if pos, ok := d.at[d.queue[0].key]; !ok || pos != d.first {
			return fmt.Errorf("the deferred queue's head %q is not waiting", d.queue[0].key)
		}
	}
	return nil
}
