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

type shard struct {
	mu       sync.Mutex
	renewals map[string]int64 // key -> latest AtMs
	pings    map[string]int64 // client id -> latest AtMs
	// Keeps neighbouring shards' locks off one cache line, so readers on
	// different shards do not slow each other down.
	_ [64]byte
}

// Batcher collects read-lease renewals and client pings from many
// goroutines between two ticks, keeping only the latest time per key and per
// client. The leader's ticker drains it into one Tick command. Safe for
// concurrent use.
type Batcher struct {
	seed           maphash.Seed
	urgentWithinMs int64
	urgent         chan struct{}
	shards         [numShards]shard
}

// NewBatcher returns an empty batcher. A renewal of a lease with less than
// urgentWithinMs left signals Urgent (DESIGN.md: 1000 ms).
func NewBatcher(urgentWithinMs int64) *Batcher {
	b := &Batcher{
		seed:           maphash.MakeSeed(),
		urgentWithinMs: urgentWithinMs,
		urgent:         make(chan struct{}, 1),
	}
	for i := range b.shards {
		b.shards[i].renewals = make(map[string]int64)
		b.shards[i].pings = make(map[string]int64)
	}
	return b
}

// The shard only spreads lock contention; Drain sorts, so the random seed
// cannot make two leaders' Ticks differ.
func (b *Batcher) shard(s string) *shard {
	return &b.shards[maphash.String(b.seed, s)&(numShards-1)]
}

// Renew records that a read at atMs renewed key's lease. leaseDeadlineMs is
// the deadline the key holds now, before this renewal: if it is less than
// urgentWithinMs away, Urgent is signalled so that the renewal reaches the
// log before the old lease runs out.
func (b *Batcher) Renew(key string, atMs, leaseDeadlineMs int64) {
	s := b.shard(key)
	s.mu.Lock()
	if old, ok := s.renewals[key]; !ok || atMs > old {
		s.renewals[key] = atMs
	}
	s.mu.Unlock()
	if leaseDeadlineMs-atMs < b.urgentWithinMs {
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

// Drain takes everything recorded so far, sorted by key and by client id so
// that the Tick's bytes do not depend on map order, and empties the batcher.
// Shards are drained one at a time: a record made during Drain lands in this
// batch or the next, never in neither.
func (b *Batcher) Drain() ([]Renewal, []Ping) {
	var renewals []Renewal
	var pings []Ping
	for i := range b.shards {
		s := &b.shards[i]
		// Swap in fresh maps (sized like the last batch, as load is steady
		// from tick to tick) and read the old ones outside the lock.
		s.mu.Lock()
		r, p := s.renewals, s.pings
		s.renewals = make(map[string]int64, len(r))
		s.pings = make(map[string]int64, len(p))
		s.mu.Unlock()
		for k, at := range r {
			renewals = append(renewals, Renewal{Key: k, AtMs: at})
		}
		for c, at := range p {
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
