package fsm

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// evicted returns the keys evicted since ring index from, in order.
func (x *h) evictedSince(from int) []string {
	var keys []string
	for _, e := range entries(x.f)[from:] {
		if e.Source == oplog.SourceEvict {
			keys = append(keys, e.Key)
		}
	}
	return keys
}

func TestEvictionWatermark(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	for i := 0; i < 95; i++ {
		x.put(fmt.Sprintf("k%02d", i), "c1", 10)
	}
	x.now += 1
	r := x.keepAlive("c1")
	assert.Zero(t, r.Evicted, "95 %% used is not over the 0.95 watermark")
	x.put("k95", "c1", 10)
	x.now += 1
	from := len(entries(x.f))
	r = x.keepAlive("c1")
	assert.Equal(t, uint64(5), r.Evicted, "over the watermark: evict 5 %% of capacity")
	assert.Equal(t, []string{"k00", "k01", "k02", "k03", "k04"}, x.evictedSince(from),
		"equal lease deadlines: ties broken by key")
	assert.Equal(t, uint64(910), x.f.used)
	r = x.keepAlive("c1")
	assert.Zero(t, r.Evicted)
}

func TestEvictionOrderAndLeases(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 100)
	for i := 0; i < 10; i++ {
		x.put(fmt.Sprintf("k%d", i), "c1", 10)
	}
	// Leases end at different times: k9 first, k0 last; k5 still leased.
	var renewals []lease.Renewal
	for i := 0; i < 10; i++ {
		renewals = append(renewals, lease.Renewal{Key: fmt.Sprintf("k%d", i), AtMs: x.now + int64(100*(10-i))})
	}
	x.tick(renewals...)
	x.now += 100*10 + x.f.params.LeaseTTLMs - 1 // only k0 is still leased
	from := len(entries(x.f))
	// Each tick frees at least 5 % of capacity: one 10-byte object.
	for i := 0; i < 12; i++ {
		x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c1", AtMs: x.now}}, Evict: true})
	}
	assert.Equal(t, []string{"k9", "k8", "k7", "k6", "k5", "k4", "k3", "k2", "k1"}, x.evictedSince(from),
		"smallest lease deadline first")
	assert.True(t, x.exists("k0"), "a leased object is never evicted")
	assert.Equal(t, 1, x.f.objects.Len())
}

func TestEvictionSoftPinnedSecondPass(t *testing.T) {
	for _, allow := range []bool{true, false} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			x := newH(t)
			p := DefaultParams()
			p.AllowEvictSoftPinned = allow
			p.EvictionRatioPPM = 300_000 // 30 bytes of 100
			x.ok(&Promote{NowMs: x.now, LeaderID: "n", Term: 1, Params: p})
			x.now += p.LeaseTTLMs
			x.mount("c1", "s1", 0, 100)
			for i := 0; i < 4; i++ {
				x.ok(&PutStart{NowMs: x.now, Key: fmt.Sprintf("pin%d", i), SliceLengths: []uint64{10}, ReplicaNum: 1, SoftPin: true, ClientID: "c1"})
				x.ok(&PutEnd{NowMs: x.now, Key: fmt.Sprintf("pin%d", i), ClientID: "c1"})
			}
			x.put("plain", "c1", 10)
			x.now++
			from := len(entries(x.f))
			x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c1", AtMs: x.now}}, Evict: true})
			if allow {
				assert.Equal(t, []string{"plain", "pin0", "pin1"}, x.evictedSince(from), "soft-pinned only after the others")
			} else {
				assert.Equal(t, []string{"plain"}, x.evictedSince(from))
			}
		})
	}
}

func TestEvictionSkipsProcessing(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 100)
	require.NoError(t, x.putStart("p", "c1", 90).Err)
	x.put("c", "c1", 10)
	x.now++
	r := x.keepAlive("c1")
	assert.Equal(t, uint64(1), r.Evicted)
	assert.True(t, x.exists("p"), "a PROCESSING object is not a candidate")
	assert.False(t, x.exists("c"))
}

func TestNeedSpaceFromFailedPutStart(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 100)
	for i := 0; i < 5; i++ {
		x.put(fmt.Sprintf("k%d", i), "c1", 10)
	}
	x.put("big", "c1", 50)
	x.now++
	assert.Error(t, x.putStart("big2", "c1", 60).Err)
	require.True(t, x.f.needSpace)
	r := x.keepAlive("c1")
	assert.Equal(t, uint64(1), r.Evicted, "5 bytes wanted: one 10-byte object")
	assert.False(t, x.f.needSpace, "the flag is consumed by the tick")
}

func TestMulHelpers(t *testing.T) {
	max := ^uint64(0)
	assert.True(t, mulLess(max, 2, max, 3))
	assert.False(t, mulLess(max, 3, max, 3))
	assert.True(t, mulLess(1, 1, 1, 2))
	assert.Equal(t, uint64(50), mulDiv(1000, 50_000, ppm))
	assert.Equal(t, max/2, mulDiv(max, ppm/2, ppm))
	assert.Equal(t, max, mulDiv(max, 2, 1), "saturates")
}

// TestEvictOnlyWhenTold: over the watermark, a Tick not marked Evict does
// not evict — the leader decides, because it must hold reads meanwhile.
func TestEvictOnlyWhenTold(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 100)
	for i := 0; i < 10; i++ {
		x.put(fmt.Sprintf("k%d", i), "c1", 10)
	}
	x.now++
	require.True(t, x.f.EvictionDue())
	r := x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c1", AtMs: x.now}}})
	assert.Zero(t, r.Evicted)
	r = x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c1", AtMs: x.now}}, Evict: true})
	assert.Equal(t, uint64(1), r.Evicted)
}

// TestVictimHeapMatchesSort: the streaming selection keeps exactly the
// prefix of the full eviction order that covers the target — what sorting
// every candidate and taking them until the target is met gives.
func TestVictimHeapMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for round := 0; round < 500; round++ {
		n := rng.IntN(300)
		cs := make([]evictCandidate, n)
		var total uint64
		for i := range cs {
			cs[i] = evictCandidate{leaseMs: int64(rng.IntN(20)), ord: i, bytes: 1 + uint64(rng.IntN(100)), key: fmt.Sprint(i)}
			total += cs[i].bytes
		}
		target := 1 + uint64(rng.Int64N(int64(total+50)))
		v := victimHeap{target: target}
		for _, c := range cs {
			v.offer(c)
		}
		want := slices.Clone(cs)
		slices.SortFunc(want, func(a, b evictCandidate) int {
			return cmp.Or(cmp.Compare(a.leaseMs, b.leaseMs), cmp.Compare(a.ord, b.ord))
		})
		var freed uint64
		i := 0
		for ; i < len(want) && freed < target; i++ {
			freed += want[i].bytes
		}
		got := v.sorted()
		require.Equal(t, len(want[:i]), len(got), "round %d: %d candidates, target %d", round, n, target)
		if i > 0 {
			require.Equal(t, want[:i], got, "round %d: %d candidates, target %d", round, n, target)
		}
		require.Equal(t, freed, v.held)
	}
}
