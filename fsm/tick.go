package fsm

import (
	"math/bits"
	"slices"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
)

// tick applies the renewals and pings the leader batched, then does every
// time-driven change: client expiry, stale PutStart reclaim, key-sequence
// expiry and eviction. Each node runs it on the same inputs, so no eviction
// needs its own log entry.
func (f *FSM) tick(c *Tick) Result {
	f.advance(c.NowMs)
	for _, r := range c.Renewals {
		o, ok := f.getObject(r.Key)
		if !ok {
			continue
		}
		n := *o
		n.leaseMs = lease.Extend(n.leaseMs, r.AtMs, f.params.LeaseTTLMs)
		if n.softPin {
			n.softPinMs = lease.Extend(n.softPinMs, r.AtMs, f.params.SoftPinTTLMs)
		}
		if n.leaseMs != o.leaseMs || n.softPinMs != o.softPinMs {
			f.putObject(r.Key, &n)
		}
	}
	for _, p := range c.Pings {
		if d, ok := f.deadlines.Deadline(p.ClientID); ok {
			f.deadlines.Set(p.ClientID, lease.Extend(d, p.AtMs, f.params.ClientTTLMs))
		}
	}
	var res Result
	res.Removed = f.expireSessions()
	res.Removed += f.reclaimStalePuts()
	f.expireTombstones()
	if c.Evict {
		res.Evicted = f.evict()
	}
	res.Removed += res.Evicted
	return res
}

// expireSessions ends every session whose deadline has passed, in deadline
// order (ties by client id), unmounting its segments.
func (f *FSM) expireSessions() (removed uint64) {
	for {
		id, d, ok := f.deadlines.Peek()
		if !ok || lease.Active(d, f.nowMs) {
			return removed
		}
		f.deadlines.Pop()
		s := f.sessions[id]
		delete(f.sessions, id) // first, so dropSegments leaves s.segments alone
		if len(s.segments) > 0 {
			removed += f.dropSegments(s.segments, oplog.SourceClientExpired)
		}
	}
}

// reclaimStalePuts drops PROCESSING objects older than PutStartReleaseMs:
// their writer is gone and their space is wanted back.
func (f *FSM) reclaimStalePuts() uint64 {
	var stale []procItem
	f.processing.Ascend(func(p procItem) bool {
		if p.putStartMs+f.params.PutStartReleaseMs > f.nowMs {
			return false
		}
		stale = append(stale, p)
		return true
	})
	for _, p := range stale {
		o, _ := f.getObject(p.key)
		f.dropObject(p.key, o, oplog.OpRemove, oplog.SourceDiscard)
	}
	return uint64(len(stale))
}

// mulLess reports a*b < c*d without overflow.
func mulLess(a, b, c, d uint64) bool {
	h1, l1 := bits.Mul64(a, b)
	h2, l2 := bits.Mul64(c, d)
	return h1 < h2 || (h1 == h2 && l1 < l2)
}

// mulDiv returns a*b/c for c > 0, saturating at the maximum uint64.
func mulDiv(a, b, c uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return ^uint64(0)
	}
	q, _ := bits.Div64(hi, lo, c)
	return q
}

type evictCandidate struct {
	leaseMs int64
	ord     int // position in key order: ties on the lease go by key
	key     string
	obj     *object
}

func (a *evictCandidate) less(b *evictCandidate) bool {
	return a.leaseMs < b.leaseMs || (a.leaseMs == b.leaseMs && a.ord < b.ord)
}

// evict is Mooncake's BatchEvict, run by a Tick the leader marked because
// usage was over the high watermark or a PutStart failed for space: free at
// least EvictionRatio of capacity. Candidates are complete objects whose lease has
// ended, smallest lease deadline first (ties by key); soft-pinned objects
// only in a second pass, if allowed.
func (f *FSM) evict() uint64 {
	f.needSpace = false
	target := mulDiv(f.capacity, f.params.EvictionRatioPPM, ppm)
	plain := make([]evictCandidate, 0, f.objects.Len())
	var pinned []evictCandidate
	f.objects.Ascend(func(it objItem) bool {
		o := it.obj
		if !o.complete() || f.leased(o) {
			return true
		}
		c := evictCandidate{f.effectiveLease(o), len(plain) + len(pinned), it.key, o}
		if o.softPin && lease.Active(o.softPinMs, f.nowMs) {
			pinned = append(pinned, c)
		} else {
			plain = append(plain, c)
		}
		return true
	})
	victims, freed := smallestUntil(plain, target, nil, 0)
	if freed < target && f.params.AllowEvictSoftPinned {
		victims, _ = smallestUntil(pinned, target, victims, freed)
	}
	f.ring = slices.Grow(f.ring, len(victims))
	f.tombQueue = slices.Grow(f.tombQueue, len(victims))
	for _, c := range victims {
		f.dropObject(c.key, c.obj, oplog.OpRemove, oplog.SourceEvict)
	}
	return uint64(len(victims))
}

// smallestUntil appends to out the candidates of cs in eviction order until
// the bytes they hold bring freed to target. It heapifies cs and pops, which
// is O(n + k log n) for k victims of n candidates: a full sort would cost
// more, and there are many more candidates than victims.
func smallestUntil(cs []evictCandidate, target uint64, out []evictCandidate, freed uint64) ([]evictCandidate, uint64) {
	for i := len(cs)/2 - 1; i >= 0; i-- {
		siftDown(cs, i)
	}
	for len(cs) > 0 && freed < target {
		out = append(out, cs[0])
		freed += cs[0].obj.heldBytes()
		last := len(cs) - 1
		cs[0] = cs[last]
		cs = cs[:last]
		siftDown(cs, 0)
	}
	return out, freed
}

func siftDown(h []evictCandidate, i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[r].less(&h[l]) {
			m = r
		}
		if !h[m].less(&h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func (o *object) heldBytes() uint64 {
	var n uint64
	for _, r := range o.replicas {
		for _, b := range r.buffers {
			n += b.length
		}
	}
	return n
}

// promote is the one-time cleanup of a new leader (DESIGN.md "Promotion"):
// renewals and pings of the old leader's last tick may be lost, so every
// object is leased and every session extended as if just renewed. The
// object lease is a floor rather than a write to each object: O(1) however
// many objects there are. PROCESSING puts stay. Objects without a valid
// replica cannot exist here — unmount drops them in the same command — so
// there is nothing else to clean.
func (f *FSM) promote(c *Promote) Result {
	if err := c.Params.Validate(); err != nil {
		return Result{Err: err}
	}
	f.advance(c.NowMs)
	f.params = c.Params
	f.leaderID, f.leaderAddr, f.term = c.LeaderID, c.LeaderAddr, c.Term
	f.leaseFloorMs = max(f.leaseFloorMs, f.nowMs+f.params.LeaseTTLMs)
	for id := range f.sessions {
		d, _ := f.deadlines.Deadline(id)
		f.deadlines.Set(id, lease.Extend(d, f.nowMs, f.params.ClientTTLMs))
	}
	if f.params.ExportRingCap == 0 {
		f.ring = nil
	}
	return Result{}
}

func (f *FSM) exported(c *Exported) Result {
	if c.Seq > f.appliedSeq {
		return failed(errcode.InvalidParams, "exported seq %d is beyond the last produced seq %d", c.Seq, f.appliedSeq)
	}
	if len(f.ring) == 0 || c.Seq < f.ring[0].SequenceID {
		return Result{}
	}
	n := min(c.Seq-f.ring[0].SequenceID+1, uint64(len(f.ring)))
	if n == uint64(len(f.ring)) {
		f.ring = nil // let the exported entries go; a snapshot may still hold the old slice
	} else {
		f.ring = f.ring[n:]
	}
	return Result{}
}

// EvictionDue reports whether the next Tick should evict: usage is over
// the watermark or a PutStart failed for space since the last eviction. The
// leader then marks the Tick and holds reads until it is applied.
func (f *FSM) EvictionDue() bool {
	return f.needSpace || mulLess(f.capacity, f.params.HighWatermarkPPM, f.used, ppm)
}
