package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/internal/localcluster"
	"golang.org/x/term"
)

// failoverResult is the distribution of write gaps around kills of the
// serving process, and the acknowledged writes the survivors do not have.
type failoverResult struct {
	System   string    `json:"system"`
	Signal   string    `json:"signal"` // how the serving process was ended: SIGKILL, or SIGSTOP until another served
	Kills    int       `json:"kills"`
	GapsMs   []float64 `json:"gaps_ms"`
	P50Ms    float64   `json:"p50_ms"`
	MaxMs    float64   `json:"max_ms"`
	Clients  int       `json:"clients"`
	Failures int64     `json:"failed_writes"`
	Acked    int       `json:"acknowledged_writes"`
	Lost     int       `json:"lost_writes"`
}

// failoverClients is the steady write load of a failover measurement.
const failoverClients = 8

// writeLoad is failoverClients writers of put pairs, each to the client
// target returns at the time, recording every success.
type writeLoad struct {
	mu        sync.Mutex
	successes []time.Time
	acked     []string
	failures  atomic.Int64
	stop      context.CancelFunc
	wg        sync.WaitGroup
}

func startWriteLoad(ctx context.Context, b *bench, target func() *client.Client) *writeLoad {
	w := &writeLoad{}
	lctx, stop := context.WithCancel(ctx)
	w.stop = stop
	for range failoverClients {
		w.wg.Go(func() {
			for lctx.Err() == nil {
				key := b.newKey()
				octx, cancel := context.WithTimeout(lctx, 500*time.Millisecond)
				err := putPair(octx, target(), key, 4096)
				cancel()
				if err != nil {
					w.failures.Add(1)
					continue
				}
				w.mu.Lock()
				w.successes = append(w.successes, time.Now())
				w.acked = append(w.acked, key)
				w.mu.Unlock()
			}
		})
	}
	return w
}

// abort stops the writers.
func (w *writeLoad) abort() {
	w.stop()
	w.wg.Wait()
}

// finish stops the writers and fills in res from what they recorded and
// the kills, counting the acknowledged keys cl does not have.
func (w *writeLoad) finish(ctx context.Context, cl *client.Client, kills []time.Time, res *failoverResult) error {
	w.abort()
	res.Kills += len(kills) // finish may run once per kill (a fresh baseline each)
	res.Clients = failoverClients
	res.GapsMs = append(res.GapsMs, failoverGaps(w.successes, kills)...)
	res.Failures += w.failures.Load()
	lost, err := countMissing(ctx, cl, w.acked)
	if err != nil {
		return err
	}
	res.Acked += len(w.acked)
	res.Lost += lost
	return nil
}

// countMissing asks cl which of keys do not exist.
func countMissing(ctx context.Context, cl *client.Client, keys []string) (int, error) {
	missing := 0
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		var rs []client.ExistResult
		err := retryUntil(ctx, 10*time.Second, func(ctx context.Context) error {
			var err error
			rs, err = cl.BatchExistKey(ctx, keys[:n])
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("check acknowledged writes: %w", err)
		}
		for i, r := range rs {
			if r.Err != nil {
				return 0, fmt.Errorf("check acknowledged write %s: %w", keys[i], r.Err)
			}
			if !r.Exists {
				missing++
			}
		}
		keys = keys[n:]
	}
	return missing, nil
}

func (res *failoverResult) summarize() {
	g := slices.Clone(res.GapsMs)
	slices.Sort(g)
	if len(g) > 0 {
		res.P50Ms, res.MaxMs = g[len(g)/2], g[len(g)-1]
	}
	progressDone("%s failover: %d kills, window without successful writes p50 %.0f ms, max %.0f ms; %d of %d acknowledged writes lost",
		res.System, len(g), res.P50Ms, res.MaxMs, res.Lost, res.Acked)
}

// measureFailover kills the leader cfg.failover times under a steady write
// load, restarting it each time (or, with cfg.failoverStop, stops it and
// resumes it once another node serves), and measures each window without
// a successful write that the kill caused (failoverGaps); at the end it
// counts the acknowledged writes the cluster does not have.
func measureFailover(ctx context.Context, cfg config, lc *localCluster) (*failoverResult, error) {
	b := &bench{cfg: cfg, cl: lc.cl, nonce: fmt.Sprintf("failover-%d", time.Now().UnixNano())}
	segs, err := mountFor(ctx, b.cl, benchClient)
	if err != nil {
		return nil, err
	}
	kctx, kcancel := context.WithCancel(ctx)
	keeper := b.cl.KeepAlive(kctx, benchClient, segs, 0)
	defer func() { kcancel(); keeper.Stop() }()
	load := startWriteLoad(ctx, b, func() *client.Client { return b.cl })
	res := &failoverResult{System: lc.name(), Signal: "SIGKILL"}
	end, restart := func(l *localcluster.Node) { l.Kill() }, (*localcluster.Node).Start
	if cfg.failoverStop {
		res.Signal = "SIGSTOP"
		end = func(l *localcluster.Node) { l.Signal(syscall.SIGSTOP) }
		restart = func(l *localcluster.Node) error { l.Signal(syscall.SIGCONT); return nil }
	}
	var kills []time.Time
	for i := 0; i < cfg.failover && ctx.Err() == nil; i++ {
		time.Sleep(time.Second)
		l, err := lc.leader(ctx)
		if err != nil {
			break
		}
		progressf("%s failover %d/%d: %s to %s", res.System, i+1, cfg.failover, res.Signal, l.ID)
		kills = append(kills, time.Now())
		end(l)
		if _, err := lc.leader(ctx); err != nil {
			break
		}
		time.Sleep(time.Second) // writes resume on the new leader
		if err := restart(l); err != nil {
			load.abort()
			return nil, err
		}
		// The next kill must find a whole cluster: a node still loading a
		// large snapshot would leave the election without a quorum and
		// measure the restart, not the failover.
		if err := lc.caughtUp(ctx, l); err != nil {
			load.abort()
			return nil, err
		}
	}
	time.Sleep(time.Second)
	if err := load.finish(ctx, b.cl, kills, res); err != nil {
		return nil, err
	}
	res.summarize()
	return res, nil
}

// measureBaselineFailover runs cfg.failover failovers of a baseline, each
// on a fresh one: writers on the primary for two seconds, SIGKILL, the
// first standby promoted (SIGUSR1: it catches up from etcd, then serves;
// moonbench promotes at once, where a real deployment first waits for the
// primary's etcd lease to expire, so the window is a lower bound), the
// writers' client remounts its segments there and writes on; then the
// acknowledged writes the promoted standby does not have are counted.
func measureBaselineFailover(ctx context.Context, cfg config, mode string) (*failoverResult, error) {
	res := &failoverResult{System: mode, Signal: "SIGKILL"}
	for i := 0; i < cfg.failover && ctx.Err() == nil; i++ {
		progressf("%s failover %d/%d", mode, i+1, cfg.failover)
		if err := baselineFailoverOnce(ctx, cfg, mode, res); err != nil {
			return nil, err
		}
	}
	res.summarize()
	return res, nil
}

func baselineFailoverOnce(ctx context.Context, cfg config, mode string, res *failoverResult) error {
	base, err := openBaseline(ctx, cfg, mode)
	if err != nil {
		return err
	}
	defer base.close()
	b := &bench{cfg: cfg, cl: base.cl, nonce: fmt.Sprintf("failover-%d", time.Now().UnixNano())}
	if _, err := mountFor(ctx, base.cl, benchClient); err != nil {
		return err
	}
	promoted, err := client.Dial(client.Config{Endpoints: base.addrs[1:2]})
	if err != nil {
		return err
	}
	defer promoted.Close()
	var target atomic.Pointer[client.Client]
	target.Store(base.cl)
	load := startWriteLoad(ctx, b, target.Load)
	time.Sleep(2 * time.Second)
	kill := time.Now()
	base.primary.Kill()
	base.standbys[0].Signal(syscall.SIGUSR1)
	err = retryUntil(ctx, 30*time.Second, func(ctx context.Context) error {
		st, err := promoted.Progress(ctx, base.addrs[1])
		if err == nil && st.Role != "leader" {
			err = errors.New("not promoted yet")
		}
		return err
	})
	if err == nil {
		_, err = mountFor(ctx, promoted, benchClient) // as the client's keep-alive would on NEED_REMOUNT
	}
	if err != nil {
		load.abort()
		return fmt.Errorf("%s: promote the standby: %w", mode, err)
	}
	target.Store(promoted)
	time.Sleep(2 * time.Second)
	return load.finish(ctx, promoted, []time.Time{kill}, res)
}

// failoverGaps returns, for each kill, the longest stretch without a
// successful write from the last success before the kill until the next
// kill (or the end). The first success after the kill is not enough: a
// write the dying leader committed just before the signal can be
// acknowledged a moment after it, and would hide the gap that follows.
func failoverGaps(successes, kills []time.Time) []float64 {
	slices.SortFunc(successes, func(a, b time.Time) int { return a.Compare(b) })
	var gaps []float64
	for n, k := range kills {
		i, _ := slices.BinarySearchFunc(successes, k, func(a, b time.Time) int { return a.Compare(b) })
		if i == 0 || i >= len(successes) {
			continue
		}
		end := len(successes)
		if n+1 < len(kills) {
			end, _ = slices.BinarySearchFunc(successes, kills[n+1], func(a, b time.Time) int { return a.Compare(b) })
		}
		var longest time.Duration
		for j := i; j < end; j++ {
			longest = max(longest, successes[j].Sub(successes[j-1]))
		}
		gaps = append(gaps, ms(longest))
	}
	return gaps
}

// Progress goes to stderr: one live line on a terminal, plain lines
// otherwise.
var stderrIsTerminal = term.IsTerminal(int(os.Stderr.Fd()))

func progressf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func progressLive(format string, args ...any) {
	if stderrIsTerminal {
		fmt.Fprintf(os.Stderr, "\r\033[K"+format, args...)
	}
}

func progressDone(format string, args ...any) {
	if stderrIsTerminal {
		fmt.Fprint(os.Stderr, "\r\033[K")
	}
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}
