package fsm

import (
	"slices"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
)

// upsertStart is Mooncake's UpsertStart (master_service.cpp, 3b5a594):
//   - a key being written is taken over at once: the old write's buffers
//     are held until PutStartReleaseMs from now (its writer may still be
//     writing) and the upsert goes on as a put of a new key;
//   - an absent key is a put;
//   - a complete key that a reader holds a lease on (the promotion's floor
//     included) is written into new buffers, as a resize is, and its old
//     ones stay allocated, neither rewritten nor reused, until that lease
//     ends: from UpsertEnd on they wait with the discarded buffers, which a
//     tick frees (issue 42). Mooncake refuses only while a copy or offload
//     task holds a replica, never for a reader; without Copy (an older
//     leader's command) the upsert is refused OBJECT_REPLICA_BUSY;
//   - otherwise, the same slice layout outside draining segments is
//     rewritten in place: its replicas go back to PROCESSING until
//     UpsertEnd; any other layout gets new buffers, and the old ones are
//     released at UpsertEnd.
//
// Pins survive the overwrite. UpsertEnd and UpsertRevoke are PutEnd and
// PutRevoke; the end exports a PUT_END with the next key_sequence_id.
//
// The OpLog never leaves a follower holding a COMPLETE object whose bytes
// are being rewritten or are freed: an in-place rewrite, and a takeover of
// a resizing upsert (whose old buffers go back at once), first export a
// REMOVE with source "upsert". A resizing upsert exports nothing at its
// start: the old bytes stay intact until its PUT_END replaces them.
func (f *FSM) upsertStart(c *UpsertStart) Result {
	f.advance(c.NowMs)
	total, err := validatePutStart(&c.PutStart)
	if err != nil {
		return Result{Err: err}
	}
	if err := f.exportFull(); err != nil {
		return Result{Err: err}
	}
	o, ok := f.getObject(c.Key)
	if ok && o.processing() {
		f.takeOver(c.Key, o, true)
		ok = false
	}
	if !ok {
		return f.putStart(&c.PutStart)
	}
	leased := f.leased(o)
	if leased && !c.Copy {
		return failed(errcode.ObjectReplicaBusy,
			"key %q is leased to a reader until %d ms (now %d): overwriting it would change what the reader reads; retry after the lease",
			c.Key, f.effectiveLease(o), f.nowMs)
	}
	n := *o
	n.clientID = f.sharedClientID(c.ClientID)
	n.putStartMs = f.nowMs
	n.softPin = o.softPin || c.SoftPin
	if !leased && f.sameLayout(o, c.SliceLengths) {
		n.replicas = restatus(o.replicas, Processing)
		n.keySeq++
		f.emit(oplog.OpRemove, c.Key, nil, n.keySeq, oplog.SourceUpsert)
	} else {
		replicas, ok := f.allocate(&c.PutStart, o.keySeq)
		if !ok {
			f.needSpace = true
			return failed(errcode.NoAvailableHandle,
				"no room for %d new replica(s) of %d bytes in %d segment(s); eviction will run at the next tick",
				c.ReplicaNum, total, len(f.segOrder))
		}
		n.size = total
		n.replicas = replicas
		if leased {
			// The readers' lease, floor included, goes with the write: its
			// end is when the old buffers may go (releaseReplaced).
			n.leaseMs = f.effectiveLease(o)
		}
		f.replaced[c.Key] = o.replicas
	}
	f.putObject(c.Key, &n)
	return Result{Replicas: n.descriptors()}
}

// sameLayout reports whether o's replicas have exactly the slices asked
// for and none lies on a draining segment: then an upsert rewrites them.
func (f *FSM) sameLayout(o *object, lengths []uint64) bool {
	for _, r := range o.replicas {
		if len(r.buffers) != len(lengths) {
			return false
		}
		for i, b := range r.buffers {
			if b.length != lengths[i] || b.seg.draining {
				return false
			}
		}
	}
	return true
}

// takeOver takes a write in progress away from its writer and leaves the
// key as if removed, its sequence kept for the next write. With hold its
// buffers stay allocated until PutStartReleaseMs from now, since its writer
// may still be writing (an upsert takes over at once); without, they are
// freed (a put takes over only a write older than the discard timeout,
// whose writer is taken for gone). The old replicas of a resizing upsert go
// back at once, nobody writes them; a follower still has them as the key's
// value, so it is told with a REMOVE first.
func (f *FSM) takeOver(key string, o *object, hold bool) {
	if hold {
		f.discarded = append(f.discarded, discard{releaseMs: f.nowMs + f.params.PutStartReleaseMs, replicas: o.replicas})
	} else {
		f.freeBuffers(o.replicas)
	}
	seq := o.keySeq
	if _, resizing := f.replaced[key]; resizing {
		seq++
		f.emit(oplog.OpRemove, key, nil, seq, oplog.SourceUpsert)
	}
	f.releaseReplaced(key, o.leaseMs)
	f.forget(key)
	f.bury(key, seq)
}

// releaseReplaced returns the old replicas of key's upsert, if any, or
// holds them with the discarded buffers until leaseMs if a reader's lease
// still covers them then (an upsert of a leased object).
func (f *FSM) releaseReplaced(key string, leaseMs int64) {
	old, ok := f.replaced[key]
	if !ok {
		return
	}
	delete(f.replaced, key)
	if lease.Active(leaseMs, f.nowMs) {
		f.discarded = append(f.discarded, discard{releaseMs: leaseMs, replicas: old})
	} else {
		f.freeBuffers(old)
	}
}

// releaseDiscarded returns the discarded buffers whose time has come.
func (f *FSM) releaseDiscarded() {
	f.discarded = slices.DeleteFunc(f.discarded, func(d discard) bool {
		if d.releaseMs > f.nowMs {
			return false
		}
		f.freeBuffers(d.replicas)
		return true
	})
}

// dropHeldOn frees the replaced and discarded buffers that lie on gone
// segments, before the segments go (dropSegments).
func (f *FSM) dropHeldOn(gone map[*segment]bool) {
	f.dropHeld(func(r replica) bool {
		return slices.ContainsFunc(r.buffers, func(b buffer) bool { return gone[b.seg] })
	})
}

// dropHeld frees every replaced or discarded replica that drop selects and
// returns how many it freed. Freeing is order-independent, so map order
// does not matter.
func (f *FSM) dropHeld(drop func(replica) bool) int {
	n := 0
	keep := func(rs []replica) (kept []replica) {
		for _, r := range rs {
			if drop(r) {
				f.freeBuffers([]replica{r})
				n++
			} else {
				kept = append(kept, r)
			}
		}
		return kept
	}
	for key, old := range f.replaced {
		if kept := keep(old); len(kept) > 0 {
			f.replaced[key] = kept
		} else {
			delete(f.replaced, key)
		}
	}
	for i := range f.discarded {
		f.discarded[i].replicas = keep(f.discarded[i].replicas)
	}
	f.discarded = slices.DeleteFunc(f.discarded, func(d discard) bool { return len(d.replicas) == 0 })
	return n
}
