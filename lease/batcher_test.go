package lease_test

import (
	"fmt"
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
	b := lease.NewBatcher(1000, 1000)
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
					b.Renew(fmt.Sprintf("key-%03d", k), at, at+1_000_000, at+1_000_000)
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
	b := lease.NewBatcher(1000, 1000)
	const n = 20000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range n {
			b.Renew(fmt.Sprintf("k%05d", i), int64(i), 1<<40, 1<<40)
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

func TestBatcherUrgent(t *testing.T) {
	tests := []struct {
		name         string
		at, deadline int64
		urgent       bool
	}{
		{"far from expiry", 10_000, 15_000, false},
		{"exactly the threshold left", 10_000, 11_000, false},
		{"just under the threshold", 10_000, 10_999, true},
		{"one millisecond left", 10_000, 10_001, true},
		// A lapsed lease needs no urgent entry: nothing is left to lose.
		{"expiring now", 10_000, 10_000, false},
		{"already expired", 10_000, 2_000, false},
		{"never leased", 10_000, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := lease.NewBatcher(1000, 1000)
			b.Renew("k", tt.at, tt.deadline, tt.at+5000)
			select {
			case <-b.Urgent():
				assert.True(t, tt.urgent, "signalled")
			default:
				assert.False(t, tt.urgent, "not signalled")
			}
		})
	}
}

func TestBatcherUrgentNeverBlocks(t *testing.T) {
	b := lease.NewBatcher(1000, 1000)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				b.Renew(fmt.Sprintf("k%d-%d", w, i), 100, 150, 5100) // all critical, nobody reads Urgent
			}
		}()
	}
	wg.Wait() // would hang if Renew blocked
	<-b.Urgent()
	select {
	case <-b.Urgent():
		t.Fatal("more than one pending signal")
	default:
	}
	// Ping never signals.
	b.Ping("c", 100)
	select {
	case <-b.Urgent():
		t.Fatal("ping signalled")
	default:
	}
}

// TestBatcherCoalesces: a key renewed several times in one batch drains
// once, at its latest time; a drain starts a fresh batch.
func TestBatcherCoalesces(t *testing.T) {
	b := lease.NewBatcher(1000, 1000)
	b.Renew("k", 500, 10_000, 5500)
	b.Renew("k", 300, 10_000, 5300) // older: ignored
	b.Renew("k", 700, 10_000, 5700)
	renewals, pings := b.Drain()
	assert.Equal(t, []lease.Renewal{{Key: "k", AtMs: 700}}, renewals)
	assert.Empty(t, pings)

	b.Renew("k", 100, 10_000, 5100) // a new batch starts from scratch
	renewals, _ = b.Drain()
	assert.Equal(t, []lease.Renewal{{Key: "k", AtMs: 100}}, renewals)
	renewals, _ = b.Drain()
	assert.Empty(t, renewals)
}

// TestBatcherDrainDue: a regular tick takes the renewals that matter now —
// unleased keys, leases extended by a second or more, leases about to
// lapse — and every ping; the rest wait, and a flush (Drain) takes them.
func TestBatcherDrainDue(t *testing.T) {
	const (
		now  = 100_000
		tick = 100
		ttl  = 5000
	)
	tests := []struct {
		name       string
		at, logged int64
		until      int64
		due        bool
		dueAfterMs int64 // when it does not wait: how much later it is due
	}{
		{"never leased", now, 0, now + ttl, true, 0},
		{"lease lapsed", now, now - 1, now + ttl, true, 0},
		{"extends the logged lease by a second", now, now + ttl - 1000, now + ttl, true, 0},
		{"extends it by less, lease far off", now, now + ttl - 400, now + ttl, false, ttl - 400 - 2*tick + 1},
		{"extends it by less, lease lapsing within two ticks", now, now + 2*tick - 1, now + 2*tick + 300, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := lease.NewBatcher(tick, 1000)
			b.Renew("k", tt.at, tt.logged, tt.until)
			b.Ping("c", now)
			rs, ps := b.DrainDue(now)
			assert.Equal(t, []lease.Ping{{ClientID: "c", AtMs: now}}, ps, "pings always go")
			if tt.due {
				assert.Equal(t, []lease.Renewal{{Key: "k", AtMs: tt.at}}, rs)
				return
			}
			assert.Empty(t, rs, "waits for a later tick")
			rs, _ = b.DrainDue(now + tt.dueAfterMs - 1)
			assert.Empty(t, rs)
			rs, _ = b.DrainDue(now + tt.dueAfterMs)
			assert.Equal(t, []lease.Renewal{{Key: "k", AtMs: tt.at}}, rs, "due before the logged lease lapses")
		})
	}

	// A key read over and over is logged once per coalescing window, and a
	// flush takes what waits.
	b := lease.NewBatcher(tick, 1000)
	logged := int64(now + ttl)
	b.Renew("hot", now, logged, now+ttl)
	for at := int64(now + 100); at < now+1000; at += 100 {
		b.Renew("hot", at, logged, at+ttl)
		rs, _ := b.DrainDue(at)
		assert.Empty(t, rs, "at %d: extends the logged lease by %d ms only", at, at-now)
	}
	b.Renew("hot", now+1000, logged, now+1000+ttl)
	rs, _ := b.DrainDue(now + 1000)
	assert.Equal(t, []lease.Renewal{{Key: "hot", AtMs: now + 1000}}, rs, "a second's worth: due, at the latest read")
	b.Renew("hot", now+1100, now+1000+ttl, now+1100+ttl)
	rs, _ = b.DrainDue(now + 1100)
	assert.Empty(t, rs)
	rs, _ = b.Drain()
	assert.Equal(t, []lease.Renewal{{Key: "hot", AtMs: now + 1100}}, rs, "a flush takes the waiting renewal")
	nr, _ := b.Len()
	assert.Zero(t, nr)
}

func BenchmarkBatcherRenewParallel(b *testing.B) {
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("model-llama-70b/layer-%02d/chunk-%06d", i%80, i)
	}
	bt := lease.NewBatcher(1000, 1000)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			bt.Renew(keys[i&(len(keys)-1)], int64(i), int64(i)+5000, int64(i)+5000)
			i += 7
		}
	})
}
