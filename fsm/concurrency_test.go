package fsm

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/require"
)

// TestConcurrentUseKeepsTheState applies one generated stream to a state
// used as a node uses it — Apply under the write lock; reads, digests
// (status) and the exporter's ring reads under the read lock, its entries
// built outside it; snapshots taken under the lock and written while Apply
// goes on; the leader's key index rebuilt from a clone while Apply goes
// on — and to a state
// used by nothing else. Results, OpLog output and digests must stay equal,
// and every snapshot must restore to the state of its moment. Under -race
// it also catches a write the lock does not cover (docs/RELIABILITY.md,
// finding 18).
func TestConcurrentUseKeepsTheState(t *testing.T) {
	const total = 30_000
	rng := rand.New(rand.NewPCG(20261126, 18))
	g := newGen(rng)
	ref, live := New(), New()
	live.IndexKeys(true)
	var mu sync.RWMutex
	const readAtMs = 1_700_000_000_000 // reads' results are not compared

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 2 {
		keys := rand.New(rand.NewPCG(uint64(r), 7))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("p%d/k%d", keys.IntN(4), keys.IntN(genKeys))
				var pending Pending
				mu.RLock()
				live.GetReplicaList(key, readAtMs)
				live.ExistKey(key, readAtMs)
				live.Lease(key)
				live.Stats()
				pending = live.RingAfter(0, 64)
				if keys.IntN(50) == 0 {
					live.Digest()
					live.ObjectSetDigest()
				}
				mu.RUnlock()
				pending.Entries()
			}
		})
	}
	type written struct {
		at     int
		digest [32]byte
		buf    *bytes.Buffer
		err    error
	}
	snaps := make(chan written, 64)
	var building sync.WaitGroup
	var build *KeyIndexBuild
	built := make(chan error, 1)
	var writers sync.WaitGroup
	for i := 1; i <= total; i++ {
		cmd := g.next(ref)
		entry := Encode(cmd)
		want := ref.Apply(entry)
		mu.Lock()
		got := live.Apply(entry)
		switch {
		case i%300 == 0:
			// A new leader's index: built from a clone while applies go
			// on, finished under the lock.
			b := live.StartKeyIndex()
			building.Go(func() { built <- b.Build(context.Background()) })
			build = b
		case i%300 == 150 && build != nil:
			require.NoError(t, <-built)
			require.True(t, live.FinishKeyIndex(build))
		}
		var snap *Snapshot
		if i%500 == 0 {
			snap = live.Snapshot()
		}
		mu.Unlock()
		require.Equal(t, want, got, "command %d (%T)", i, cmd)
		if snap != nil {
			w := written{at: i, digest: ref.Digest(), buf: &bytes.Buffer{}}
			writers.Go(func() {
				w.err = snap.Write(w.buf, snapshots.Header{RaftIndex: uint64(w.at)})
				snaps <- w
			})
		}
		if i%5_000 == 0 {
			mu.RLock()
			require.Equal(t, ref.Digest(), live.Digest(), "digest at command %d", i)
			require.Equal(t, ref.Ring().Entries(), live.Ring().Entries(), "export ring at command %d", i)
			require.NoError(t, live.CheckInvariants(), "command %d", i)
			mu.RUnlock()
		}
	}
	close(stop)
	wg.Wait()
	writers.Wait()
	building.Wait()
	close(snaps)
	n := 0
	for w := range snaps {
		require.NoError(t, w.err)
		f := New()
		_, err := f.Restore(w.buf)
		require.NoError(t, err, "snapshot of command %d", w.at)
		require.Equal(t, w.digest, f.Digest(), "snapshot taken at command %d restores to another state", w.at)
		n++
	}
	require.Equal(t, total/500, n)
}
