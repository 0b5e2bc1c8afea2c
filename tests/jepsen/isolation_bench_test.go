package jepsen

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkIsolatedLeaderReads measures how long a leader cut off from both
// followers (every Raft link, both ways; clients still reach it) goes on
// answering reads: the last successful read at it after the cut, once per
// iteration. With lease reads it must stop within one read lease plus one
// round; with quorum reads at once.
//
//	go test -run '^$' -bench IsolatedLeaderReads -benchtime 10x ./tests/jepsen/
func BenchmarkIsolatedLeaderReads(b *testing.B) {
	for _, mode := range []string{"lease", "quorum"} {
		b.Run(mode, func(b *testing.B) { isolatedLeaderReads(b, mode) })
	}
}

func isolatedLeaderReads(b *testing.B, mode string) {
	ctx := context.Background()
	dir := b.TempDir()
	bin, err := buildMoonraft(dir)
	if err != nil {
		b.Fatal(err)
	}
	c, err := startCluster(ctx, bin, dir, filepath.Join(dir, "data"), clusterConfig{nodes: 3, logLevel: "warn", extraArgs: []string{"--read-mode", mode}},
		func(string, ...any) {})
	if c != nil {
		defer c.close()
	}
	if err != nil {
		b.Fatal(err)
	}
	const key = "isolated/k"
	seg := fsm.SegmentSpec{ID: "iso-seg", Name: "iso-host", Base: 1 << 40, Size: 1 << 30}
	if err := retry(ctx, func(ctx context.Context) error {
		if err := c.admin.MountSegment(ctx, "iso", seg); err != nil {
			return err
		}
		if _, err := c.admin.PutStart(ctx, key, []uint64{64}, moonclient.ReplicateConfig{ReplicaNum: 1}, "iso"); err != nil && errcode.Of(err) != errcode.ObjectAlreadyExists {
			return err
		}
		return c.admin.PutEnd(ctx, key, "iso")
	}); err != nil {
		b.Fatal(err)
	}
	var answered []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l, err := c.waitLeader(ctx, 30*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		last, err := readUntilIsolated(ctx, c, l, key)
		if err != nil {
			b.Fatal(err)
		}
		answered = append(answered, last)
		if err := c.healAll(); err != nil {
			b.Fatal(err)
		}
		if _, err := c.waitLeader(ctx, 30*time.Second); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second) // the old leader rejoins and catches up
	}
	b.StopTimer()
	slices.Sort(answered)
	b.ReportMetric(float64(answered[len(answered)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(answered[len(answered)-1].Milliseconds()), "max-ms")
	b.Logf("%s reads: last answer of an isolated leader after the cut, ms: %v", mode, answered)
}

// readUntilIsolated reads key at node l without pause, cuts l off from its
// peers, goes on reading for a few seconds and returns how long after the
// cut l answered a read for the last time (0: never after the cut).
func readUntilIsolated(ctx context.Context, c *cluster, l int, key string) (time.Duration, error) {
	cc, err := grpc.NewClient(c.nodes[l].grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	mc := moonraftpb.NewMasterClient(cc)
	rctx, stop := context.WithCancel(ctx)
	var (
		mu     sync.Mutex
		lastOK time.Time
		wg     sync.WaitGroup
	)
	wg.Go(func() {
		for rctx.Err() == nil {
			cctx, cancel := context.WithTimeout(rctx, 200*time.Millisecond)
			resp, err := mc.GetReplicaList(cctx, &moonraftpb.GetReplicaListRequest{Key: key})
			cancel()
			if err == nil && resp.GetStatus().GetCode() == int32(errcode.OK) {
				mu.Lock()
				lastOK = time.Now()
				mu.Unlock()
			}
		}
	})
	time.Sleep(500 * time.Millisecond) // reads flow, the lease is held
	cutErr := c.isolate(l)
	cutAt := time.Now()
	time.Sleep(3 * time.Second)
	stop()
	wg.Wait()
	if cutErr != nil {
		return 0, fmt.Errorf("cut %s off: %w", c.nodes[l].id, cutErr)
	}
	mu.Lock()
	defer mu.Unlock()
	return max(0, lastOK.Sub(cutAt)), nil
}
