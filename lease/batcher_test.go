package lease_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/lease"
)

func TestBatcherConcurrent(t *testing.T) {
	const (
		workers = 16
		keys    = 300
		clients = 50
		rounds  = 20
	)
	b := lease.NewBatcher(1000, 1000, nil)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every worker renews every key with its own times, in an order
			// that is not increasing, so coalescing must keep the maximum.
			for r := range rounds {
				for k := range keys {
					at := int64(((r*7)%rounds)*1000 + w*10 + k%7)
					b.Renew(fmt.Sprintf("key-%03d", k), at, at+1_000_000, at+1_000_000, false)
				}
				for c := range clients {
					b.Ping(fmt.Sprintf("client-%02d", c), int64(((r*3)%rounds)*100+w))
				}
			}
		}()
	}
	wg.Wait()

	nr, np := b.Len()
	assert.Equal(t, keys, nr)
	assert.Equal(t, clients, np)
	renewals, pings := b.Drain()
	require.Len(t, renewals, keys)
	assert.Equal(t, lease.Renewal{Key: "key-005", AtMs: int64((rounds-1)*1000 + (workers-1)*10 + 5)}, renewals[5],
		"the latest renewal of a key wins")
	require.Len(t, pings, clients)
	assert.True(t, sort.SliceIsSorted(renewals, func(i, j int) bool { return renewals[i].Key < renewals[j].Key }))
	assert.True(t, sort.SliceIsSorted(pings, func(i, j int) bool { return pings[i].ClientID < pings[j].ClientID }))
	for k, r := range renewals {
		assert.Equal(t, lease.Renewal{Key: fmt.Sprintf("key-%03d", k), AtMs: int64((rounds-1)*1000 + (workers-1)*10 + k%7)}, r)
	}
	for c, p := range pings {
		assert.Equal(t, lease.Ping{ClientID: fmt.Sprintf("client-%02d", c), AtMs: int64((rounds-1)*100 + workers - 1)}, p)
	}

	nr, np = b.Len()
	assert.Zero(t, nr)
	assert.Zero(t, np)
	renewals, pings = b.Drain()
	assert.Empty(t, renewals)
	assert.Empty(t, pings)
}

// Records made while Drain runs land in exactly one batch.
func TestBatcherDrainWhileRecording(t *testing.T) {
	b := lease.NewBatcher(1000, 1000, nil)
	const n = 20000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			b.Renew(fmt.Sprintf("k%05d", i), int64(i), 1<<40, 1<<40, false)
			b.Ping(fmt.Sprintf("c%05d", i), int64(i))
		}
	}()
	seenR, seenP := map[string]int{}, map[string]int{}
	drain := func() {
		r, p := b.Drain()
		for _, x := range r {
			seenR[x.Key]++
		}
		for _, x := range p {
			seenP[x.ClientID]++
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		drain()
	}
	drain()
	assert.Len(t, seenR, n)
	assert.Len(t, seenP, n)
	for k, c := range seenR {
		require.Equal(t, 1, c, k)
	}
	for k, c := range seenP {
		require.Equal(t, 1, c, k)
	}
}

// TestBatcherCoalesces: a key renewed several times in one batch drains
// once, at its latest time; a drain starts a fresh batch.
func TestBatcherCoalesces(t *testing.T) {
	b := lease.NewBatcher(1000, 1000, nil)
	b.Renew("k", 500, 10_000, 5500, false)
	b.Renew("k", 300, 10_000, 5300, false) // older: ignored
	b.Renew("k", 700, 10_000, 5700, false)
	renewals, pings := b.Drain()
	assert.Equal(t, []lease.Renewal{{Key: "k", AtMs: 700}}, renewals)
	assert.Empty(t, pings)

	b.Renew("k", 100, 10_000, 5100, false) // a new batch starts from scratch
	renewals, _ = b.Drain()
	assert.Equal(t, []lease.Renewal{{Key: "k", AtMs: 100}}, renewals)
	renewals, _ = b.Drain()
	assert.Empty(t, renewals)
}

// TestBatcherManyRenewalsBetweenTicks: reads record renewals faster than
// ticks take them (past the bound at which a read merges them itself);
// every key still waits once, at its latest time, and a soft pin seen by
// one read early on survives the merges.
func TestBatcherManyRenewalsBetweenTicks(t *testing.T) {
	b := lease.NewBatcher(1000, 1<<20, nil)
	const rounds = 5000
	for i := range int64(rounds) {
		b.Renew("a", i, 10_000, 10_000+i, false)
		b.Renew("b", rounds-i, 10_000, 10_000, false) // its latest read comes first
		b.Renew("pinned", i, 10_000, 20_000, i == 0)
	}
	r, _ := b.Len()
	assert.Equal(t, 3, r)
	due, _ := b.DrainDue()
	assert.Equal(t, []lease.Renewal{{Key: "pinned", AtMs: rounds - 1}}, due, "the soft pin of the first read, past the coalescing window")
	all, _ := b.Drain()
	assert.Equal(t, []lease.Renewal{{Key: "a", AtMs: rounds - 1}, {Key: "b", AtMs: rounds}}, all)
}

// TestBatcherDrainDue: a regular tick takes every ping and, of the
// renewals, only a soft-pinned key's that extends its logged lease by the
// coalescing window; the rest wait for a flush (Drain), lapsed or not.
func TestBatcherDrainDue(t *testing.T) {
	const (
		now = 100_000
		ttl = 5000
	)
	tests := []struct {
		name          string
		logged, until int64
		softPin       bool
		due           bool
	}{
		{"never leased", 0, now + ttl, false, false},
		{"lease lapsed", now - 1, now + ttl, false, false},
		{"live lease extended by a second", now + ttl - 1000, now + ttl, false, false},
		{"live lease lapsing now", now + 1, now + ttl, false, false},
		{"soft pin, never leased", 0, now + ttl, true, true},
		{"soft pin, lease extended by a second", now + ttl - 1000, now + ttl, true, true},
		{"soft pin, lease extended by less", now + ttl - 999, now + ttl, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := lease.NewBatcher(1000, 10, nil)
			b.Renew("k", now, tt.logged, tt.until, tt.softPin)
			b.Ping("c", now)
			rs, ps := b.DrainDue()
			assert.Equal(t, []lease.Ping{{ClientID: "c", AtMs: now}}, ps, "pings always go")
			if tt.due {
				assert.Equal(t, []lease.Renewal{{Key: "k", AtMs: now}}, rs)
				return
			}
			assert.Empty(t, rs, "waits for a flush")
			rs, _ = b.DrainDue()
			assert.Empty(t, rs, "still waits")
			rs, _ = b.Drain()
			assert.Equal(t, []lease.Renewal{{Key: "k", AtMs: now}}, rs, "a flush takes it")
		})
	}

	// A soft-pinned key read over and over is logged once per coalescing
	// window, at its latest read.
	b := lease.NewBatcher(1000, 10, nil)
	logged := int64(now + ttl)
	b.Renew("hot", now, logged, now+ttl, true)
	for at := int64(now + 100); at < now+1000; at += 100 {
		b.Renew("hot", at, logged, at+ttl, true)
		rs, _ := b.DrainDue()
		assert.Empty(t, rs, "at %d: extends the logged lease by %d ms only", at, at-now)
	}
	b.Renew("hot", now+1000, logged, now+1000+ttl, true)
	rs, _ := b.DrainDue()
	assert.Equal(t, []lease.Renewal{{Key: "hot", AtMs: now + 1000}}, rs, "a second's worth: due, at the latest read")
}

// TestBatcherBoundsWhatWaits: a regular tick forgets the renewals of gone
// keys once the waiting keys have doubled, and takes them all once more
// wait than the bound.
func TestBatcherBoundsWhatWaits(t *testing.T) {
	const floor = 1 << 16
	gone := map[string]bool{}
	lookups := 0
	b := lease.NewBatcher(1000, 3*floor, func(key string) bool { lookups++; return !gone[key] })
	renew := func(from, to int) {
		for i := from; i < to; i++ {
			b.Renew(fmt.Sprint(i), 100, 0, 5100, false)
		}
	}
	waiting := func() int { r, _ := b.Len(); return r }

	renew(0, floor)
	rs, _ := b.DrainDue()
	assert.Empty(t, rs)
	assert.Zero(t, lookups, "not past the floor: no sweep")

	for i := range floor / 2 {
		gone[fmt.Sprint(i)] = true
	}
	renew(floor, floor+1)
	rs, _ = b.DrainDue()
	assert.Empty(t, rs)
	assert.Equal(t, floor+1, lookups, "one past the floor: a sweep")
	assert.Equal(t, floor/2+1, waiting(), "the gone keys forgotten")

	// The next sweep waits for twice what this one left: floor+2 keys.
	lookups = 0
	renew(floor+1, floor+1+floor/2+1)
	require.Equal(t, floor+2, waiting())
	rs, _ = b.DrainDue()
	assert.Empty(t, rs)
	assert.Zero(t, lookups, "not yet twice what the last sweep left")

	gone = map[string]bool{}
	renew(2*floor, 4*floor)
	rs, _ = b.DrainDue()
	assert.Len(t, rs, 3*floor+2, "past the bound, with nothing gone: all go")
	assert.Zero(t, waiting())

	// The next doubling is past the bound now; the bound sweeps first.
	renew(4*floor, 7*floor+1)
	for i := 4 * floor; i < 5*floor; i++ {
		gone[fmt.Sprint(i)] = true
	}
	rs, _ = b.DrainDue()
	assert.Empty(t, rs, "past the bound, but the gone keys forgotten bring it under")
	assert.Equal(t, 2*floor+1, waiting())
}

func BenchmarkBatcherRenewParallel(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("model-llama-70b/layer-%02d/chunk-%06d", i%80, i)
	}
	bt := lease.NewBatcher(1000, 1<<18, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			bt.Renew(keys[i&(len(keys)-1)], int64(i), int64(i)+5000, int64(i)+5000, false)
			i += 7
		}
	})
}

// BenchmarkBatcherRenewMerge is a read-heavy leader's batcher: reads of
// keys at random among many more than the caches hold, each recorded and
// then folded into its shard's renewals, as a tick folds them.
//
//	go test -run '^$' -bench BatcherRenewMerge -benchmem ./lease/
func BenchmarkBatcherRenewMerge(b *testing.B) {
	keys := make([]string, 1<<18)
	for i := range keys {
		keys[i] = fmt.Sprintf("140213547710016_%d", i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	order := make([]int32, 1<<20)
	for i := range order {
		order[i] = int32(rng.IntN(len(keys)))
	}
	bt := lease.NewBatcher(1000, 1<<30, nil)
	for _, k := range keys { // every key waits already, as after the first seconds of reads
		bt.Renew(k, 1, 5000, 5000, false)
	}
	bt.Len()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		bt.Renew(keys[order[i&(len(order)-1)]], int64(i), int64(i)+5000, int64(i)+5000, false)
		if i%40000 == 0 {
			bt.Len() // a tick's merge
		}
	}
}

// TestBatcherRequeue: what a drain took for a Tick that failed comes back
// whole with the next flush, merged with what was recorded meanwhile (the
// latest time of each), and waits for a flush as any renewal of a key that
// is not soft-pinned does.
func TestBatcherRequeue(t *testing.T) {
	b := lease.NewBatcher(1000, 1000, nil)
	b.Renew("a", 10, 0, 5_010, false)
	b.Renew("b", 20, 0, 5_020, true)
	b.Ping("c1", 30)
	renewals, pings := b.Drain()
	require.Len(t, renewals, 2)
	require.Len(t, pings, 1)

	b.Renew("a", 15, 0, 5_015, false) // recorded while the Tick failed
	b.Ping("c1", 25)
	b.Requeue(renewals, pings)

	r, p := b.DrainDue()
	assert.Empty(t, r, "put back, a renewal waits for a flush")
	assert.Equal(t, []lease.Ping{{ClientID: "c1", AtMs: 30}}, p, "pings go with every tick")
	b.Requeue(nil, p)
	r, p = b.Drain()
	assert.Equal(t, []lease.Renewal{{Key: "a", AtMs: 15}, {Key: "b", AtMs: 20}}, r)
	assert.Equal(t, []lease.Ping{{ClientID: "c1", AtMs: 30}}, p)
	r, p = b.Drain()
	assert.Empty(t, r)
	assert.Empty(t, p)
}
