package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/internal/localcluster"
	"github.com/moonraft/moonraft/mckeeper"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// TestMain lets the test binary play the baseline's processes, etcd and
// the probe, as the moonbench binary does: they start cfg.benchBin with
// their commands.
func TestMain(m *testing.M) {
	isChild, err := runChild(os.Args[1:])
	if !isChild {
		code := m.Run()
		if builtDir != "" {
			os.RemoveAll(builtDir)
		}
		os.Exit(code)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		args []string
		err  string
	}{
		{[]string{"--local"}, ""},
		{[]string{"--from-json", "r.json"}, ""},
		{[]string{"--endpoints", "a:1,b:2", "--workload", "get,mixed", "--clients", "1,2"}, ""},
		{[]string{}, "either --endpoints or --local"},
		{[]string{"--local", "--endpoints", "a:1"}, "either --endpoints or --local"},
		{[]string{"--local", "--workload", "nope"}, `unknown workload "nope"`},
		{[]string{"--local", "--clients", "1,x"}, `"x" is not a positive number`},
		{[]string{"--local", "--clients", "0"}, `"0" is not a positive number`},
		{[]string{"--local", "--baseline", "other"}, "neither raw-etcd-watch nor raw-etcd-watch-async"},
		{[]string{"--local", "--baseline", "raw-etcd-watch,raw-etcd-watch-async", "--failover", "2"}, ""},
		{[]string{"--endpoints", "a:1", "--baseline", "raw-etcd-watch"}, "--baseline needs --local"},
		{[]string{"--endpoints", "a:1", "--failover", "3"}, "--failover needs --local"},
		{[]string{"--local", "--failover", "3", "--failover-stop"}, ""},
		{[]string{"--local", "--failover-stop"}, "--failover-stop needs --failover"},
		{[]string{"--local", "--failover", "3", "--failover-stop", "--baseline", "raw-etcd-watch"}, "--failover-stop measures moonraft alone"},
		{[]string{"--local", "--batch", "0"}, "--batch must be positive"},
		{[]string{"--local", "--repeat", "0"}, "--repeat must be positive"},
		{[]string{"--local", "--repeat", "3", "--baseline", "raw-etcd-watch"}, ""},
		{[]string{"--local", "--read-mode", "lease,quorum", "--workload", "exist,batch-exist"}, ""},
		{[]string{"--local", "--read-mode", "fast"}, "neither lease nor quorum"},
		{[]string{"--endpoints", "a:1", "--read-mode", "quorum"}, "--read-mode needs --local"},
		{[]string{"--local", "--raft-log-store", "boltdb,wal"}, ""},
		{[]string{"--local", "--raft-log-store", "rocksdb"}, "neither wal nor boltdb"},
		{[]string{"--endpoints", "a:1", "--raft-log-store", "wal"}, "--raft-log-store needs --local"},
		{[]string{"--local", "--scale", "1000,5000", "--scale-clients", "100"}, ""},
		{[]string{"--local", "--scale", "5000,1000"}, `"1000" is not a positive count above the one before`},
		{[]string{"--local", "--scale", "0"}, `"0" is not a positive count`},
		{[]string{"--endpoints", "a:1", "--scale", "1000"}, "--scale needs --local"},
		{[]string{"--local", "--scale", "1000", "--scale-clients", "2"}, "--scale-clients must be at least 8"},
		{[]string{"--local", "--scale", "1000", "--scale-kills", "0"}, "--scale-kills must be at least 1"},
		{[]string{"--local", "--node-flags", "--heap-headroom 1"}, ""},
		{[]string{"--endpoints", "a:1", "--node-flags", "--heap-headroom 1"}, "--node-flags needs --local"},
	}
	for _, tt := range tests {
		_, err := parse(tt.args)
		if tt.err == "" {
			assert.NoError(t, err, "%v", tt.args)
		} else {
			assert.ErrorContains(t, err, tt.err, "%v", tt.args)
		}
	}
}

func TestAckTracker(t *testing.T) {
	a := ackTracker{acked: map[uint64]bool{}}
	assert.Equal(t, uint64(0), a.ack(2), "1 is still missing")
	assert.Equal(t, uint64(0), a.ack(3))
	assert.Equal(t, uint64(3), a.ack(1), "the prefix 1..3 is complete")
	assert.Equal(t, uint64(4), a.ack(4))
	assert.Empty(t, a.acked)
}

func TestQuantileAndRatios(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	assert.Equal(t, time.Duration(5), quantile(d, 0.5))
	assert.Equal(t, time.Duration(10), quantile(d, 1))
	assert.Zero(t, quantile(nil, 0.5))
	r := &report{Steps: []stepResult{
		{System: "moonraft", Workload: "put", Clients: 8, OpsPerSec: 1000, P50Ms: 1, P99Ms: 2, LagP99Ms: 5},
		{System: "moonraft-quorum", Workload: "put", Clients: 8, OpsPerSec: 500, P50Ms: 4, P99Ms: 4, LagP99Ms: 5},
		{System: "raw-etcd-watch", Workload: "put", Clients: 8, OpsPerSec: 100, P50Ms: 2, P99Ms: 8, LagP99Ms: 0},
		{System: "moonraft", Workload: "get", Clients: 8, OpsPerSec: 5},
	}}
	rs := r.ratios()
	require.Len(t, rs, 2, "only steps the baseline ran too, for each other system")
	assert.Equal(t, ratio{"moonraft", "put", 8, 10, 0.5, 0.25, 0, []float64{10}}, rs[0], "a zero denominator gives 0, not Inf")
	assert.Equal(t, ratio{"moonraft-quorum", "put", 8, 5, 2, 0.5, 0, []float64{5}}, rs[1])
}

// TestRepeatedSteps: with --repeat, a row is each column's median over the
// rounds (errors added up), and the ratio is of the medians, with each
// round's own ratio beside it.
func TestRepeatedSteps(t *testing.T) {
	r := &report{Steps: []stepResult{
		{System: "moonraft", Workload: "put", Clients: 64, Round: 1, OpsPerSec: 3000, P99Ms: 40, CPUMicrosPerOp: []float64{200, 70}},
		{System: baselineSync, Workload: "put", Clients: 64, Round: 1, OpsPerSec: 3000, P99Ms: 30},
		{System: "moonraft", Workload: "put", Clients: 64, Round: 2, OpsPerSec: 5000, P99Ms: 20, Errors: 2, FirstError: "x", CPUMicrosPerOp: []float64{150, 50}, LagP99Ms: 160, SlowLogWrites: 3},
		{System: baselineSync, Workload: "put", Clients: 64, Round: 2, OpsPerSec: 4000, P99Ms: 25},
		{System: "moonraft", Workload: "put", Clients: 64, Round: 3, OpsPerSec: 4400, P99Ms: 30, Errors: 1, CPUMicrosPerOp: []float64{160, 60}},
		{System: baselineSync, Workload: "put", Clients: 64, Round: 3, OpsPerSec: 5000, P99Ms: 20},
	}}
	rows := r.summary()
	require.Len(t, rows, 2)
	m := rows[0]
	assert.Equal(t, "moonraft", m.System, "systems in the order they ran")
	assert.Equal(t, 4400.0, m.OpsPerSec)
	assert.Equal(t, 30.0, m.P99Ms)
	assert.Equal(t, int64(3), m.Errors)
	assert.Equal(t, "x", m.FirstError)
	assert.Equal(t, []float64{160, 60}, m.CPUMicrosPerOp)
	assert.Equal(t, []float64{3000, 5000, 4400}, m.runs)
	assert.Equal(t, int64(3), m.SlowLogWrites, "added up")
	rs := r.ratios()
	require.Len(t, rs, 1)
	assert.Equal(t, 1.1, rs[0].throughput, "4400 / 4000")
	assert.Equal(t, []float64{1, 1.25, 0.88}, rs[0].rounds)
	assert.Equal(t, 2.5, median([]float64{4, 1, 2, 3}))

	var out bytes.Buffer
	require.NoError(t, r.output(&out, config{}))
	assert.Contains(t, out.String(), "3000 / 5000 / 4400")
	assert.Contains(t, out.String(), "1.00 / 1.25 / 0.88")
	assert.Contains(t, out.String(), "moonraft put clients=64 round 2: standby lag p99 160.0 ms, 3 Raft log writes over 64 ms (a stalled disk)")
}

func TestFailoverGaps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	// Kill at 100: one write lands just after it (105), then nothing until
	// 700. Kill at 1000: the gap is 990 → 1600. No success after a kill
	// at 3000: nothing to measure.
	successes := at(10, 50, 90, 105, 700, 710, 990, 1600, 1610, 2000)
	got := failoverGaps(successes, at(100, 1000, 3000))
	assert.Equal(t, []float64{595, 610}, got, "the longest gap after each kill, not the first success")
}

func TestOutput(t *testing.T) {
	dir := t.TempDir()
	r := &report{Machine: "m", Steps: []stepResult{
		{System: "moonraft", Workload: "put", Clients: 1, OpsPerSec: 100, P99Ms: 2},
		{System: "moonraft", Workload: "put", Clients: 8, OpsPerSec: 700, P99Ms: 4, Errors: 1, FirstError: "NO_AVAILABLE_HANDLE: x"},
	}, Failovers: []failoverResult{{System: "moonraft", GapsMs: []float64{500, 700}, P50Ms: 700, MaxMs: 700, Clients: 8, Acked: 900, Lost: 0},
		{System: "raw-etcd-watch-async", GapsMs: []float64{300}, P50Ms: 300, MaxMs: 300, Clients: 8, Acked: 800, Lost: 17}}}
	var out bytes.Buffer
	cfg := config{jsonOut: filepath.Join(dir, "r.json"), plotOut: filepath.Join(dir, "p.svg")}
	require.NoError(t, r.output(&out, cfg))
	assert.Contains(t, out.String(), "first: NO_AVAILABLE_HANDLE")
	assert.Regexp(t, `raw-etcd-watch-async +1 +300 +300 +800 +17`, out.String())
	svg, err := os.ReadFile(cfg.plotOut)
	require.NoError(t, err)
	assert.True(t, strings.Contains(string(svg), "<svg"), "an SVG file")
	js, err := os.ReadFile(cfg.jsonOut)
	require.NoError(t, err)
	assert.Contains(t, string(js), `"ops_per_sec": 700`)
}

// TestDepartureReport: the departure's report says what the collector did
// on each node, and on how many Go's GC CPU limiter engaged; when the
// probe's writes failed, and how many log writes were slow meanwhile.
func TestDepartureReport(t *testing.T) {
	r := &departureResult{Clients: 5000, GC: []nodeGC{{ID: "n0", PerMin: 4}, {ID: "n1", PerMin: 66.3, Limited: true}},
		ProbeWrites: 900, ProbeFailed: 2, ProbeFirstError: "OUTCOME_UNKNOWN: lost", ProbeFailedAt: []float64{41.25, 60}, SlowLogWrites: 7,
		BacklogMax: 125_000, WaitingMax: 3}
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "collections a minute meanwhile: n0 4.0 n1 66.3; Go's GC CPU limiter engaged on 1 of 2 nodes")
	assert.Contains(t, out.String(), "900, 2 failed")
	assert.Contains(t, out.String(), "; 7 Raft log writes over 64 ms on the nodes")
	assert.Contains(t, out.String(), "the failed ones began at (s): 41.2 60.0\n")
	assert.Contains(t, out.String(), "export backlog at most 125000 entries, at most 3 writes waiting")
}

// TestBaselineSweep runs both baselines for real (an etcd, a primary and
// two standbys each, all up at once) through a short put step, taking turns
// for two rounds: the workload runs, each system's etcd (its counters read
// from its own process) is written once per operation (sync) or in batches
// (async), and the standbys follow.
func TestBaselineSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := testConfig(t)
	cfg.repeat = 2
	txns := map[string][2]float64{ // etcd transactions per 1,000 ops
		baselineSync:  {850, 1150},
		baselineAsync: {1, 700},
	}
	var systems []system
	for _, mode := range []string{baselineSync, baselineAsync} {
		b, err := openBaseline(ctx, cfg, mode)
		require.NoError(t, err)
		defer b.close()
		systems = append(systems, b)
	}
	rep := &report{}
	require.NoError(t, sweep(ctx, cfg, systems, rep))
	var order []string
	for _, s := range rep.Steps {
		order = append(order, fmt.Sprintf("%s/%d", s.System, s.Round))
		assert.Positive(t, s.Ops)
		assert.Zero(t, s.Errors, s.FirstError)
		assert.GreaterOrEqual(t, s.EtcdTxnsPer1kOps, txns[s.System][0], s.System)
		assert.LessOrEqual(t, s.EtcdTxnsPer1kOps, txns[s.System][1], s.System)
	}
	assert.Equal(t, []string{baselineSync + "/1", baselineAsync + "/1", baselineSync + "/2", baselineAsync + "/2"}, order, "the systems take turns")
	for _, sys := range systems {
		require.Eventually(t, func() bool {
			leader, standbys, err := sys.positions(ctx)
			return err == nil && len(standbys) == 2 && standbys[0] == leader && standbys[1] == leader
		}, 10*time.Second, 10*time.Millisecond, "%s: standbys reach the primary's seq", sys.name())
	}
}

// TestBaselineFailover kills each baseline's primary under writers: the
// promoted standby takes the writes (one window measured, so writes
// succeeded after the kill) and every acknowledged write is checked on it.
func TestBaselineFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	for _, mode := range []string{baselineSync, baselineAsync} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res := &failoverResult{System: mode}
			require.NoError(t, baselineFailoverOnce(ctx, testConfig(t), mode, res))
			assert.Equal(t, 1, res.Kills)
			require.Len(t, res.GapsMs, 1, "writes resumed on the promoted standby")
			assert.Positive(t, res.GapsMs[0])
			assert.Greater(t, res.Acked, 50)
			assert.LessOrEqual(t, res.Lost, res.Acked)
			t.Logf("%s: window %.0f ms, %d of %d acknowledged writes lost", mode, res.GapsMs[0], res.Lost, res.Acked)
		})
	}
}

func testConfig(t *testing.T) config {
	self, err := os.Executable()
	require.NoError(t, err)
	return config{workloads: []string{"put"}, clients: []int{4}, duration: time.Second, warmup: 200 * time.Millisecond, batch: 8, keys: 10, repeat: 1, benchBin: self}
}

// A baseline's failovers run one per fresh baseline into one result: the
// kills add up.
func TestFailoverResultAccumulates(t *testing.T) {
	res := &failoverResult{System: baselineAsync}
	for range 2 {
		w := &writeLoad{stop: func() {}}
		require.NoError(t, w.finish(context.Background(), nil, []time.Time{time.Now()}, res))
	}
	assert.Equal(t, 2, res.Kills)
	assert.Equal(t, failoverClients, res.Clients)
}

// stuckStandby is a system whose leader moves on while its standby stays
// where it started.
type stuckStandby struct {
	system
	leader atomic.Uint64
}

func (s *stuckStandby) positions(context.Context) (uint64, []uint64, error) {
	return s.leader.Add(1), []uint64{0}, nil
}

func TestLagOfAStandbyThatNeverCatchesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	lag := sampleLag(ctx, &stuckStandby{})
	require.Positive(t, lag.n, "positions the standby never reached are samples too")
	assert.GreaterOrEqual(t, lag.p99, 200*time.Millisecond, "at least the age of the oldest unreached position")
}

var (
	buildOnce sync.Once
	builtDir  string
	builtBin  string
	buildErr  error
)

// moonraftWithFailpoints builds the moonraft binary with failpoints once
// for the tests that start a cluster.
func moonraftWithFailpoints(t *testing.T) string {
	buildOnce.Do(func() {
		if builtDir, buildErr = os.MkdirTemp("", "moonbench-test-"); buildErr != nil {
			return
		}
		var bins map[string]string
		bins, buildErr = localcluster.Build(builtDir, []string{"failpoints"}, false, map[string]string{"moonraft": "./cmd/node"})
		builtBin = bins["moonraft"]
	})
	require.NoError(t, buildErr)
	return builtBin
}

// localForTest starts a moonraft cluster for a test (skipped with -short)
// and returns its context, config and cluster, torn down at the test's end.
func localForTest(t *testing.T, v variant, nodeFlags ...string) (context.Context, config, *localCluster) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and starts a moonraft cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cfg := testConfig(t)
	cfg.local = true
	cfg.moonraftBin = moonraftWithFailpoints(t)
	cfg.nodeFlags = nodeFlags
	lc, err := startLocal(ctx, cfg, v)
	require.NoError(t, err)
	t.Cleanup(lc.close)
	return ctx, cfg, lc
}

// TestSlowLogWrites: with --local, a step counts the Raft log writes over
// 64 ms on moonraft's nodes, the evidence that a standby-lag spike was the
// disk. One node, built with failpoints, takes 100 ms for every log write.
func TestSlowLogWrites(t *testing.T) {
	ctx, cfg, lc := localForTest(t, variant{})
	before, err := lc.slowLogWrites(ctx)
	require.NoError(t, err)
	// node/failpoint_on.go's failpointSlowLog.
	require.NoError(t, os.WriteFile(filepath.Join(lc.dir, "n1", "failpoint-slow-log"), []byte("100ms"), 0o644))
	rep := &report{}
	require.NoError(t, sweep(ctx, cfg, []system{lc}, rep))
	require.Len(t, rep.Steps, 1)
	s := rep.Steps[0]
	assert.Zero(t, s.Errors, s.FirstError)
	assert.Positive(t, s.SlowLogWrites, "n1's slow writes in the step")
	after, err := lc.slowLogWrites(ctx)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, after-before, s.SlowLogWrites)

	var text bytes.Buffer
	require.NoError(t, rep.output(&text, config{}))
	assert.Regexp(t, `moonraft put clients=4: standby lag p99 [0-9.]+ ms, [0-9]+ Raft log writes over 64 ms`, text.String())
}

// TestScaleReport: a size's report says how many elections its load
// brought before the failover, which it causes itself, how often each
// node's goroutines stalled and its host's wall clock stepped, and how
// many reads found the lease lapsed.
func TestScaleReport(t *testing.T) {
	r := &scaleResult{Objects: 6_000_000, Clients: 10_000, Pings: "mooncake", FillSecs: 413, Elections: 1, FillClientsCPU: 0.61,
		LeaseReads: 4_000_000, QuorumReads: 1_234, PingsAnswered: 5_000_000, PingsSlow: 4_321, Nodes: []scaleNode{{ID: "n0", Role: "leader", RSSBytes: 3.7e9, SchedStalls: 3, ClockSteps: 1}}}
	var out bytes.Buffer
	r.print(&out)
	assert.Contains(t, out.String(), "(filled in 413 s, 0 failed calls, the clients' process using 0.61 cores; elections from the fill to the snapshots: 1)")
	assert.Contains(t, out.String(), "n0   leader")
	assert.Regexp(t, `save s +stalls +clock steps\n.*n0 +leader .* 3 +1\n`, out.String())
	assert.Contains(t, out.String(), "reads: 4000000 under the read lease, 1234 after waiting for a quorum round; Mooncake pings answered 5000000, over 1s 4321")
	assert.Contains(t, out.String(), "0 sessions lost, 0 remounts;")

	r.Remounts, r.RemountsByPhase = 130, []phaseCount{{"fill", 128}, {"idle and snapshots", 0}, {"failovers and restarts", 2}}
	r.FailoverMs, r.FailoverMaxMs, r.Kills = 500, 1070, []killResult{{FailoverMs: 1070,
		Followers:   []followerTrace{{ID: "n0", LogAppends: 12, SlowestAppendMs: 512, LastContactMs: 480}},
		Host:        hostWindow{Ms: 600, SystemMs: 700, KsoftirqdWaitMs: 410, SoftirqMs: 90, StealMs: 3, Squeezed: 7},
		RestartSecs: 9.7, Restore: restoreTime{5.76, 0.8}, ListenOverflows: 37}, {FailoverMs: 500, ListenOverflows: -1}}
	r.JoinRestore = restoreTime{4.04, 0.83}
	out.Reset()
	r.print(&out)
	assert.Contains(t, out.String(), "failover 500 ms to the next answered write (0 ms to a promoted leader), the median of 2 kills, the slowest 1070 ms")
	assert.Contains(t, out.String(), "130 remounts (128 during the fill, 2 during the failovers and restarts);")
	assert.Regexp(t, `kill 1: the next write answered at 1070 ms.*\n    n0 last heard from the leader at 480 ms; .* 12 log writes, the slowest within 512 ms`, out.String())
	assert.Contains(t, out.String(), "the old leader caught up 9.7 s after its restart (its snapshot restored in 5.8 s, using 0.80 s of CPU)")
	assert.Contains(t, out.String(), "the joining node: its snapshot restored in 4.0 s, using 0.83 s of CPU")
	assert.Contains(t, out.String(), "kill 2: the next write answered at 500 ms, a promoted leader seen at 0 ms; the old leader caught up 0.0 s after its restart (no snapshot restored); the host's listen queue overflows unread")
	assert.Contains(t, out.String(), "(its snapshot restored in 5.8 s, using 0.80 s of CPU); 37 connections turned away by a full listen queue from the kill to the count of sessions")
	assert.Contains(t, out.String(), "host from the kill to the promotion (600 ms): the kernel took 700 ms of CPU, softirqs 90 ms, the hypervisor 3 ms; ksoftirqd waited 410 ms for a CPU; 7 softirqs out of budget")
}

// TestFollowerAtKill: a follower's samples around a kill tell how far its
// commit index and its log moved after the kill and when they last moved,
// when its applied index last moved, and when it last heard from the
// leader; the new leader's term does not count.
func TestFollowerAtKill(t *testing.T) {
	kill := time.Unix(1000, 0)
	at := func(ms int) time.Time { return kill.Add(time.Duration(ms) * time.Millisecond) }
	// sample is a follower's progress at ms after the kill, having last
	// heard from its leader at contact ms (candidate: not a follower).
	const candidate = math.MinInt
	sample := func(ms int, term, commit, applied, last uint64, contact int) logSample {
		x := logSample{at: at(ms), term: term, commit: commit, applied: applied, lastIndex: last}
		if contact != candidate {
			x.contact = at(contact)
		}
		return x
	}
	for _, tc := range []struct {
		name    string
		samples []logSample
		want    followerTrace
	}{
		{"caught up at the kill", []logSample{
			sample(-20, 5, 100, 100, 100, -25), sample(20, 5, 100, 100, 100, -10), sample(400, 6, 101, 101, 101, 390),
		}, followerTrace{ID: "n1", LastContactMs: -10}},
		{"still handling the leader's entries after it", []logSample{
			sample(-40, 5, 90, 60, 100, -45), sample(-20, 5, 100, 70, 110, -25), sample(20, 5, 160, 80, 170, 15),
			sample(300, 5, 190, 150, 200, 290), sample(320, 5, 190, 190, 200, 290), sample(700, 6, 195, 195, 205, 690),
		}, followerTrace{ID: "n1", UnappliedAtKill: 30, CommittedAfter: 90, LastCommitMs: 300, AppliedMs: 320,
			AppendedAfter: 90, LastAppendMs: 300, LastContactMs: 290}},
		{"heard late, standing after", []logSample{
			sample(-20, 5, 100, 100, 100, -25), sample(480, 5, 100, 100, 100, 470),
			sample(900, 5, 100, 100, 100, candidate), sample(950, 6, 101, 101, 101, 940),
		}, followerTrace{ID: "n1", LastContactMs: 470}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, followerAtKill("n1", kill, tc.samples))
		})
	}
}

// TestAddHealth: the log writes and stalls between two readings of a
// follower's metrics, and the bucket the slowest write fell in.
func TestAddHealth(t *testing.T) {
	hist := func(counts ...uint64) *dto.Histogram {
		h := &dto.Histogram{SampleCount: proto.Uint64(counts[len(counts)-1])}
		for i, c := range counts[:len(counts)-1] {
			h.Bucket = append(h.Bucket, &dto.Bucket{UpperBound: proto.Float64(0.016 * float64(int(1)<<i)), CumulativeCount: proto.Uint64(c)})
		}
		return h
	}
	for _, tc := range []struct {
		name          string
		before, after health
		want          followerTrace
	}{
		{"all fast", health{hist(10, 10, 10, 10), 2}, health{hist(15, 15, 15, 15), 2},
			followerTrace{LogAppends: 5, SlowestAppendMs: 16}},
		{"one slow", health{hist(10, 10, 10, 10), 2}, health{hist(14, 14, 15, 15), 3},
			followerTrace{LogAppends: 5, SlowestAppendMs: 64, Stalls: 1}},
		{"past every bucket", health{hist(10, 10, 10, 10), 0}, health{hist(14, 14, 14, 15), 0},
			followerTrace{LogAppends: 5, SlowestAppendMs: math.Inf(1)}},
		{"not read", health{}, health{hist(1, 1), 0}, followerTrace{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f followerTrace
			f.addHealth(tc.before, tc.after)
			assert.Equal(t, tc.want, f)
		})
	}
}

// TestHostBetween: the host's counters over a span run from the last
// sample at or before its start to the first at or after its end.
func TestHostBetween(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	samples := []hostSample{
		{at: at(0), system: time.Second, ksoftirqdWait: time.Second, softirq: 2 * time.Second, steal: 0, squeezed: 10},
		{at: at(20), system: time.Second, ksoftirqdWait: time.Second + 5*time.Millisecond, softirq: 2*time.Second + 10*time.Millisecond, squeezed: 11},
		{at: at(500), system: 1600 * time.Millisecond, ksoftirqdWait: 1400 * time.Millisecond, softirq: 2100 * time.Millisecond, steal: 30 * time.Millisecond, squeezed: 15},
		{at: at(520), system: 1610 * time.Millisecond, ksoftirqdWait: 1500 * time.Millisecond, softirq: 2200 * time.Millisecond, steal: 40 * time.Millisecond, squeezed: 20},
	}
	assert.Equal(t, hostWindow{Ms: 480, SystemMs: 600, KsoftirqdWaitMs: 395, SoftirqMs: 90, StealMs: 30, Squeezed: 4}, hostBetween(samples, at(30), at(490)),
		"from the sample before the start to the one after the end")
	assert.Equal(t, hostWindow{Ms: 20, SystemMs: 10, KsoftirqdWaitMs: 100, SoftirqMs: 100, StealMs: 10, Squeezed: 5}, hostBetween(samples, at(500), at(520)))
	assert.Zero(t, hostBetween(samples, at(-10), at(400)), "no sample before the start")
	assert.Zero(t, hostBetween(samples, at(100), at(600)), "none after the end")
}

// TestReadHost reads this host's counters: on Linux, the ksoftirqd
// threads' waits and the softirq time only grow.
func TestReadHost(t *testing.T) {
	stop := traceHost(context.Background())
	time.Sleep(5 * traceEvery)
	stopped := time.Now()
	samples := stop()
	require.GreaterOrEqual(t, len(samples), 2, "sampled every %v", traceEvery)
	assert.False(t, samples[len(samples)-1].at.Before(stopped), "a last sample when stopped, so a span may end then")
	first, last := samples[0], samples[len(samples)-1]
	assert.Positive(t, last.softirq, "softirq time since boot")
	assert.Positive(t, last.system, "kernel time since boot")
	assert.GreaterOrEqual(t, last.ksoftirqdWait, first.ksoftirqdWait)
	assert.GreaterOrEqual(t, last.squeezed, first.squeezed)
	_, err := readHost([]string{"/proc/nonexistent/schedstat"})
	assert.Error(t, err, "a ksoftirqd thread that is gone")
}

// TestListenOverflows: a listener whose queue is full turns connections
// away, and the host's count of them grows.
func TestListenOverflows(t *testing.T) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer syscall.Close(fd)
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 1)) // never accepted from
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)

	before, err := listenOverflows()
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond); err == nil {
				defer c.Close()
			}
		})
	}
	wg.Wait()
	after, err := listenOverflows()
	require.NoError(t, err)
	assert.Greater(t, after, before, "8 connections to a queue of 2")
}

// TestFirstPromoted: the promotion is the first sample after the kill in
// which any follower serves as leader; the leader's poll when the trace saw
// none.
func TestFirstPromoted(t *testing.T) {
	kill := time.Unix(1000, 0)
	at := func(ms int) time.Time { return kill.Add(time.Duration(ms) * time.Millisecond) }
	polled := at(900)
	samples := map[string][]logSample{
		"n1": {{at: at(-20), promoted: true}, {at: at(300)}, {at: at(480), promoted: true}},
		"n2": {{at: at(310)}, {at: at(450), promoted: true}},
	}
	assert.Equal(t, at(450), firstPromoted(kill, samples, polled), "the old leader's sample before the kill does not count")
	assert.Equal(t, polled, firstPromoted(kill, map[string][]logSample{"n1": {{at: at(300)}}}, polled))
}

// TestCallsAround: the probe's writes around a kill run from the one in
// flight at the kill to the first sent after it that was answered.
func TestCallsAround(t *testing.T) {
	kill := time.Unix(1000, 0)
	at := func(ms int) time.Time { return kill.Add(time.Duration(ms) * time.Millisecond) }
	lost := errors.New("outcome unknown")
	p := &probe{obs: []probeObs{
		{at(-50), 40 * time.Millisecond, nil},  // ended before the kill
		{at(-5), 600 * time.Millisecond, lost}, // in flight at the kill
		{at(605), 10 * time.Millisecond, lost}, // refused
		{at(625), 100 * time.Millisecond, nil}, // the next answered
		{at(730), 10 * time.Millisecond, nil},  // after it
	}}
	assert.Equal(t, []probeCall{{SentMs: -5, EndedMs: 595, Error: "outcome unknown"}, {SentMs: 605, EndedMs: 615, Error: "outcome unknown"},
		{SentMs: 625, EndedMs: 725}}, p.callsAround(kill))
}

// TestScaleKey: the fill's keys are distinct, 16 bytes, and made in no
// order near the keys': neighbours in key order were made far apart.
func TestScaleKey(t *testing.T) {
	const n = 1 << 18
	made := make(map[string]int, n)
	for i := 0; i < n; i++ {
		k := scaleKey(uint64(i))
		require.Len(t, k, 16)
		_, dup := made[k]
		require.False(t, dup, "key %q made twice", k)
		made[k] = i
	}
	keys := slices.Sorted(maps.Keys(made))
	gaps := make([]int, 0, n-1)
	for j := 1; j < n; j++ {
		gaps = append(gaps, max(made[keys[j]]-made[keys[j-1]], made[keys[j-1]]-made[keys[j]]))
	}
	slices.Sort(gaps)
	require.Greater(t, gaps[len(gaps)/2], n/100, "median distance in making between neighbours in key order")
}

// TestMachineNamesPageTouch: the machine line says what a page's first
// touch costs, which a restore's time depends on.
func TestMachineNamesPageTouch(t *testing.T) {
	d, err := pageTouch()
	require.NoError(t, err)
	assert.Positive(t, d)
	assert.Less(t, d, time.Millisecond, "per 4 KiB page")
	assert.Regexp(t, `^\d+ cores, .*, a page's first touch \d+\.\d µs$`, machine())
}

// TestProbeLine: a put pair crosses from the probe process intact, an
// error with a newline and quotes included; a damaged line is an error.
func TestProbeLine(t *testing.T) {
	at := time.Unix(1000, 123456789)
	for _, o := range []probeObs{
		{at, 40 * time.Millisecond, nil},
		{at, time.Second, errors.New("OUTCOME_UNKNOWN: \"lost\"\nagain")},
	} {
		got, err := parseProbeLine(probeLine(o))
		require.NoError(t, err)
		assert.True(t, o.at.Equal(got.at))
		assert.Equal(t, o.lat, got.lat)
		assert.Equal(t, o.err, got.err)
	}
	for _, bad := range []string{"", "ready", "1 2", "x 2 \"\"", "1 y \"\"", "1 2 unquoted"} {
		_, err := parseProbeLine(bad)
		assert.Error(t, err, bad)
	}
}

// TestProbeProcess: the probe writes from a process of its own, and its
// put pairs reach the harness, across a leader kill to the first answered
// after it; finishing it ends the process.
func TestProbeProcess(t *testing.T) {
	ctx, cfg, lc := localForTest(t, variant{})
	const owner = "probe-owner"
	_, err := mountFor(ctx, lc.cl, owner)
	require.NoError(t, err)
	s := &scaleRun{cfg: cfg, lc: lc, clients: []*scaleClient{{id: owner}}}

	pr, err := s.startProbe(ctx, "test")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return pr.written() >= 10 }, time.Minute, 10*time.Millisecond)
	l, err := lc.leader(ctx)
	require.NoError(t, err)
	kill := time.Now()
	l.Kill()
	require.Eventually(t, func() bool { return pr.firstAnsweredAfter(kill) > 0 }, time.Minute, 10*time.Millisecond)
	calls := pr.callsAround(kill)
	require.NotEmpty(t, calls)
	assert.Empty(t, calls[len(calls)-1].Error, "the last is the first answered after the kill")

	obs := pr.finish()
	assert.EqualValues(t, pr.written(), s.filled.Load(), "every answered pair counted as filled")
	assert.GreaterOrEqual(t, len(obs), 11)
	for _, o := range obs {
		assert.Positive(t, o.lat)
		assert.False(t, o.at.Before(kill.Add(-time.Minute)))
	}
}

func TestRemountLine(t *testing.T) {
	r := mckeeper.Remount{At: time.Unix(1000, 123456789), Silence: 12 * time.Second, SinceOK: 2 * time.Second, Took: 1500 * time.Millisecond, Failed: 3,
		LastDial: mckeeper.Dial{At: time.Unix(990, 5), Addr: "127.0.0.1:1", LookUp: 9 * time.Second, Dial: 7 * time.Second, Err: "refused \"x\" y"}, LastErr: "Ping to 127.0.0.1:1: \"deadline\"\nexceeded"}
	line, err := remountLine(42, r)
	require.NoError(t, err)
	i, got, err := parseRemountLine(line)
	require.NoError(t, err)
	assert.Equal(t, 42, i)
	assert.True(t, r.At.Equal(got.At))
	assert.True(t, r.LastDial.At.Equal(got.LastDial.At))
	r.At, r.LastDial.At = got.At, got.LastDial.At
	assert.Equal(t, r, got)
	for _, bad := range []string{"", "remount", "remount 1", "count 1 {}", "remount x {}", "remount 1 {", "remount 1 [1]"} {
		_, _, err := parseRemountLine(bad)
		assert.Error(t, err, bad)
	}
}

// TestClientsProcess: the scale harness's clients mount and ping from a
// process of their own. Paused for two session TTLs, as a host that
// stalls, each is told to remount when it pings again, and the harness
// hears of each remount with the silence before it; clients stopped on
// the harness's command have their sessions expired, the others not.
func TestClientsProcess(t *testing.T) {
	const ttl = 3 * time.Second
	ctx, cfg, lc := localForTest(t, variant{mooncake: true}, "--client-ttl", ttl.String())
	cfg.scaleClients, cfg.scalePings = 8, scalePingsMooncake
	s := &scaleRun{cfg: cfg, lc: lc, http: &http.Client{Timeout: 10 * time.Second}}
	sessions := func() uint64 {
		_, st, err := s.leaderStatus(ctx)
		require.NoError(t, err)
		return st.Sessions
	}
	keepers, err := s.startClients(ctx, 1<<20)
	require.NoError(t, err)
	defer keepers.close()
	assert.EqualValues(t, 8, sessions())
	n, cpu, err := keepers.count(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Positive(t, cpu, "the process's CPU")
	load, err := s.loadCounters(ctx)
	require.NoError(t, err)
	assert.Positive(t, slices.Max(load.pings), "the nodes time the Mooncake pings they answer")

	paused := time.Now()
	require.NoError(t, keepers.cmd.Process.Signal(syscall.SIGSTOP))
	time.Sleep(2 * ttl)
	require.NoError(t, keepers.cmd.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool {
		n, _, err := keepers.count(ctx)
		require.NoError(t, err)
		return n == 8
	}, time.Minute, 100*time.Millisecond)
	rs := keepers.remountsSince(paused)
	require.Len(t, rs, 8)
	for _, r := range rs {
		assert.GreaterOrEqual(t, r.Silence, 2*ttl, "client %d", r.client)
		assert.Less(t, r.Silence, 4*ttl, "client %d", r.client)
		assert.LessOrEqual(t, r.Failed, 1, "client %d: a ping sent before the pause may time out after it", r.client)
		assert.Less(t, r.Took, ttl, "client %d: the ping after the pause is answered at once", r.client)
	}
	assert.EqualValues(t, 8, sessions())

	require.NoError(t, keepers.stop(ctx, 4, 8))
	require.Eventually(t, func() bool { return sessions() == 4 }, 4*ttl, 100*time.Millisecond, "the stopped clients' sessions expire")
	time.Sleep(ttl)
	assert.EqualValues(t, 4, sessions(), "the others' sessions live")
	keepers.close()
	assert.NoError(t, keepers.wait, "the process ends on its stdin's end")
}

// TestRemountCauses: the remounts' summary tells a master that forgot
// pinging clients (a silence under the TTL) from pings that stopped
// reaching it, and says how they failed, the commonest error first.
func TestRemountCauses(t *testing.T) {
	assert.Nil(t, remountCauses(nil))
	undialled := remountCauses([]remountEvent{{1, mckeeper.Remount{At: time.Now(), Silence: time.Second}}})
	assert.NotContains(t, undialled.text(), "last connection", "no connection to tell of")
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	c := remountCauses([]remountEvent{
		{1, mckeeper.Remount{At: at, Silence: 12 * time.Second, SinceOK: 12 * time.Second, Took: 100 * time.Millisecond, Failed: 10, LastErr: "deadline exceeded",
			LastDial: mckeeper.Dial{At: at.Add(-3 * time.Second), LookUp: 8 * time.Second, Dial: time.Second}}},
		{2, mckeeper.Remount{At: at, Silence: 2 * time.Second, SinceOK: 2 * time.Second, Took: 9 * time.Second,
			LastDial: mckeeper.Dial{At: at.Add(-time.Minute), Addr: "127.0.0.1:1", Dial: 7 * time.Second, Err: "refused"}}},
		{3, mckeeper.Remount{At: at, Silence: 11 * time.Second, SinceOK: 1500 * time.Millisecond, Took: 200 * time.Millisecond, Failed: 9, LastErr: "deadline exceeded"}},
	})
	require.NotNil(t, c)
	assert.Equal(t, 11.0, c.SilenceMedianSecs)
	assert.Equal(t, 12.0, c.SilenceMaxSecs)
	assert.Equal(t, 1, c.UnderTTL)
	assert.Equal(t, 9.0, c.FailedMedian)
	assert.Equal(t, []errorCount{{"deadline exceeded", 2}, {"", 1}}, c.LastErrors)
	assert.Equal(t, remountRec{Client: 2, At: "2026-11-30T12:00:00.000Z", SilenceSecs: 2, SinceOKSecs: 2, TookSecs: 9,
		DialAgoSecs: 60, DialSecs: 7, DialErr: "refused", DialAddr: "127.0.0.1:1"}, c.Remounts[1])
	assert.Zero(t, c.Remounts[2].DialSecs, "a client that never dialled")
	assert.Equal(t, `the client's longest silence in the 30 s before (from sending a ping answered OK to the next answer OK or NEED_REMOUNT) 11.0 s (median; at most 12.0 s), 1 of 3 under the 10 s TTL; from the last ping answered OK 2.0 s (median); the NEED_REMOUNT ping answered in 0.2 s (median; at most 9.0 s); 9 pings failed since the last OK (median); the last failed one's error: 2 "deadline exceeded", 1 "none"; the client's last connection, 31.5 s before (median): the master looked up in 4.0 s, dialled in 4.0 s (medians; at most 8.0 and 7.0 s)`, c.text())
}

// TestCumulativeAt: the observations surely within a bound are those of
// the largest bucket at or under it.
func TestCumulativeAt(t *testing.T) {
	h := &dto.Histogram{SampleCount: proto.Uint64(10), Bucket: []*dto.Bucket{
		{UpperBound: proto.Float64(0.512), CumulativeCount: proto.Uint64(6)},
		{UpperBound: proto.Float64(1.024), CumulativeCount: proto.Uint64(8)},
		{UpperBound: proto.Float64(2.048), CumulativeCount: proto.Uint64(9)},
	}}
	for _, c := range []struct{ le, want float64 }{{0.1, 0}, {0.512, 6}, {1, 6}, {1.024, 8}, {5, 9}} {
		assert.Equal(t, c.want, cumulativeAt(h, c.le), "le %v", c.le)
	}
	assert.Zero(t, cumulativeAt(nil, 1), "no histogram")
}
