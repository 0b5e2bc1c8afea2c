package lease

import (
	"hash/maphash"
	"slices"
	"strings"
	"sync"
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

type shard struct {
	mu       sync.Mutex
	renewals map[string]promise
	pings    map[string]int64 // client id -> latest AtMs
	// Keeps neighbouring shards' locks off one cache line, so readers on
	// different shards do not slow each other down.
	_ [64]byte
}

// Batcher collects read-lease renewals and client pings from many
// goroutines between two ticks, keeping only the latest per key and per
// client. The leader's ticker drains it into Tick commands. Safe for
// concurrent use.
type Batcher struct {
	seed           maphash.Seed
	urgentWithinMs int64
	coalesceMs     int64
	urgent         chan struct{}
	shards         [numShards]shard
}

// NewBatcher returns an empty batcher. A renewal of a live lease with less
// than urgentWithinMs left signals Urgent: the leader passes its tick
// period, so only a lease that would lapse before the next regular tick
// costs an extra Raft entry. A regular tick (DrainDue) leaves behind
// renewals that extend the key's logged lease by less than coalesceMs, as
// long as that lease is not about to lapse.
func NewBatcher(urgentWithinMs, coalesceMs int64) *Batcher {
	b := &Batcher{
		seed:           maphash.MakeSeed(),
		urgentWithinMs: urgentWithinMs,
		coalesceMs:     coalesceMs,
		urgent:         make(chan struct{}, 1),
	}
	for i := range b.shards {
		b.shards[i].renewals = make(map[string]promise)
		b.shards[i].pings = make(map[string]int64)
	}
	return b
}

// The shard only spreads lock contention; drains sort, so the random seed
// cannot make two leaders' Ticks differ.
func (b *Batcher) shard(s string) *shard {
	return &b.shards[maphash.String(b.seed, s)&(numShards-1)]
}

// Renew records that a read at atMs renewed key's lease: loggedMs is the
// deadline the log gives the key now, untilMs the lease the read returned.
// If the logged lease is still live and less than urgentWithinMs away,
// Urgent is signalled so that the renewal reaches the log before that lease
// runs out. A lapsed (or never granted) lease has nothing left to protect:
// its renewal rides the next regular Tick, and until then the removal flush
// and the read gate keep the returned lease (node/gate.go).
func (b *Batcher) Renew(key string, atMs, loggedMs, untilMs int64) {
	s := b.shard(key)
	s.mu.Lock()
	p := s.renewals[key]
	s.renewals[key] = promise{atMs: max(p.atMs, atMs), loggedMs: max(p.loggedMs, loggedMs), untilMs: max(p.untilMs, untilMs)}
	s.mu.Unlock()
	if left := loggedMs - atMs; left > 0 && left < b.urgentWithinMs {
		select {
		case b.urgent <- struct{}{}:
		default: // a signal is already pending; one tick takes all
		}
	}
}

// Ping records that the client pinged at atMs.
func (b *Batcher) Ping(clientID string, atMs int64) {
	s := b.shard(clientID)
	s.mu.Lock()
	if old, ok := s.pings[clientID]; !ok || atMs > old {
		s.pings[clientID] = atMs
	}
	s.mu.Unlock()
}

// Urgent receives a value when a critical renewal was recorded; the ticker
// then proposes a Tick at once instead of waiting for its period.
func (b *Batcher) Urgent() <-chan struct{} {
	return b.urgent
}

// Drain takes everything recorded so far — what a Tick needs before a
// removal or an eviction, which must see every lease a read returned —
// sorted by key and by client id so that the Tick's bytes do not depend on
// map order, and empties the batcher. Shards are drained one at a time: a
// record made during Drain lands in this batch or the next, never in
// neither.
func (b *Batcher) Drain() ([]Renewal, []Ping) {
	return b.drain(func(promise) bool { return true })
}

// DrainDue is Drain for a regular tick at nowMs: it takes every ping, and
// the renewals that extend the key's logged lease by coalesceMs or more or
// whose logged lease lapses within two urgentWithinMs; the others wait for
// a later tick. A waiting renewal's promise is kept all the same: a removal
// or an eviction drains it first (Drain), and a new leader's Promote leases
// every object past it. So a key read again and again costs a Raft entry
// about once per coalesceMs instead of once per tick, and followers see its
// lease at most coalesceMs behind the leader's promise.
func (b *Batcher) DrainDue(nowMs int64) ([]Renewal, []Ping) {
	return b.drain(func(p promise) bool {
		return p.untilMs-p.loggedMs >= b.coalesceMs || p.loggedMs-nowMs < 2*b.urgentWithinMs
	})
}

func (b *Batcher) drain(due func(promise) bool) ([]Renewal, []Ping) {
	var renewals []Renewal
	var pings []Ping
	for i := range b.shards {
		s := &b.shards[i]
		s.mu.Lock()
		for k, p := range s.renewals {
			if due(p) {
				renewals = append(renewals, Renewal{Key: k, AtMs: p.atMs})
				delete(s.renewals, k)
			}
		}
		// Swap in a fresh map (sized like the last batch, as load is steady
		// from tick to tick) and read the old one outside the lock.
		ps := s.pings
		s.pings = make(map[string]int64, len(ps))
		s.mu.Unlock()
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
		renewals += len(s.renewals)
		pings += len(s.pings)
		s.mu.Unlock()
	}
	return renewals, pings
}
