package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
)

const benchClient = "moonbench"

// workload is one kind of operation; op performs one (which may carry
// several items) and returns how many items it did.
type workload struct {
	prepare func(ctx context.Context, b *bench) error
	op      func(ctx context.Context, b *bench, rng *rand.Rand) (int, error)
	done    func(ctx context.Context, b *bench) error
}

var workloadByName = map[string]workload{
	"put":         {op: opPut},
	"get":         {prepare: prepareKeys, op: opGet},
	"mixed":       {prepare: prepareKeys, op: opMixed},
	"batch-put":   {op: opBatchPut},
	"batch-get":   {prepare: prepareKeys, op: opBatchGet},
	"exist":       {prepare: prepareKeys, op: opExist},
	"batch-exist": {prepare: prepareKeys, op: opBatchExist},
	"evict":       {prepare: prepareEvict, op: opEvictPut, done: doneEvict},
}

// bench is the state one system's sweep shares between steps.
type bench struct {
	cfg   config
	cl    *client.Client
	segs  []fsm.SegmentSpec
	keySq atomic.Int64
	nonce string
}

func (b *bench) newKey() string { return fmt.Sprintf("%s/%d", b.nonce, b.keySq.Add(1)) }

func (b *bench) readKey(rng *rand.Rand) string {
	return fmt.Sprintf("%s/read/%d", b.nonce, rng.IntN(b.cfg.keys))
}

// readKeys is one batch of the read workloads' keys.
func (b *bench) readKeys(rng *rand.Rand) []string {
	keys := make([]string, b.cfg.batch)
	for i := range keys {
		keys[i] = b.readKey(rng)
	}
	return keys
}

func putPair(ctx context.Context, cl *client.Client, key string, size uint64) error {
	if _, err := cl.PutStart(ctx, key, []uint64{size}, client.ReplicateConfig{ReplicaNum: 1}, benchClient); err != nil {
		return err
	}
	return cl.PutEnd(ctx, key, benchClient)
}

func opPut(ctx context.Context, b *bench, _ *rand.Rand) (int, error) {
	return 1, putPair(ctx, b.cl, b.newKey(), 4096)
}

func opGet(ctx context.Context, b *bench, rng *rand.Rand) (int, error) {
	_, _, err := b.cl.GetReplicaList(ctx, b.readKey(rng))
	return 1, err
}

func opExist(ctx context.Context, b *bench, rng *rand.Rand) (int, error) {
	key := b.readKey(rng)
	ok, _, err := b.cl.ExistKey(ctx, key)
	if err == nil && !ok {
		err = fmt.Errorf("%s: written before the step, not found", key)
	}
	return 1, err
}

func opMixed(ctx context.Context, b *bench, rng *rand.Rand) (int, error) {
	if rng.IntN(10) == 0 {
		return opPut(ctx, b, rng)
	}
	return opGet(ctx, b, rng)
}

func opBatchPut(ctx context.Context, b *bench, _ *rand.Rand) (int, error) {
	items := make([]client.PutStartItem, b.cfg.batch)
	keys := make([]string, b.cfg.batch)
	for i := range items {
		keys[i] = b.newKey()
		items[i] = client.PutStartItem{Key: keys[i], SliceLengths: []uint64{4096}, Config: client.ReplicateConfig{ReplicaNum: 1}, ClientID: benchClient}
	}
	rs, err := b.cl.BatchPutStart(ctx, items)
	if err != nil {
		return 0, err
	}
	for _, r := range rs {
		if r.Err != nil {
			return 0, r.Err
		}
	}
	errs, err := b.cl.BatchPutEnd(ctx, benchClient, keys)
	if err != nil {
		return 0, err
	}
	for _, e := range errs {
		if e != nil {
			return 0, e
		}
	}
	return len(keys), nil
}

func opBatchGet(ctx context.Context, b *bench, rng *rand.Rand) (int, error) {
	keys := b.readKeys(rng)
	rs, err := b.cl.BatchGetReplicaList(ctx, keys)
	if err != nil {
		return 0, err
	}
	for _, r := range rs {
		if r.Err != nil {
			return 0, r.Err
		}
	}
	return len(keys), nil
}

func opBatchExist(ctx context.Context, b *bench, rng *rand.Rand) (int, error) {
	keys := b.readKeys(rng)
	rs, err := b.cl.BatchExistKey(ctx, keys)
	if err != nil {
		return 0, err
	}
	for i, r := range rs {
		if r.Err == nil && !r.Exists {
			r.Err = fmt.Errorf("%s: written before the step, not found", keys[i])
		}
		if r.Err != nil {
			return 0, r.Err
		}
	}
	return len(keys), nil
}

// prepareKeys writes the keys the read workloads read, once per system.
func prepareKeys(ctx context.Context, b *bench) error {
	if b.keySq.Load() < 0 { // marker: already prepared
		return nil
	}
	const batch = 500
	for lo := 0; lo < b.cfg.keys; lo += batch {
		var items []client.PutStartItem
		var keys []string
		for i := lo; i < min(lo+batch, b.cfg.keys); i++ {
			k := fmt.Sprintf("%s/read/%d", b.nonce, i)
			keys = append(keys, k)
			items = append(items, client.PutStartItem{Key: k, SliceLengths: []uint64{4096}, Config: client.ReplicateConfig{ReplicaNum: 1}, ClientID: benchClient})
		}
		if _, err := b.cl.BatchPutStart(ctx, items); err != nil {
			return err
		}
		if _, err := b.cl.BatchPutEnd(ctx, benchClient, keys); err != nil {
			return err
		}
	}
	b.keySq.Store(-1 << 40) // newKey stays unique; prepared from now on
	return nil
}

// The evict workload writes 64 KiB objects into 64 MiB of segments, so the
// cluster stays over its high watermark and evicts as it goes.
func prepareEvict(ctx context.Context, b *bench) error {
	for _, s := range b.segs {
		if err := b.cl.UnmountSegment(ctx, benchClient, s.ID); err != nil {
			return err
		}
	}
	return b.cl.MountSegment(ctx, benchClient, fsm.SegmentSpec{ID: "evict-seg", Name: "evict-host", Base: 1 << 50, Size: 64 << 20})
}

func opEvictPut(ctx context.Context, b *bench, _ *rand.Rand) (int, error) {
	return 1, putPair(ctx, b.cl, b.newKey(), 64<<10)
}

func doneEvict(ctx context.Context, b *bench) error {
	if err := b.cl.UnmountSegment(ctx, benchClient, "evict-seg"); err != nil {
		return err
	}
	return b.cl.ReMountSegment(ctx, benchClient, b.segs)
}

// stepResult is one (system, workload, clients) measurement.
type stepResult struct {
	System            string  `json:"system"`
	Workload          string  `json:"workload"`
	Clients           int     `json:"clients"`
	Round             int     `json:"round,omitempty"` // with --repeat: 1, 2, …
	Ops               int64   `json:"ops"`
	Seconds           float64 `json:"seconds"`
	OpsPerSec         float64 `json:"ops_per_sec"`
	P50Ms             float64 `json:"p50_ms"`
	P99Ms             float64 `json:"p99_ms"`
	P999Ms            float64 `json:"p999_ms"`
	Errors            int64   `json:"errors"`
	FirstError        string  `json:"first_error,omitempty"`
	EtcdTxnsPerSec    float64 `json:"etcd_txns_per_sec"`
	EtcdTxnsPer1kOps  float64 `json:"etcd_txns_per_1k_ops"`
	EtcdBytesPer1kOps float64 `json:"etcd_bytes_per_1k_ops"`
	LagP50Ms          float64 `json:"standby_lag_p50_ms"`
	LagP99Ms          float64 `json:"standby_lag_p99_ms"`
	LagSamples        int     `json:"standby_lag_samples"`
	// The CPU time of the process serving clients (moonraft's leader, the
	// baseline's primary) in the step, and ops per CPU second of it (ops
	// per second per core); with --local only.
	LeaderCPUSeconds   float64 `json:"leader_cpu_s,omitempty"`
	OpsPerLeaderCPUSec float64 `json:"ops_per_leader_cpu_s,omitempty"`
	// CPU microseconds per op of each process, the serving one first
	// (moonraft's leader then followers; the primary then standbys).
	CPUMicrosPerOp []float64 `json:"cpu_us_per_op,omitempty"`
	// Raft log writes over slowLogThreshold on moonraft's nodes in the step (--local):
	// a stalled disk, which every standby's lag shows.
	SlowLogWrites int64 `json:"slow_log_writes,omitempty"`
}

// sweep runs every workload at every client count against every system,
// the systems taking turns at each step, cfg.repeat rounds of turns: what
// two systems are compared on was measured moments apart, on a machine
// whose speed drifts over minutes.
func sweep(ctx context.Context, cfg config, systems []system, rep *report) error {
	benches := make([]*bench, len(systems))
	for i, sys := range systems {
		b := &bench{cfg: cfg, cl: sys.client(), nonce: fmt.Sprintf("bench-%d-%d", time.Now().UnixNano(), i)}
		var err error
		if b.segs, err = mountFor(ctx, b.cl, benchClient); err != nil {
			return fmt.Errorf("%s: mount: %w", sys.name(), err)
		}
		kctx, kcancel := context.WithCancel(ctx)
		keeper := b.cl.KeepAlive(kctx, benchClient, b.segs, 0)
		defer func() { kcancel(); keeper.Stop() }()
		benches[i] = b
	}
	total := len(cfg.workloads) * len(cfg.clients) * cfg.repeat * len(systems)
	n := 0
	for _, name := range cfg.workloads {
		w := workloadByName[name]
		for i, sys := range systems {
			if w.prepare != nil {
				progressf("%s: preparing %s", sys.name(), name)
				if err := w.prepare(ctx, benches[i]); err != nil {
					return fmt.Errorf("%s %s: prepare: %w", sys.name(), name, err)
				}
			}
		}
		for _, clients := range cfg.clients {
			for round := 1; round <= cfg.repeat; round++ {
				for i, sys := range systems {
					n++
					label := fmt.Sprintf("[%d/%d] %s %s clients=%d", n, total, sys.name(), name, clients)
					if cfg.repeat > 1 {
						label += fmt.Sprintf(" round %d/%d", round, cfg.repeat)
					}
					res, err := runStep(ctx, benches[i], systems, sys, name, w, clients, label)
					if err != nil {
						return err
					}
					res.Round = round
					rep.Steps = append(rep.Steps, res)
				}
			}
		}
		for i, sys := range systems {
			if w.done != nil {
				if err := w.done(ctx, benches[i]); err != nil {
					return fmt.Errorf("%s %s: %w", sys.name(), name, err)
				}
			}
		}
	}
	return nil
}

// settleQuiet is how long a step waits, once the previous step's backlog
// has drained, for once-a-second background work (lease renewals to etcd)
// to finish.
const settleQuiet = 2 * time.Second

// settle waits until every system has finished the work the previous
// steps left behind — OpLog entries not yet in etcd, standbys behind the
// leader — so that a step measures its own load, not its predecessors'
// (up to a minute each; the step then goes on, and the progress line says
// so).
func settle(ctx context.Context, systems []system, label string) {
	for _, sys := range systems {
		drain(ctx, sys, label)
	}
	select {
	case <-ctx.Done():
	case <-time.After(settleQuiet):
	}
}

func drain(ctx context.Context, sys system, label string) {
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var (
		target uint64 // the leader's position when settling began
		known  bool
	)
	for {
		pctx, pcancel := context.WithTimeout(sctx, time.Second)
		leader, standbys, err := sys.positions(pctx)
		var backlog uint64
		if err == nil {
			backlog, err = sys.exportBacklog(pctx)
		}
		pcancel()
		if err == nil {
			if !known {
				target, known = leader, true
			}
			behind := backlog > 0
			for _, p := range standbys {
				behind = behind || p < target
			}
			if !behind {
				break
			}
		}
		select {
		case <-sctx.Done():
			progressf("%s: %s's backlog from the previous step did not drain within a minute; measuring anyway", label, sys.name())
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// runStep measures one step of sys once all systems have settled.
func runStep(ctx context.Context, b *bench, systems []system, sys system, name string, w workload, clients int, label string) (stepResult, error) {
	res := stepResult{System: sys.name(), Workload: name, Clients: clients}
	progressLive("%s: settling", label)
	settle(ctx, systems, label)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		measuring atomic.Bool
		items     atomic.Int64
		done      atomic.Int64 // items done, measured or not
		errs      atomic.Int64
		firstErr  atomic.Pointer[string]
		mu        sync.Mutex
		lats      []time.Duration
		wg        sync.WaitGroup
	)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			var mine []time.Duration
			defer func() { mu.Lock(); lats = append(lats, mine...); mu.Unlock() }()
			for sctx.Err() == nil {
				octx, ocancel := context.WithTimeout(sctx, 10*time.Second)
				start := time.Now()
				n, err := w.op(octx, b, rng)
				d := time.Since(start)
				ocancel()
				if err == nil {
					done.Add(int64(n))
				}
				if !measuring.Load() || sctx.Err() != nil {
					continue
				}
				if err != nil {
					errs.Add(1)
					msg := errcode.Of(err).String() + ": " + err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					continue
				}
				items.Add(int64(n))
				mine = append(mine, d)
				if b.cfg.ops > 0 && items.Load() >= int64(b.cfg.ops) {
					cancel()
				}
			}
		}(uint64(c))
	}
	progressf("%s: warm-up %v", label, b.cfg.warmup)
	select {
	case <-ctx.Done():
	case <-time.After(b.cfg.warmup):
	}
	// etcd's counters are read over HTTP while the load runs: the items
	// done by then (the mean of before and after the read) are what they
	// count, whatever the read's delay.
	etcdAt := func() (etcdLoad, time.Time, float64) {
		before := done.Load()
		l, at := etcdNow(ctx, sys)
		return l, at, float64(before+done.Load()) / 2
	}
	etcd0, at0, done0 := etcdAt()
	lagDone := make(chan lagStats, 1)
	lctx, lcancel := context.WithCancel(sctx)
	go func() { lagDone <- sampleLag(lctx, sys) }()
	var profDone chan error
	if lc, ok := sys.(*localCluster); ok && b.cfg.profileDir != "" {
		profDone = make(chan error, 1)
		prefix := filepath.Join(b.cfg.profileDir, fmt.Sprintf("%s-%s-%d", sys.name(), name, clients))
		go func() { profDone <- lc.profileNodes(ctx, max(b.cfg.duration, time.Second), prefix) }()
	}
	cpu := startCPU(ctx, sys)
	slow := startSlowLogWrites(ctx, sys)
	start := time.Now()
	measuring.Store(true)
	tick := time.NewTicker(500 * time.Millisecond)
	for running := true; running; {
		select {
		case <-sctx.Done():
			running = false
		case <-tick.C:
			el := time.Since(start)
			progressLive("%s: %v, %.0f ops/s", label, el.Round(time.Second), float64(items.Load())/el.Seconds())
			if b.cfg.ops == 0 && el >= b.cfg.duration {
				running = false
			}
		}
	}
	tick.Stop()
	measuring.Store(false)
	elapsed := time.Since(start)
	cpuUsed, cpuKnown := cpu()
	res.SlowLogWrites = slow()
	etcd1, at1, done1 := etcdAt()
	lcancel()
	cancel()
	wg.Wait()
	lag := <-lagDone
	if profDone != nil {
		if err := <-profDone; err != nil {
			progressf("%s: no profile: %v", label, err)
		}
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	res.Ops, res.Errors, res.Seconds = items.Load(), errs.Load(), elapsed.Seconds()
	if p := firstErr.Load(); p != nil {
		res.FirstError = *p
	}
	res.OpsPerSec = float64(res.Ops) / res.Seconds
	slices.Sort(lats)
	res.P50Ms, res.P99Ms, res.P999Ms = ms(quantile(lats, 0.5)), ms(quantile(lats, 0.99)), ms(quantile(lats, 0.999))
	if span := at1.Sub(at0).Seconds(); etcd0.known && etcd1.known && done1 > done0 && span > 0 {
		// Over the counters' own window, which reading them over HTTP
		// makes a little wider than the measured one.
		res.EtcdTxnsPerSec = (etcd1.txns - etcd0.txns) / span
		res.EtcdTxnsPer1kOps = (etcd1.txns - etcd0.txns) / (done1 - done0) * 1000
		res.EtcdBytesPer1kOps = (etcd1.bytes - etcd0.bytes) / (done1 - done0) * 1000
	}
	res.LagP50Ms, res.LagP99Ms, res.LagSamples = ms(lag.p50), ms(lag.p99), lag.n
	if cpuKnown && cpuUsed[0] > 0 && res.Ops > 0 {
		res.LeaderCPUSeconds = cpuUsed[0].Seconds()
		res.OpsPerLeaderCPUSec = float64(res.Ops) / res.LeaderCPUSeconds
		for _, c := range cpuUsed {
			res.CPUMicrosPerOp = append(res.CPUMicrosPerOp, float64(c.Microseconds())/float64(res.Ops))
		}
	}
	progressDone("%s: %.0f ops/s, p99 %.2f ms, %d errors, standby lag p99 %.1f ms%s", label, res.OpsPerSec, res.P99Ms, res.Errors, res.LagP99Ms, res.slowNote())
	return res, nil
}

func (s stepResult) slowNote() string {
	if s.SlowLogWrites == 0 {
		return ""
	}
	return fmt.Sprintf(", %d Raft log writes over %g ms (a stalled disk)", s.SlowLogWrites, slowLogThreshold*1000)
}

// startSlowLogWrites counts slow Raft log writes from now; the returned
// func says how many there were since (0 where they cannot be read).
func startSlowLogWrites(ctx context.Context, sys system) func() int64 {
	lc, ok := sys.(*localCluster)
	if !ok {
		return func() int64 { return 0 }
	}
	n0, err0 := lc.slowLogWrites(ctx)
	return func() int64 {
		n1, err1 := lc.slowLogWrites(ctx)
		if err0 != nil || err1 != nil {
			return 0
		}
		return n1 - n0
	}
}

// etcdNow reads sys's etcd counters and when they were read (the middle
// of the request).
func etcdNow(ctx context.Context, sys system) (etcdLoad, time.Time) {
	start := time.Now()
	l := sys.etcd(ctx)
	return l, start.Add(time.Since(start) / 2)
}

// startCPU starts measuring the CPU time of the system's processes (a
// local cluster's nodes, the baseline's); the returned func says how much
// each used since, the serving one first (false when not known: a remote
// cluster, or the leader changed or a process died meanwhile).
func startCPU(ctx context.Context, sys system) func() ([]time.Duration, bool) {
	none := func() ([]time.Duration, bool) { return nil, false }
	ps, err := sys.serverProcs(ctx)
	if err != nil || len(ps) == 0 {
		return none
	}
	c0 := make([]time.Duration, len(ps))
	for i, p := range ps {
		if c0[i], err = p.CPUTime(); err != nil {
			return none
		}
	}
	return func() ([]time.Duration, bool) {
		now, err := sys.serverProcs(ctx)
		if err != nil || len(now) == 0 || now[0] != ps[0] {
			return nil, false
		}
		used := make([]time.Duration, len(ps))
		for i, p := range ps {
			c1, err := p.CPUTime()
			if err != nil {
				return nil, false
			}
			used[i] = c1 - c0[i]
		}
		return used, true
	}
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type lagStats struct {
	p50, p99 time.Duration
	n        int
}

// sampleLag measures, every 10 ms, how long after the leader reached a
// position each standby reaches it (resolution ±10 ms). A position a
// standby has not reached by the end counts with its age then: a lower
// bound, but a standby that never catches up must not look like one
// without lag.
func sampleLag(ctx context.Context, sys system) lagStats {
	type mark struct {
		pos uint64
		at  time.Time
	}
	var pending [][]mark
	var lags []time.Duration
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			end := time.Now()
			for _, marks := range pending {
				for _, m := range marks {
					lags = append(lags, end.Sub(m.at))
				}
			}
			slices.Sort(lags)
			return lagStats{quantile(lags, 0.5), quantile(lags, 0.99), len(lags)}
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		leader, standbys, err := sys.positions(pctx)
		cancel()
		if err != nil {
			continue
		}
		now := time.Now()
		for len(pending) < len(standbys) {
			pending = append(pending, nil)
		}
		for i, pos := range standbys {
			pending[i] = append(pending[i], mark{leader, now})
			j := 0
			for ; j < len(pending[i]) && pending[i][j].pos <= pos; j++ {
				lags = append(lags, now.Sub(pending[i][j].at))
			}
			pending[i] = pending[i][j:]
		}
	}
}
