package tests

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/fsm"
)

// benchCluster starts three real nodes at the default flags.
func benchCluster(b *testing.B) (*Cluster, *client.Client) {
	c := StartCluster(b, b.TempDir(), 3)
	cl, err := client.Dial(client.Config{Endpoints: c.Endpoints(), MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.Leader(ctx, cl)
	for i := 0; i < 3; i++ {
		if err := cl.MountSegment(ctx, "bench", fsm.SegmentSpec{ID: fmt.Sprintf("s%d", i), Name: fmt.Sprintf("host%d", i),
			Base: uint64(i) << 40, Size: 1 << 38}); err != nil {
			b.Fatal(err)
		}
	}
	// Keep the session alive for the whole run.
	kctx, kcancel := context.WithCancel(context.Background())
	k := cl.KeepAlive(kctx, "bench", nil, 0)
	b.Cleanup(func() { kcancel(); k.Stop() })
	return c, cl
}

var keySeq atomic.Int64

func putOnce(ctx context.Context, cl *client.Client) error {
	key := fmt.Sprintf("b/%d", keySeq.Add(1))
	if _, err := cl.PutStart(ctx, key, []uint64{4096}, client.ReplicateConfig{ReplicaNum: 1}, "bench"); err != nil {
		return err
	}
	return cl.PutEnd(ctx, key, "bench")
}

// BenchmarkFailover: SIGKILL the leader b.N times (restarting it each time)
// and measure from the kill to the first successful PutStart+PutEnd.
//
//	go test -run=^$ -bench=Failover -benchtime=10x ./tests/
func BenchmarkFailover(b *testing.B) {
	c, cl := benchCluster(b)
	ctx := context.Background()
	var gaps []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		l := c.Leader(lctx, cl)
		cancel()
		killed := time.Now()
		c.Kill(l, syscall.SIGKILL)
		for {
			wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
			err := putOnce(wctx, cl)
			wcancel()
			if err == nil {
				break
			}
		}
		gaps = append(gaps, time.Since(killed))
		c.Start(l)
		time.Sleep(time.Second) // let the restarted node catch up before the next kill
	}
	b.StopTimer()
	slices.Sort(gaps)
	b.ReportMetric(float64(gaps[len(gaps)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(gaps[len(gaps)-1].Milliseconds()), "max-ms")
	b.Logf("failover gaps: %v", gaps)
}

// BenchmarkThroughput: PutStart+PutEnd pairs and GetReplicaList reads
// against the three-node cluster, from 1 and 64 concurrent clients.
//
//	go test -run=^$ -bench=Throughput -benchtime=5s ./tests/
func BenchmarkThroughput(b *testing.B) {
	_, cl := benchCluster(b)
	ctx := context.Background()
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("write/clients=%d", clients), func(b *testing.B) {
			run(b, clients, func() error { return putOnce(ctx, cl) })
		})
	}
	if err := putOnce(ctx, cl); err != nil {
		b.Fatal(err)
	}
	key := fmt.Sprintf("b/%d", keySeq.Load())
	for _, clients := range []int{1, 64} {
		b.Run(fmt.Sprintf("read/clients=%d", clients), func(b *testing.B) {
			run(b, clients, func() error { _, _, err := cl.GetReplicaList(ctx, key); return err })
		})
	}
}

// run spreads b.N operations over the given number of goroutines and
// reports operations per second.
func run(b *testing.B, clients int, op func() error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	b.ResetTimer()
	for g := 0; g < clients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := op(); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	if failed.Load() > 0 {
		b.Fatalf("%d of %d operations failed", failed.Load(), b.N)
	}
}
