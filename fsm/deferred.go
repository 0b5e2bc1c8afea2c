package fsm

import (
	"github.com/moonraft/moonraft/oplog"
)

// Bulk removals — an unmount, a session's expiry, an eviction round, a
// drain, RemoveAll and RemoveByRegex — can remove hundreds of thousands of
// objects in one command. The state loses them at once, as before, but
// past the first bulkDirect of a command their REMOVEs wait in the deferred
// queue instead of the export ring, and enter the ring as the leader
// releases them (ReleaseRemovals) at the pace etcd takes entries: a client
// leaving with a million objects does not put a million entries ahead of
// every other client's writes. A key written again while its REMOVE waits
// has that REMOVE exported first, so every key's entries keep their
// key_sequence_id order (emit).

// deferredRemoval is a REMOVE waiting for its turn in the export ring.
type deferredRemoval struct {
	key    string
	keySeq uint64
	atMs   int64 // when the object was removed
	src    oplog.Source
}

// deferral is the deferred queue. An entry of queue is live while
// at[key] holds its position (first + its index); one exported ahead of
// its turn is left in place and skipped when its turn comes.
type deferral struct {
	// direct is how many REMOVEs one bulk removal exports at once; 0 means
	// deferral is off (a cluster that has applied no ReleaseRemovals yet:
	// the earlier rule, every REMOVE at once).
	direct uint64
	queue  []deferredRemoval
	first  uint64
	at     map[string]uint64
}

// bulk is one bulk command's removals: it counts their REMOVEs exported at
// once and, with collect, keeps their buffers for the command to free
// together (FSM.freeAll) once it has removed them all.
type bulk struct {
	direct  uint64
	collect bool
	freed   []buffer
}

// defers reports whether the next REMOVE of b waits in the queue: once b
// has exported direct of them, or while others wait (they go first).
func (b *bulk) defers(f *FSM) bool {
	if b == nil || f.deferral.direct == 0 {
		return false
	}
	if b.direct < f.deferral.direct && len(f.deferral.at) == 0 {
		b.direct++
		return false
	}
	return true
}

// deferRemove queues the REMOVE of key; one of the same key already
// waiting is exported first.
func (f *FSM) deferRemove(key string, keySeq uint64, src oplog.Source) {
	f.flushDeferred(key)
	d := &f.deferral
	if d.at == nil {
		d.at = map[string]uint64{}
	}
	d.at[key] = d.first + uint64(len(d.queue))
	d.queue = append(d.queue, deferredRemoval{key: key, keySeq: keySeq, atMs: f.nowMs, src: src})
}

// flushDeferred exports key's waiting REMOVE, if any, ahead of its turn.
func (f *FSM) flushDeferred(key string) {
	if r, ok := f.deferral.take(key); ok {
		f.emit(oplog.OpRemove, r.key, nil, r.keySeq, r.src)
		f.rebury(r)
	}
}

// take removes key's waiting REMOVE from the queue and returns it.
func (d *deferral) take(key string) (deferredRemoval, bool) {
	pos, ok := d.at[key]
	if !ok {
		return deferredRemoval{}, false
	}
	delete(d.at, key)
	r := d.queue[pos-d.first]
	d.trimHead()
	return r, true
}

// rebury is r's export for the key's tombstone: kept while r waited
// (expireTombstones), it now lasts KeySeqRetainMs from here, as an etcd
// watcher's tombstone from the entry's timestamp does, so neither forgets
// the key's sequence before the other.
func (f *FSM) rebury(r deferredRemoval) {
	if t, ok := f.tombstones.Get(tombstone{key: r.key}); ok && t.keySeq == r.keySeq {
		f.bury(r.key, r.keySeq)
	}
}

// trimHead drops the entries exported ahead of their turn from the head,
// so the head is live (or the queue empty, its memory let go).
func (d *deferral) trimHead() {
	for len(d.queue) > 0 {
		if at, ok := d.at[d.queue[0].key]; ok && at == d.first {
			return
		}
		d.queue = d.queue[1:]
		d.first++
	}
	d.queue = nil
}

func (f *FSM) releaseRemovals(c *ReleaseRemovals) Result {
	f.advance(c.NowMs)
	d := &f.deferral
	d.direct = max(c.Direct, 1)
	limit := c.Max
	if cap := f.params.ExportRingCap; cap > 0 {
		limit = min(limit, cap-min(cap, uint64(f.ring.len())))
	}
	var n uint64
	for ; n < limit && len(d.queue) > 0; n++ {
		f.flushDeferred(d.queue[0].key) // the head is live: trimHead keeps it so
	}
	return Result{Released: n}
}

// live returns the waiting REMOVEs, oldest first, as a new slice.
func (d *deferral) live() []deferredRemoval {
	out := make([]deferredRemoval, 0, len(d.at))
	for i, r := range d.queue {
		if at, ok := d.at[r.key]; ok && at == d.first+uint64(i) {
			out = append(out, r)
		}
	}
	return out
}

// DeferredRemovals is the count of REMOVEs waiting to enter the export
// ring, and the time the oldest of them was removed (ok false for none).
func (f *FSM) DeferredRemovals() (n int, oldestMs int64, ok bool) {
	d := &f.deferral
	if len(d.queue) == 0 {
		return 0, 0, false
	}
	return len(d.at), d.queue[0].atMs, true
}

// DeferringRemovals reports whether deferral is on (a ReleaseRemovals has
// been applied).
func (f *FSM) DeferringRemovals() bool { return f.deferral.direct > 0 }
