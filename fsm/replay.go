package fsm

import (
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// ReplayEntry applies e, the OpLog entry after the applied seq, to the
// state; on error the state is unchanged. It rebuilds a lost cluster from a
// snapshot plus the entries etcd holds after the snapshot's applied seq
// (`moonctl snapshot restore --offline --replay-etcd`). An entry says what
// changed, not which command changed it, so replay makes the change itself:
//
//   - PUT_END: the object exists, COMPLETE, exactly where the payload says.
//     An object the key already has (PROCESSING in the snapshot, or complete
//     from an earlier life) is dropped first, without export or tombstone:
//     the entry records its end.
//   - REMOVE, PUT_REVOKE: the key is gone and its key_sequence_id is kept in
//     a tombstone, as dropObject does.
//
// What an entry does not carry gets a neutral value: the writer's client id
// is "" (a later PutEnd or PutRevoke by the original client gets
// ILLEGAL_CLIENT instead of OK or INVALID_WRITE: harmless, the object is
// complete), the soft pin is off, and put start and read lease are the
// entry's timestamp (the new leader's Promote leases every object anyway).
//
// Segments, sessions and silent frees after the snapshot are not in the
// OpLog either, so replay resolves what contradicts the entries — the
// OpLog is the authority on where buffers live at its seq:
//
//   - a PUT_END on a segment mounted after the snapshot cannot be placed:
//     the key is dropped and its sequence kept, and the note says so (its
//     client remounts in the new cluster, like every client after a lost
//     master, and the object is a cache miss);
//   - a PUT_END on space the snapshot still gives to another object proves
//     the source freed it without an entry: a PROCESSING put abandoned and
//     replaced, or the replica a live object lost with one of its segments.
//     That replica (a PROCESSING put whole) is dropped and the note counts
//     it. So is space the snapshot holds for an upsert (the old replicas
//     of one in progress, a write it took over).
//
// Time moves with the entries: a write an upsert took over holds its space
// until a release time (its writer may still be writing), and the source
// gives it back at the first tick past it, without an entry; replay gives
// it back at the first entry past it.
//
// Other stale state stays as the snapshot had it (segments and sessions of
// departed clients) and goes when their sessions expire in the new cluster.
func (f *FSM) ReplayEntry(e oplog.Entry) (ReplayNote, error) {
	var note ReplayNote
	if e.SequenceID != f.appliedSeq+1 {
		if e.SequenceID <= f.appliedSeq {
			return note, errcode.New(errcode.OplogEntryNotFound,
				"replay: entry %d is not after applied seq %d: replay must go on with entry %d", e.SequenceID, f.appliedSeq, f.appliedSeq+1)
		}
		return note, errcode.New(errcode.OplogEntryNotFound,
			"replay: entry %d follows applied seq %d: the OpLog has a gap (entries cleaned up?)", e.SequenceID, f.appliedSeq)
	}
	if err := e.Verify(); err != nil {
		return note, err
	}
	if err := validateKey(e.Key); err != nil {
		return note, err
	}
	if e.KeySequenceID == 0 {
		return note, errcode.New(errcode.InvalidParams, "replay: entry %d: key_sequence_id is 0, sequences start at 1", e.SequenceID)
	}
	if f.replayDeferred(e) {
		f.appliedSeq, f.ring = e.SequenceID, fifo[ringEntry]{}
		return note, nil
	}
	old, exists := f.getObject(e.Key)
	// A live key's sequence only grows until an entry removes it, so a
	// smaller one means the snapshot and the OpLog are not of one cluster.
	// A tombstone is no such proof: the source forgets it after
	// KeySeqRetainMs (which a Promote may have changed unseen) and the key
	// may then restart at 1.
	if exists && e.KeySequenceID <= old.keySeq {
		return note, errcode.New(errcode.InvalidParams,
			"replay: entry %d: key %q has key_sequence_id %d but the state already has %d: the snapshot and the OpLog are not of one cluster",
			e.SequenceID, e.Key, e.KeySequenceID, old.keySeq)
	}
	switch e.OpType {
	case oplog.OpPutEnd:
		n, err := f.replayPutEnd(e, old, exists)
		if err != nil {
			return note, err
		}
		note = n
	case oplog.OpRemove, oplog.OpPutRevoke:
		f.replayRemoval(e, old, exists)
	default:
		return note, errcode.New(errcode.InvalidParams, "replay: entry %d has unknown op type %v", e.SequenceID, e.OpType)
	}
	f.appliedSeq = e.SequenceID
	// etcd is written in seq order without gaps, so holding e means it holds
	// every earlier entry: nothing in the ring (all ≤ e's seq) still needs
	// exporting, and replayed entries are never added to it.
	f.ring = fifo[ringEntry]{}
	return note, nil
}

// replayDeferred reports whether e is a REMOVE the snapshot's source had
// deferred (a bulk removal's): the snapshot already lacks the object, and
// may hold the key again, written since; e only takes it off the queue.
func (f *FSM) replayDeferred(e oplog.Entry) bool {
	d := &f.deferral
	pos, ok := d.at[e.Key]
	if !ok || e.OpType != oplog.OpRemove || d.queue[pos-d.first].keySeq != e.KeySequenceID {
		return false
	}
	r, _ := d.take(e.Key)
	f.replayAdvance(e.TimestampMs)
	f.rebury(r) // as the source did when it exported e
	return true
}

// ReplayNote says how an entry was reconciled with the snapshot.
type ReplayNote struct {
	// Skipped: a PUT_END on a segment the snapshot does not have; the key
	// was dropped instead.
	Skipped bool
	// StaleDropped counts replicas (a PROCESSING put counts whole) the
	// source had freed without an entry, dropped to make room.
	StaleDropped int
}

// ReplayEntries replays es in order and returns how many were applied
// before the first error, and the notes summed.
func (f *FSM) ReplayEntries(es []oplog.Entry) (int, ReplayNote, error) {
	var sum ReplayNote
	for i, e := range es {
		n, err := f.ReplayEntry(e)
		if err != nil {
			return i, sum, err
		}
		sum.StaleDropped += n.StaleDropped
		sum.Skipped = sum.Skipped || n.Skipped
	}
	return len(es), sum, nil
}

// replayRemoval: the key is gone, its sequence kept.
func (f *FSM) replayRemoval(e oplog.Entry, old *object, exists bool) {
	f.replayAdvance(e.TimestampMs)
	if exists {
		f.discard(e.Key, old)
	}
	// bury stamps f.nowMs, which is e's timestamp: entries are produced at
	// command time, which never goes back.
	f.bury(e.Key, e.KeySequenceID)
}

func (f *FSM) replayPutEnd(e oplog.Entry, old *object, exists bool) (ReplayNote, error) {
	var note ReplayNote
	p, err := oplog.DecodePutEndPayload(e.Payload)
	if err != nil {
		return note, err
	}
	replicas, err := f.replayReplicas(e, p)
	if errcode.Of(err) == errcode.SegmentNotFound {
		f.replayRemoval(e, old, exists)
		note.Skipped = true
		return note, nil
	}
	if err != nil {
		return note, err
	}
	if a, b, ok := selfOverlap(replicas); ok {
		return note, errcode.New(errcode.InvalidParams, "replay: entry %d: key %q: buffers %s@%#x+%d and %#x+%d overlap each other",
			e.SequenceID, e.Key, a.seg.id, a.seg.base+a.offset, a.length, b.seg.base+b.offset, b.length)
	}
	// Nothing can fail from here on. The old object's buffers are freed
	// first, since the new ones may reuse them.
	f.replayAdvance(e.TimestampMs)
	if exists {
		f.discard(e.Key, old)
	}
	if _, ok := f.takeBuffers(replicas); !ok {
		note.StaleDropped = f.dropStale(replicas)
		if bad, ok := f.takeBuffers(replicas); !ok {
			return note, errcode.New(errcode.InternalError, "replay: entry %d: buffer %s@%#x+%d still taken after dropping stale data",
				e.SequenceID, bad.seg.id, bad.seg.base+bad.offset, bad.length)
		}
	}
	f.unbury(e.Key) // its queue entry stays behind and is skipped at expiry
	f.putObject(e.Key, &object{
		size:       p.Size,
		putStartMs: e.TimestampMs,
		leaseMs:    e.TimestampMs,
		keySeq:     e.KeySequenceID,
		replicas:   replicas,
	})
	return note, nil
}

// replayAdvance moves time to an entry's and, as a Tick would, gives back
// the space of taken-over writes whose release time has come.
func (f *FSM) replayAdvance(nowMs int64) {
	f.advance(nowMs)
	f.releaseDiscarded()
}

func overlap(a, b buffer) bool {
	return a.seg == b.seg && a.offset < b.offset+b.length && b.offset < a.offset+a.length
}

// selfOverlap finds two buffers of rs that overlap: an entry no allocator
// could have produced.
func selfOverlap(rs []replica) (buffer, buffer, bool) {
	var all []buffer
	for _, r := range rs {
		all = append(all, r.buffers...)
	}
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if overlap(all[i], all[j]) {
				return all[i], all[j], true
			}
		}
	}
	return buffer{}, buffer{}, false
}

// dropStale removes from other objects every replica that overlaps rs — the
// source freed it without an entry, or it could not have allocated rs — and
// a PROCESSING put whole, and frees the space held for upserts that
// overlaps rs. It scans every object, which only this rare path of an
// offline tool does, and returns how many replicas it dropped.
func (f *FSM) dropStale(rs []replica) int {
	hits := func(r replica) bool {
		for _, b := range r.buffers {
			for _, n := range rs {
				for _, nb := range n.buffers {
					if overlap(b, nb) {
						return true
					}
				}
			}
		}
		return false
	}
	type change struct {
		key  string
		obj  *object
		keep []replica
		lost []replica
	}
	var changes []change
	f.objects.Ascend(func(it objItem) bool {
		var ch change
		for _, r := range it.obj.replicas {
			if hits(r) {
				ch.lost = append(ch.lost, r)
			} else {
				ch.keep = append(ch.keep, r)
			}
		}
		if len(ch.lost) > 0 {
			ch.key, ch.obj = it.key, it.obj
			changes = append(changes, ch)
		}
		return true
	})
	dropped := 0
	for _, ch := range changes {
		if ch.obj.processing() || len(ch.keep) == 0 {
			dropped += len(ch.obj.replicas)
			f.discard(ch.key, ch.obj)
			continue
		}
		dropped += len(ch.lost)
		f.freeBuffers(ch.lost)
		n := *ch.obj
		n.replicas = ch.keep
		f.putObject(ch.key, &n)
	}
	return dropped + f.dropHeld(hits)
}

// replayReplicas checks a PUT_END payload against the mounted segments and
// returns its replicas, COMPLETE, in payload order.
func (f *FSM) replayReplicas(e oplog.Entry, p oplog.PutEndPayload) ([]replica, error) {
	bad := func(format string, args ...any) error {
		return errcode.New(errcode.InvalidParams, "replay: entry %d: key %q: "+format,
			append([]any{e.SequenceID, e.Key}, args...)...)
	}
	if len(p.Replicas) == 0 || len(p.Replicas) > MaxReplicas {
		return nil, bad("%d replicas, an object has 1..%d", len(p.Replicas), MaxReplicas)
	}
	n := 0
	for _, r := range p.Replicas {
		n += len(r.Buffers)
	}
	bufs := make([]buffer, 0, n)
	replicas := make([]replica, len(p.Replicas))
	for i, r := range p.Replicas {
		if len(r.Buffers) == 0 || len(r.Buffers) > MaxSlices {
			return nil, bad("replica %d has %d buffers, a replica has 1..%d", i, len(r.Buffers), MaxSlices)
		}
		first := len(bufs)
		var sum uint64
		for _, b := range r.Buffers {
			s, ok := f.segments[b.SegmentID]
			if !ok || s.name != b.SegmentName {
				return nil, errcode.New(errcode.SegmentNotFound,
					"replay: entry %d: key %q has a buffer on segment %q (%q), which is not mounted in the snapshot: it was mounted after it, which the OpLog does not record",
					e.SequenceID, e.Key, b.SegmentID, b.SegmentName)
			}
			off := b.Address - s.base
			if b.Size == 0 || b.Address < s.base || off+b.Size < off || off+b.Size > s.size {
				return nil, bad("buffer %s@%#x+%d does not lie inside segment %q [%#x, %#x)",
					b.SegmentID, b.Address, b.Size, s.id, s.base, s.base+s.size)
			}
			if sum+b.Size < sum {
				return nil, bad("replica %d: buffer sizes overflow 64 bits", i)
			}
			sum += b.Size
			bufs = append(bufs, buffer{s, off, b.Size})
		}
		if sum != p.Size {
			return nil, bad("replica %d holds %d bytes, the object is %d", i, sum, p.Size)
		}
		replicas[i] = replica{status: Complete, buffers: bufs[first:len(bufs):len(bufs)]}
	}
	return replicas, nil
}

// takeBuffers allocates exactly the buffers of rs, all or none; on failure
// it returns the first buffer that was not free.
func (f *FSM) takeBuffers(rs []replica) (buffer, bool) {
	for i := range rs {
		for j, b := range rs[i].buffers {
			if b.seg.alloc.allocAt(b.offset, b.length) {
				f.used += b.length
				continue
			}
			f.freeBuffers(rs[:i])
			f.freeBuffers([]replica{{buffers: rs[i].buffers[:j]}})
			return b, false
		}
	}
	return buffer{}, true
}

// discard drops key without export or tombstone: replay records what the
// entry says instead.
func (f *FSM) discard(key string, o *object) {
	f.freeBuffers(o.replicas)
	f.releaseReplaced(key, 0) // the OpLog knows no lease: replay holds nothing for readers
	f.forget(key)
}

// forget takes o out of the object tree and its indexes.
func (f *FSM) forget(key string) {
	if it, ok := f.objects.Delete(objItem{key: key}); ok {
		unindexSegments(key, it.obj)
	}
	f.indexKey(key, objItem{})
	f.processing.remove(key)
}
