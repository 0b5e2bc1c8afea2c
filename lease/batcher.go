package lease

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Renewal says that a read at AtMs renewed Key's read lease (and soft pin).
type Renewal struct {
	Key  string
	AtMs int64
}

// Ping says that the client pinged at AtMs.
type Ping struct {
	ClientID string
	AtMs     int64
}

// numShards spreads concurrent readers over enough locks that they rarely
// meet; a power of two so the shard is a mask of the hash.
const numShards = 32

// promise is what reads of one key have promised since its last drain.
type promise struct {
	atMs     int64 // the latest read
	loggedMs int64 // the lease the log gave the key when it was read
	untilMs  int64 // the lease the reads returned
}

// recorded is one Renew, not yet merged into its shard's table.
type recorded struct {
	key     string
	hash    uint64 // of key, for the shard and its table
	p       promise
	softPin bool
}

// maxRecent bounds a shard's recent renewals between two merges: the
// ticker merges every shard at each tick, so reads reach it only when
// ticks are far apart.
const maxRecent = 4096

type shard struct {
	mu sync.Mutex
	// recent holds the renewals since the last merge. A read appends to it
	// rather than look its key up in renewals, a cache miss on a large
	// table; whoever reads renewals next (a drain, Len, a sweep, or a
	// full recent) merges it first.
	recent   []recorded
	renewals table
	soft     map[string]struct{} // the keys in renewals whose object is soft-pinned
	pings    map[string]int64    // client id -> latest AtMs
	// Keeps neighbouring shards' locks off one cache line, so readers on
	// different shards do not slow each other down.
	_ [64]byte
}

// Batcher collects read-lease renewals and client pings from many
// goroutines between two ticks, keeping only the latest per key and per
// client. The leader's ticker drains it into Tick commands. Safe for
// concurrent use.
//
// A renewal reaches the log when something needs it, not per read: a
// removal, an eviction or a segment drain first flushes every waiting
// renewal (Drain), and a new leader's Promote leases every object past any
// lease the old one returned. So a read-heavy load adds nothing to the log
// and nothing to the followers' work; regular ticks (DrainDue) carry the
// pings, the soft pins (which Promote does not cover, and which steer
// eviction) and, past a bound on what may wait, everything.
type Batcher struct {
	seed       maphash.Seed
	coalesceMs int64
	maxWaiting int
	exists     func(key string) bool
	nextSweep  atomic.Int64 // waiting keys past which DrainDue forgets gone ones
	shards     [numShards]shard
}

// NewBatcher returns an empty batcher. A regular tick (DrainDue) takes the
// renewal of a soft-pinned key once it extends the key's logged lease by
// coalesceMs or more, and keeps what waits bounded: it forgets the renewals
// of keys that no longer exist (exists reports whether the leader's state
// holds key), and takes every renewal once more than maxWaiting keys wait.
func NewBatcher(coalesceMs int64, maxWaiting int, exists func(key string) bool) *Batcher {
	b := &Batcher{
		seed:       maphash.MakeSeed(),
		coalesceMs: coalesceMs,
		maxWaiting: maxWaiting,
		exists:     exists,
	}
	b.nextSweep.Store(sweepFloor)
	for i := range b.shards {
		b.shards[i].soft = make(map[string]struct{})
		b.shards[i].pings = make(map[string]int64)
	}
	return b
}

// shard returns s's shard and s's hash, which the shard's table reuses.
// The shard only spreads lock contention; drains sort, so the random seed
// cannot make two leaders' Ticks differ.
func (b *Batcher) shard(s string) (*shard, uint64) {
	h := maphash.String(b.seed, s)
	return &b.shards[h&(numShards-1)], h
}

// Renew records that a read at atMs renewed key's lease: loggedMs is the
// deadline the log gives the key now, untilMs the lease the read returned,
// softPin whether the object is soft-pinned. Until a flush takes it, the
// removal flush and the read gate keep the returned lease (node/gate.go).
func (b *Batcher) Renew(key string, atMs, loggedMs, untilMs int64, softPin bool) {
	b.record(key, promise{atMs: atMs, loggedMs: loggedMs, untilMs: untilMs}, softPin)
}

// record keeps p for key until a flush takes it (Renew and Requeue).
func (b *Batcher) record(key string, p promise, softPin bool) {
	s, h := b.shard(key)
	s.mu.Lock()
	s.recent = append(s.recent, recorded{key: key, hash: h, p: p, softPin: softPin})
	if len(s.recent) >= maxRecent {
		s.merge()
	}
	s.mu.Unlock()
}

// merge, under mu, folds recent into renewals and soft: per key the
// latest of each time, and the soft pin if any read saw one.
func (s *shard) merge() {
	for _, r := range s.recent {
		s.renewals.merge(r.hash, r.key, r.p)
		if r.softPin {
			s.soft[r.key] = struct{}{}
		}
	}
	clear(s.recent) // the keys are not kept alive
	s.recent = s.recent[:0]
}

// Ping records that the client pinged at atMs.
func (b *Batcher) Ping(clientID string, atMs int64) {
	s, _ := b.shard(clientID)
	s.mu.Lock()
	if old, ok := s.pings[clientID]; !ok || atMs > old {
		s.pings[clientID] = atMs
	}
	s.mu.Unlock()
}

// Requeue puts back what a drain took for a Tick that may not have reached
// the log (its proposal failed): the next flush must still bring every
// lease a read returned to the log before a removal, or the removal breaks
// it. A renewal or ping logged twice changes nothing, so it does not matter
// whether the Tick was logged after all. A put-back renewal waits for a
// flush, as every renewal of a key that is not soft-pinned does.
func (b *Batcher) Requeue(renewals []Renewal, pings []Ping) {
	for _, r := range renewals {
		b.record(r.Key, promise{atMs: r.AtMs}, false)
	}
	for _, p := range pings {
		b.Ping(p.ClientID, p.AtMs)
	}
}

// Drain takes everything recorded so far — what a Tick needs before a
// removal or an eviction, which must see every lease a read returned —
// sorted by key and by client id so that the Tick's bytes do not depend on
// map order, and empties the batcher. Shards are drained one at a time: a
// record made during Drain lands in this batch or the next, never in
// neither.
func (b *Batcher) Drain() ([]Renewal, []Ping) {
	return b.drain(true)
}

// DrainDue is Drain for a regular tick: it takes every ping and the
// renewals of soft-pinned keys that extend the logged lease by coalesceMs
// or more (followers then know a soft pin at most that far behind); the
// other renewals wait for a flush (Drain). An expired promise waits too: it
// protects nothing any more, but its read time orders eviction (least
// recently read first), which the flush before an eviction brings to the
// log. What waits stays bounded: whenever the waiting keys have doubled
// (and number 65,536 or more) or pass maxWaiting, the renewals of keys
// removed without a flush (an unmount, an expired client, a forced
// removal) are forgotten; if still past maxWaiting, every renewal is taken.
func (b *Batcher) DrainDue() ([]Renewal, []Ping) {
	r, _ := b.Len()
	if r > min(int(b.nextSweep.Load()), b.maxWaiting) {
		b.forgetGone()
		r, _ = b.Len()
		// Twice what is left: each sweep's lookups are paid for by as many
		// new keys, however many clients come and go.
		b.nextSweep.Store(int64(max(2*r, sweepFloor)))
	}
	return b.drain(r > b.maxWaiting)
}

// sweepFloor: fewer waiting keys than this are not worth a sweep for gone
// ones.
const sweepFloor = 1 << 16

// forgetGone drops the renewals of keys that no longer exist: whatever
// object takes such a key later was never read.
func (b *Batcher) forgetGone() {
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		s.merge()
		s.renewals.keep(func(k string) bool {
			if b.exists(k) {
				return true
			}
			delete(s.soft, k)
			return false
		})
		s.mu.Unlock()
	}
}

func (b *Batcher) drain(all bool) ([]Renewal, []Ping) {
	var renewals []Renewal
	var pings []Ping
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		s.merge()
		var rs table
		if all {
			// Swap in fresh ones and read the old outside the lock.
			rs = s.renewals
			s.renewals, s.soft = table{}, make(map[string]struct{})
		} else {
			for k := range s.soft { // few: hashed again
				h := maphash.String(b.seed, k)
				if p, _ := s.renewals.get(h, k); p.untilMs-p.loggedMs >= b.coalesceMs {
					renewals = append(renewals, Renewal{Key: k, AtMs: p.atMs})
					s.renewals.remove(h, k)
					delete(s.soft, k)
				}
			}
		}
		// Pings are few and steady from tick to tick: a fresh map sized
		// like the last batch.
		ps := s.pings
		s.pings = make(map[string]int64, len(ps))
		s.mu.Unlock()
		rs.each(func(k string, p promise) {
			renewals = append(renewals, Renewal{Key: k, AtMs: p.atMs})
		})
		for c, at := range ps {
			pings = append(pings, Ping{ClientID: c, AtMs: at})
		}
	}
	slices.SortFunc(renewals, func(x, y Renewal) int { return strings.Compare(x.Key, y.Key) })
	slices.SortFunc(pings, func(x, y Ping) int { return strings.Compare(x.ClientID, y.ClientID) })
	return renewals, pings
}

// Len returns how many keys and clients are waiting to be drained.
func (b *Batcher) Len() (renewals, pings int) {
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		s.merge()
		renewals += s.renewals.n
		pings += len(s.pings)
		s.mu.Unlock()
	}
	return renewals, pings
}
