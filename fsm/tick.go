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
		leaseMs, softPinMs := lease.Extend(o.leaseMs, r.AtMs, f.params.LeaseTTLMs), o.softPinMs
		if o.softPin {
			softPinMs = lease.Extend(softPinMs, r.AtMs, f.params.SoftPinTTLMs)
		}
		switch {
		case leaseMs == o.leaseMs && softPinMs == o.softPinMs:
		case o.gen == f.gen: // in no snapshot: a read-heavy load renews without a copy or a second descent
			o.leaseMs, o.softPinMs = leaseMs, softPinMs
		default:
			n := *o
			n.leaseMs, n.softPinMs = leaseMs, softPinMs
			f.putObject(r.Key, &n)
		}
	}
	for _, p := range c.Pings {
		if d, ok := f.deadlines.Deadline(p.ClientID); ok {
			f.deadlines.Set(p.ClientID, lease.Extend(d, p.AtMs, f.params.ClientTTLMs))
		}
	}
	var res Result
	if c.ExpireMax > 0 {
		f.expiryBounded = true
	}
	res.Removed = f.expireSessions(c.ExpireMax)
	res.Removed += f.reclaimStalePuts()
	f.releaseDiscarded()
	f.expireTombstones()
	if c.Evict {
		res.Evicted = f.evict()
	}
	res.Removed += res.Evicted
	return res
}

// expireSessions ends the sessions whose deadline has passed, in deadline
// order (ties by client id), unmounting their segments: all of them if max
// is 0, else until their segments have held max objects (Tick.ExpireMax).
func (f *FSM) expireSessions(max uint64) (removed uint64) {
	var shared *bulk
	if max > 0 {
		shared = &bulk{}
	}
	for held := uint64(0); max == 0 || held < max; {
		id, d, ok := f.deadlines.Peek()
		if !ok || lease.Active(d, f.nowMs) {
			return removed
		}
		f.deadlines.Pop()
		s := f.sessions[id]
		delete(f.sessions, id) // first, so dropSegments leaves s.segments alone
		f.sessionChanged(id, false)
		if len(s.segments) == 0 {
			continue
		}
		for _, seg := range s.segments {
			held += uint64(seg.objs.len())
		}
		b := shared
		if b == nil {
			b = &bulk{}
		}
		removed += f.dropSegments(s.segments, oplog.SourceClientExpired, b)
	}
	return removed
}

// reclaimStalePuts drops PROCESSING objects older than PutStartReleaseMs:
// their writer is gone and their space is wanted back.
func (f *FSM) reclaimStalePuts() uint64 {
	stale := f.processing.startedBy(f.nowMs - f.params.PutStartReleaseMs)
	b := &bulk{}
	for _, p := range stale {
		o, _ := f.getObject(p.key)
		f.dropObjectIn(p.key, o, oplog.OpRemove, oplog.SourceDiscard, b)
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
	bytes   uint64
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
	if target == 0 {
		return 0
	}
	plain, pinned := victimHeap{target: target}, victimHeap{target: target}
	ord := 0
	f.objects.Ascend(func(it objItem) bool {
		o := it.obj
		if !o.complete() || f.leased(o) {
			return true
		}
		c := evictCandidate{f.effectiveLease(o), ord, o.heldBytes(), it.key, o}
		ord++
		if o.softPin && lease.Active(o.softPinMs, f.nowMs) {
			pinned.offer(c)
		} else {
			plain.offer(c)
		}
		return true
	})
	victims := plain.sorted()
	if plain.held < target && f.params.AllowEvictSoftPinned {
		// pinned holds the first of them for the whole target, so the
		// first of those cover what plain left.
		freed := plain.held
		for _, c := range pinned.sorted() {
			if freed >= target {
				break
			}
			victims = append(victims, c)
			freed += c.bytes
		}
	}
	b := &bulk{collect: true, freed: make([]buffer, 0, len(victims))}
	for _, c := range victims {
		f.dropObjectIn(c.key, c.obj, oplog.OpRemove, oplog.SourceEvict, b)
	}
	f.freeAll(b.freed)
	return uint64(len(victims))
}

// victimHeap keeps, of the candidates offered so far, the fewest that come
// first in eviction order and together hold at least target bytes (all of
// them while they hold less). It is a max-heap in eviction order: once the
// target is covered, a candidate that comes after the top is turned away
// with one comparison, and a candidate before it may push the last ones
// out. A pass over n candidates for k victims costs O(n log k) time and
// O(k) memory, where collecting and heapifying every candidate cost O(n)
// memory — most of a large eviction's time was that allocation.
type victimHeap struct {
	target, held uint64
	h            []evictCandidate
}

func (v *victimHeap) offer(c evictCandidate) {
	if v.held < v.target {
		// Until the target is covered every candidate is kept: no order
		// is needed yet, and when every candidate is a victim none ever is.
		v.h = append(v.h, c)
		if v.held += c.bytes; v.held >= v.target {
			for i := len(v.h)/2 - 1; i >= 0; i-- {
				v.siftDown(i)
			}
			v.trim()
		}
		return
	}
	if !c.less(&v.h[0]) {
		return
	}
	v.h = append(v.h, c)
	v.held += c.bytes
	for i := len(v.h) - 1; i > 0; {
		p := (i - 1) / 2
		if !v.h[p].less(&v.h[i]) {
			break
		}
		v.h[p], v.h[i] = v.h[i], v.h[p]
		i = p
	}
	v.trim()
}

// trim drops the last candidates while the others still cover the target.
func (v *victimHeap) trim() {
	for v.held-v.h[0].bytes >= v.target {
		v.held -= v.h[0].bytes
		last := len(v.h) - 1
		v.h[0] = v.h[last]
		v.h = v.h[:last]
		v.siftDown(0)
	}
}

func (v *victimHeap) siftDown(i int) {
	h := v.h
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h[l].less(&h[r]) {
			m = r
		}
		if !h[i].less(&h[m]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// sorted returns the kept candidates in eviction order.
func (v *victimHeap) sorted() []evictCandidate {
	slices.SortFunc(v.h, func(a, b evictCandidate) int {
		switch {
		case a.less(&b):
			return -1
		case b.less(&a):
			return 1
		}
		return 0
	})
	return v.h
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

// promote is the one-time cleanup of a new leader (docs/ARCHITECTURE.md, "A failover"):
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
	if c.SessionGraceMs < 0 || c.SessionGraceMs > MaxSessionGraceMs {
		return failed(errcode.InvalidParams, "session grace of %d ms: want 0 to %d", c.SessionGraceMs, MaxSessionGraceMs)
	}
	f.advance(c.NowMs)
	f.params = c.Params
	f.leaderID, f.leaderAddr, f.term = c.LeaderID, c.LeaderAddr, c.Term
	f.leaderMooncakeAddr = c.MooncakeAddr
	f.leaseFloorMs = max(f.leaseFloorMs, f.nowMs+f.params.LeaseTTLMs)
	for id := range f.sessions {
		d, _ := f.deadlines.Deadline(id)
		f.deadlines.Set(id, lease.Extend(d, f.nowMs, f.params.ClientTTLMs+c.SessionGraceMs))
	}
	if f.params.ExportRingCap == 0 {
		f.ring = fifo[ringEntry]{}
	}
	return Result{}
}

func (f *FSM) exported(c *Exported) Result {
	if c.Seq > f.appliedSeq {
		return failed(errcode.InvalidParams, "exported seq %d is beyond the last produced seq %d", c.Seq, f.appliedSeq)
	}
	if first, ok := f.ring.front(); ok && c.Seq >= first.seq {
		f.ring.drop(int(c.Seq - first.seq + 1))
	}
	return Result{}
}

// EvictionDue reports whether the next Tick should evict: usage is over
// the watermark or a PutStart failed for space since the last eviction. The
// leader then marks the Tick and holds reads until it is applied.
func (f *FSM) EvictionDue() bool {
	return f.needSpace || mulLess(f.capacity, f.params.HighWatermarkPPM, f.used, ppm)
}
