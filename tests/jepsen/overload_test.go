package jepsen

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
)

// Overload: the herd is ten times the clients at which a cluster's puts
// peak (moonbench: 256 on this kind of machine), each call with a short
// deadline, sharing connections as the workers of a few inference hosts do.
const (
	overloadConns    = 64
	overloadDeadline = 200 * time.Millisecond
	overloadHerdFor  = 10 * time.Second
	overloadHeapMax  = 1 << 30 // the leader's heap in use while the herd runs
	steadyClients    = 16
	steadyFor        = 3 * time.Second
)

// callStats counts the outcomes of the calls of one phase.
type callStats struct {
	pairs, ok, tooMany, deadline atomic.Int64
	mu                           sync.Mutex
	took                         []time.Duration // every call's
	other                        []string        // unexpected errors, the first few
}

// quantile is the q-quantile of the calls' durations.
func (s *callStats) quantile(q float64) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.took) == 0 {
		return 0
	}
	slices.Sort(s.took)
	return s.took[int(q*float64(len(s.took)-1))]
}

// note records one call that took d and ended with err, its deadline
// being deadline. A call that ended at its deadline is a deadline error
// whatever it says: gRPC's server side may end it (RST_STREAM) a moment
// before the caller's own timer does.
func (s *callStats) note(d, deadline time.Duration, err error) {
	s.mu.Lock()
	s.took = append(s.took, d)
	s.mu.Unlock()
	switch {
	case err == nil:
		s.ok.Add(1)
	case errcode.Of(err) == errcode.TooManyRequests:
		s.tooMany.Add(1)
	case d >= deadline-10*time.Millisecond:
		s.deadline.Add(1)
	default:
		s.mu.Lock()
		if len(s.other) < 10 {
			s.other = append(s.other, err.Error())
		}
		s.mu.Unlock()
	}
}

// putLoops runs n clients putting fresh keys (PutStart, then PutEnd) on
// the connections cls until ctx ends, each call with its own deadline.
func putLoops(ctx context.Context, cls []*moonclient.Client, n int, prefix string, deadline time.Duration, st *callStats) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cl, id := cls[i%len(cls)], fmt.Sprintf("%s-%d", prefix, i%256)
			call := func(f func(context.Context) error) error {
				start := time.Now()
				cctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				err := f(cctx)
				st.note(time.Since(start), deadline, err)
				return err
			}
			for seq := 0; ctx.Err() == nil; seq++ {
				key := fmt.Sprintf("%s/%d/%d", prefix, i, seq)
				if call(func(ctx context.Context) error {
					_, err := cl.PutStart(ctx, key, []uint64{64}, moonclient.ReplicateConfig{ReplicaNum: 1}, id)
					return err
				}) != nil {
					continue
				}
				if call(func(ctx context.Context) error { return cl.PutEnd(ctx, key, id) }) == nil {
					st.pairs.Add(1)
				}
			}
		})
	}
	wg.Wait()
}

// TestOverload is `make overload`: a herd of ten times the clients the
// cluster can serve, each call with a 200 ms deadline, for ten seconds.
// The leader keeps its leadership (no election caused by load), its memory
// stays bounded, every call ends within its deadline with success,
// TOO_MANY_REQUESTS or a deadline error, and when the herd leaves the
// puts of a steady load go through at once, at about the rate they had
// before.
func TestOverload(t *testing.T) {
	herd, _ := strconv.Atoi(os.Getenv("OVERLOAD_CLIENTS"))
	if herd <= 0 {
		t.Skip("OVERLOAD_CLIENTS is not set: this heavy run is opt-in (make overload)")
	}
	cfg := clusterConfig{nodes: 3, logLevel: "warn", direct: true}
	if p := os.Getenv("OVERLOAD_MAX_PENDING"); p != "" {
		cfg.extraArgs = []string{"--max-pending-writes", p} // to compare with the default
	}
	c, l := testCluster(t, cfg)
	var eps []string
	for _, p := range c.nodes {
		eps = append(eps, p.grpcAddr)
	}
	cls := make([]*moonclient.Client, overloadConns)
	for i := range cls {
		cl, err := moonclient.Dial(moonclient.Config{Endpoints: eps}) // the defaults: what users run
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		cls[i] = cl
	}
	var segs []fsm.SegmentSpec
	for i := range 4 {
		seg := fsm.SegmentSpec{ID: fmt.Sprint("herd-seg-", i), Name: fmt.Sprint("herd-host-", i), Base: uint64(i+1) << 40, Size: 1 << 36}
		if err := retry(context.Background(), func(ctx context.Context) error { return c.admin.MountSegment(ctx, "herd-owner", seg) }); err != nil {
			t.Fatal(err)
		}
		segs = append(segs, seg)
	}
	// The segments' owner stays alive on a connection of its own, as a
	// real client's keep-alive does (the herd's pings would queue with it).
	keeper := c.admin.KeepAlive(context.Background(), "herd-owner", segs, 0)
	defer keeper.Stop()
	steady := func(name string) int64 {
		var st callStats
		ctx, cancel := context.WithTimeout(context.Background(), steadyFor)
		defer cancel()
		putLoops(ctx, cls[:steadyClients], steadyClients, name, 2*time.Second, &st)
		if len(st.other) > 0 {
			t.Errorf("%s: unexpected errors under a steady load: %v", name, st.other)
		}
		t.Logf("%s: %d clients, %.0f put pairs/s", name, steadyClients, float64(st.pairs.Load())/steadyFor.Seconds())
		return st.pairs.Load()
	}
	before := steady("before")
	var term uint64
	for deadline := time.Now().Add(10 * time.Second); term == 0; {
		if term = c.statuses(time.Second)[l].GetTerm(); time.Now().After(deadline) {
			t.Fatalf("%s does not answer Status", c.nodes[l].id)
		}
	}

	var st callStats
	ctx, cancel := context.WithTimeout(context.Background(), overloadHerdFor)
	var heapMax float64
	var elections []string
	var watch sync.WaitGroup
	watch.Go(func() {
		s := newSampler(c)
		for sleepCtx(ctx, 500*time.Millisecond) == nil {
			if h := s.scrape(ctx, c.nodes[l].httpAddr)["go_memstats_heap_inuse_bytes"]; h > heapMax {
				heapMax = h
			}
			for i, ns := range c.statuses(time.Second) {
				if ns != nil && ns.Term != term {
					elections = append(elections, fmt.Sprintf("%s at term %d (%s)", c.nodes[i].id, ns.Term, ns.Role))
				}
			}
		}
	})
	start := time.Now()
	putLoops(ctx, cls, herd, "herd", overloadDeadline, &st)
	cancel()
	watch.Wait()
	p50, p99, slowest := st.quantile(0.5), st.quantile(0.99), st.quantile(1)
	t.Logf("herd: %d clients on %d connections for %v: %.0f put pairs/s; calls: %d ok, %d TOO_MANY_REQUESTS, %d at their %v deadline; call duration p50 %v, p99 %v, max %v; leader heap in use at most %.0f MiB",
		herd, overloadConns, time.Since(start).Round(time.Second), float64(st.pairs.Load())/overloadHerdFor.Seconds(),
		st.ok.Load(), st.tooMany.Load(), st.deadline.Load(), overloadDeadline,
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), slowest.Round(time.Millisecond), heapMax/(1<<20))
	if len(elections) > 0 {
		t.Errorf("the load caused an election: %v", elections)
	}
	if heapMax > overloadHeapMax {
		t.Errorf("the leader's heap reached %.0f MiB under the herd (bound %d MiB)", heapMax/(1<<20), overloadHeapMax>>20)
	}
	if len(st.other) > 0 {
		t.Errorf("calls under overload ended with other errors than TOO_MANY_REQUESTS or their deadline: %v", st.other)
	}
	// The herd's own process shares the two cores with the cluster, so a
	// call's clock includes its wait for a core: the bound is on p99.
	if p99 > 2*overloadDeadline {
		t.Errorf("calls took up to %v (p99) with a %v deadline: they are not ended quickly", p99, overloadDeadline)
	}

	after := steady("after")
	if after < before/3 {
		t.Errorf("throughput did not recover when the herd left: %d put pairs in %v after, %d before", after, steadyFor, before)
	}
	if ls := c.statuses(time.Second)[l]; ls.GetRole() != "leader" || ls.GetTerm() != term {
		t.Errorf("%s is no longer the leader of term %d: %v", c.nodes[l].id, term, ls)
	}
}
