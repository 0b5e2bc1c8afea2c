package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/internal/localcluster"
	"github.com/moonraft/moonraft/mckeeper"
	mc "github.com/moonraft/moonraft/mooncakeapi"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	dto "github.com/prometheus/client_model/go"
)

// moonbench --local --scale: one cluster at the default flags, exporting
// to etcd, with --scale-clients clients each mounting a segment and
// pinging as Mooncake's clients do (every second), filled in turn to each
// size of --scale with 4 KiB objects; at each size it measures what
// production size costs (issue 41): memory per object, a snapshot and the
// writes around it, the idle clients' Raft log and etcd traffic, a
// failover, a restart and a fresh node's join.

const (
	scaleWriters   = 8   // fill writers
	churnWriters   = 2   // a steady write load, well below the cluster's rate
	scaleBatch     = 128 // objects per BatchPutStart/BatchPutEnd
	scaleObject    = 4096
	scaleIdle      = 30 * time.Second // the idle clients' window
	scaleSnapWait  = 10 * time.Minute // for every node to snapshot the filled state
	scaleSampleGap = 5 * time.Second
)

// The clients' protocols (--scale-pings).
const (
	scalePingsMooncake = "mooncake"
	scalePingsGRPC     = "grpc"
)

type scaleClient struct {
	id   string  // moonraft's: a Mooncake client's is its UUID's String
	uuid mc.UUID // a Mooncake client's
}

type scaleRun struct {
	cfg     config
	lc      *localCluster
	http    *http.Client
	clients []*scaleClient
	// keepers is the clients' process: their mounts and pings. With
	// --scale-pings grpc they share one connection with the client's
	// default backoff: at a 100 ms cap, 10,000 keepers retrying through an
	// election could send the surviving nodes up to 100,000 calls a
	// second, where a Mooncake client only pings again a second later.
	keepers *clientsProc
	// views finds the leader for the Mooncake clients, at master_view in
	// etcd, as Mooncake's HA clients do.
	views  *etcdbridge.Store
	start  time.Time
	filled atomic.Uint64 // objects written: the fill's and the probes'
	seq    atomic.Uint64 // keys the fill has tried: a failed batch's are not reused
	rep    *scaleReport
}

func runScale(ctx context.Context, cfg config, args string) error {
	lc, err := startLocal(ctx, cfg, variant{mooncake: cfg.scalePings == scalePingsMooncake})
	if err != nil {
		return err
	}
	defer lc.close()
	s := &scaleRun{cfg: cfg, lc: lc, http: &http.Client{Timeout: 10 * time.Second}, start: time.Now(),
		rep: &scaleReport{Machine: machine(), Date: time.Now().UTC().Format(time.RFC3339), Args: args}}
	fmt.Printf("moonbench %s\nmachine: %s\ndate: %s\n", s.rep.Args, s.rep.Machine, s.rep.Date)
	// The nodes' default etcd prefix and cluster id, as the Config's.
	if s.views, err = etcdbridge.Dial(etcdbridge.Config{Endpoints: lc.etcdP.endpoints()}); err != nil {
		return err
	}
	defer s.views.Close()
	if err := s.mount(ctx); err != nil {
		return err
	}
	defer s.keepers.close()
	for _, n := range cfg.scale {
		r, err := s.size(ctx, uint64(n))
		if err != nil {
			return err
		}
		s.rep.Sizes = append(s.rep.Sizes, *r)
		r.print(os.Stdout)
	}
	if s.rep.Departure, err = s.departure(ctx); err != nil {
		return err
	}
	s.rep.Departure.print(os.Stdout)
	if cfg.jsonOut != "" {
		b, err := json.MarshalIndent(s.rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	if cfg.plotOut != "" {
		return s.rep.plot(cfg.plotOut)
	}
	return nil
}

// mount gives every client a segment with room for twice its share of
// the largest size (so no size evicts), and starts its pings, spread over
// a second, in the clients' process.
func (s *scaleRun) mount(ctx context.Context) error {
	n := s.cfg.scaleClients
	share := (uint64(slices.Max(s.cfg.scale)) + uint64(n) - 1) / uint64(n)
	s.clients = make([]*scaleClient, n)
	for i := range s.clients {
		if s.cfg.scalePings == scalePingsGRPC {
			s.clients[i] = &scaleClient{id: scaleClientName(i)}
			continue
		}
		id := mooncakeClient(i)
		s.clients[i] = &scaleClient{id: id.String(), uuid: id}
	}
	var err error
	s.keepers, err = s.startClients(ctx, 2*share*scaleObject)
	return err
}

// size fills the cluster to n objects and measures it.
func (s *scaleRun) size(ctx context.Context, n uint64) (*scaleResult, error) {
	r := &scaleResult{Clients: len(s.clients), Pings: s.cfg.scalePings}
	started := time.Now()
	remounts, cpu0, err := s.keepers.count(ctx)
	if err != nil {
		return nil, err
	}
	// ended counts the remounts of the phase that has just ended.
	ended := func(phase string) error {
		now, _, err := s.keepers.count(ctx)
		if err != nil {
			return err
		}
		r.RemountsByPhase = append(r.RemountsByPhase, phaseCount{phase, now - remounts})
		r.Remounts += now - remounts
		remounts = now
		return nil
	}
	_, st0, err := s.leaderStatus(ctx)
	if err != nil {
		return nil, err
	}
	load0, err := s.loadCounters(ctx)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if r.FillFailures, err = s.fill(ctx, n); err != nil {
		return nil, err
	}
	r.FillSecs = time.Since(t0).Seconds()
	if _, cpu1, err := s.keepers.count(ctx); err == nil {
		r.FillClientsCPU = (cpu1 - cpu0).Seconds() / r.FillSecs
	}
	if err := s.drained(ctx); err != nil {
		return nil, err
	}
	if err := ended("fill"); err != nil {
		return nil, err
	}
	l, st, err := s.leaderStatus(ctx)
	if err != nil {
		return nil, err
	}
	r.Objects = st.Objects
	for _, p := range s.lc.procs {
		m, err := s.metrics(ctx, p)
		if err != nil {
			return nil, err
		}
		role := "follower"
		if p == l {
			role = "leader"
		}
		r.Nodes = append(r.Nodes, scaleNode{ID: p.ID, Role: role, RSSBytes: gauge(m, "process_resident_memory_bytes"),
			HeapBytes: gauge(m, "go_memstats_heap_inuse_bytes"), LiveBytes: gauge(m, "go_gc_heap_live_bytes")})
		if s.cfg.profileDir != "" {
			path := filepath.Join(s.cfg.profileDir, fmt.Sprintf("scale-%d-%s-%s.heap", n, p.ID, role))
			if err := savePprof(ctx, p, "heap", path); err != nil {
				return nil, err
			}
		}
	}
	progressDone("%d objects after %.0f s; leader RSS %.0f MB (%.0f B an object)", r.Objects, r.FillSecs, r.Nodes[indexOf(s.lc.procs, l)].RSSBytes/1e6, r.Nodes[indexOf(s.lc.procs, l)].RSSBytes/float64(r.Objects))
	if err := s.idle(ctx, l, r); err != nil {
		return nil, err
	}
	if err := s.snapshots(ctx, n, r); err != nil {
		return nil, err
	}
	if err := ended("idle and snapshots"); err != nil {
		return nil, err
	}
	_, st1, err := s.leaderStatus(ctx)
	if err != nil {
		return nil, err
	}
	r.Elections = st1.Term - st0.Term
	load1, err := s.loadCounters(ctx)
	if err != nil {
		return nil, err
	}
	for i := range r.Nodes {
		r.Nodes[i].SchedStalls = load1.stalls[i] - load0.stalls[i]
		r.Nodes[i].ClockSteps = load1.clockSteps[i] - load0.clockSteps[i]
		r.LeaseReads += load1.leaseReads[i] - load0.leaseReads[i]
		r.QuorumReads += load1.quorumReads[i] - load0.quorumReads[i]
		r.PingsAnswered += load1.pings[i] - load0.pings[i]
		r.PingsSlow += load1.slowPings[i] - load0.slowPings[i]
	}
	if err := s.failover(ctx, n, r); err != nil {
		return nil, err
	}
	if err := ended("failovers and restarts"); err != nil {
		return nil, err
	}
	if err := s.join(ctx, r); err != nil {
		return nil, err
	}
	if err := ended("join"); err != nil {
		return nil, err
	}
	r.RemountCauses = remountCauses(s.keepers.remountsSince(started))
	return r, nil
}

func indexOf(ps []*localcluster.Node, p *localcluster.Node) int { return slices.Index(ps, p) }

// fill writes 4 KiB objects in batches until the cluster holds n,
// sampling the nodes' memory and showing progress as it goes.
func (s *scaleRun) fill(ctx context.Context, n uint64) (failures int64, err error) {
	from := s.filled.Load()
	if from >= n {
		return 0, nil
	}
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	var failed atomic.Int64
	var wg sync.WaitGroup
	for i := range scaleWriters {
		w := s.newWriter(s.clients[i%len(s.clients)])
		wg.Go(func() {
			defer w.close()
			for fctx.Err() == nil && s.filled.Load() < n {
				first := s.seq.Add(scaleBatch) - scaleBatch
				keys := make([]string, scaleBatch)
				for i := range keys {
					keys[i] = scaleKey(first + uint64(i))
				}
				if ok, err := w.put(fctx, keys); err != nil {
					if failed.Add(1) <= 5 {
						progressf("a fill call failed: %v", err)
					}
					w.failed(fctx)
					time.Sleep(100 * time.Millisecond)
				} else {
					s.filled.Add(uint64(ok))
				}
			}
		})
	}
	t := time.NewTicker(scaleSampleGap)
	defer t.Stop()
	last, lastT := from, time.Now()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			return failed.Load(), ctx.Err()
		case <-t.C:
		}
		now, at := s.filled.Load(), time.Now()
		backlog, _ := s.lc.exportBacklog(ctx)
		sample := s.sample(ctx, now)
		progressf("filling to %d: %d objects, %.0f/s, export backlog %d, RSS %s", n, now,
			float64(now-last)/at.Sub(lastT).Seconds(), backlog, mbList(sample.RSS))
		last, lastT = now, at
	}
}

// leaderStatus finds the leader and its status (without digests).
func (s *scaleRun) leaderStatus(ctx context.Context) (*localcluster.Node, *moonraftpb.NodeStatus, error) {
	l, err := s.lc.leader(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := s.lc.cl.Progress(ctx, l.GRPCAddr)
	return l, st, err
}

func (s *scaleRun) sample(ctx context.Context, objects uint64) scaleSample {
	sm := scaleSample{T: time.Since(s.start).Seconds(), Objects: objects}
	for _, p := range s.lc.procs {
		m, _ := s.metrics(ctx, p)
		sm.RSS = append(sm.RSS, gauge(m, "process_resident_memory_bytes"))
		sm.Heap = append(sm.Heap, gauge(m, "go_memstats_heap_inuse_bytes"))
	}
	s.rep.Samples = append(s.rep.Samples, sm)
	return sm
}

func mbList(vs []float64) string {
	out := ""
	for i, v := range vs {
		if i > 0 {
			out += "/"
		}
		out += fmt.Sprintf("%.0f", v/1e6)
	}
	return out + " MB"
}

// drained waits until etcd has every OpLog entry.
func (s *scaleRun) drained(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		b, err := s.lc.exportBacklog(ctx)
		if err == nil && b == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the export backlog did not drain in 10 minutes (%d entries left, %v)", b, err)
		}
		progressLive("waiting for etcd to take the export backlog: %d entries", b)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (s *scaleRun) metrics(ctx context.Context, p *localcluster.Node) (map[string]*dto.MetricFamily, error) {
	return scrapeMetrics(ctx, s.http, "http://"+p.HTTPAddr)
}

// loadCounts are each node's counters a size reports from the fill to the
// snapshots: its stalls, the wall-clock steps it saw, the reads served
// under the read lease and after waiting for a quorum round, and the
// Mooncake clients' pings it answered, and of them those it took over the
// clients' interval between pings to answer.
type loadCounts struct {
	stalls, clockSteps, leaseReads, quorumReads, pings, slowPings []float64
}

func (s *scaleRun) loadCounters(ctx context.Context) (loadCounts, error) {
	n := len(s.lc.procs)
	c := loadCounts{make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)}
	for i, p := range s.lc.procs {
		m, err := s.metrics(ctx, p)
		if err != nil {
			return c, err
		}
		c.stalls[i] = labelled(m, "moonraft_stalls_total", "kind", "sched", (*dto.Metric).GetCounter).GetValue()
		if x := m["moonraft_wall_clock_steps_total"].GetMetric(); len(x) > 0 {
			c.clockSteps[i] = x[0].GetCounter().GetValue()
		}
		c.leaseReads[i] = labelled(m, "moonraft_reads_total", "path", "lease", (*dto.Metric).GetCounter).GetValue()
		c.quorumReads[i] = labelled(m, "moonraft_reads_total", "path", "quorum", (*dto.Metric).GetCounter).GetValue()
		pings := labelled(m, "moonraft_mooncake_call_duration_seconds", "function", "Ping", (*dto.Metric).GetHistogram)
		c.pings[i] = float64(pings.GetSampleCount())
		c.slowPings[i] = c.pings[i] - cumulativeAt(pings, mckeeper.PingEvery.Seconds())
	}
	return c, nil
}

// labelled is value of the metric name whose label is value, nil if none.
func labelled[T any](m map[string]*dto.MetricFamily, name, label, value string, of func(*dto.Metric) *T) *T {
	for _, x := range m[name].GetMetric() {
		for _, l := range x.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return of(x)
			}
		}
	}
	return nil
}

// cumulativeAt is the observations of h at or under the largest bucket
// bound at most le: those surely within le.
func cumulativeAt(h *dto.Histogram, le float64) float64 {
	n := uint64(0)
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() <= le {
			n = b.GetCumulativeCount()
		}
	}
	return float64(n)
}

// gauge is the value of a gauge or counter (summed over its labels), or a
// histogram's sum; 0 if m lacks it.
func gauge(m map[string]*dto.MetricFamily, name string) float64 {
	v := 0.0
	for _, x := range m[name].GetMetric() {
		v += x.GetGauge().GetValue() + x.GetCounter().GetValue() + x.GetHistogram().GetSampleSum()
	}
	return v
}

func histCount(m map[string]*dto.MetricFamily, name string) uint64 {
	var n uint64
	for _, x := range m[name].GetMetric() {
		n += x.GetHistogram().GetSampleCount()
	}
	return n
}

// idle measures what the clients' pings alone cost: the leader's Raft log
// and CPU, and etcd's writes, over scaleIdle with no other calls.
func (s *scaleRun) idle(ctx context.Context, l *localcluster.Node, r *scaleResult) error {
	progressf("idle: %d clients pinging for %s", len(s.clients), scaleIdle)
	m0, err := s.metrics(ctx, l)
	if err != nil {
		return err
	}
	e0 := s.lc.etcd(ctx)
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(scaleIdle):
	}
	m1, err := s.metrics(ctx, l)
	if err != nil {
		return err
	}
	e1 := s.lc.etcd(ctx)
	el := time.Since(t0).Seconds()
	rate := func(name string) float64 { return (gauge(m1, name) - gauge(m0, name)) / el }
	r.IdleLogBytesSec = rate("moonraft_raft_log_appended_bytes_total")
	r.IdleLogEntrySec = rate("moonraft_raft_log_appended_entries_total")
	r.IdleLeaderCPU = rate("process_cpu_seconds_total")
	r.IdleEtcdTxnsSec = (e1.txns - e0.txns) / el
	r.IdleEtcdBytesSec = (e1.bytes - e0.bytes) / el
	return nil
}

// snapshots churns — puts batches of objects and removes them, so the log
// grows and the state does not — until every node has written a
// snapshot of the filled state (its snapshot rule decides when: once the
// log since its last one is as large as that was), then reads each one's
// size and time, and compares the probe's writes that overlapped a
// snapshot with the others, under the same churn.
func (s *scaleRun) snapshots(ctx context.Context, n uint64, r *scaleResult) error {
	counts, sums := make([]uint64, len(s.lc.procs)), make([]float64, len(s.lc.procs))
	for i, p := range s.lc.procs {
		m, err := s.metrics(ctx, p)
		if err != nil {
			return err
		}
		counts[i], sums[i] = histCount(m, "moonraft_snapshot_write_seconds"), gauge(m, "moonraft_snapshot_write_seconds")
	}
	progressf("churning until every node has snapshotted the state (at most %s)", scaleSnapWait)
	stopChurn, churned := s.churn(ctx)
	defer stopChurn()
	pr, err := s.startProbe(ctx, "snap")
	if err != nil {
		return err
	}
	stopProfiles := s.profileWindows(ctx, fmt.Sprintf("scale-%d-snapshot", n))
	defer stopProfiles()
	deadline := time.Now().Add(scaleSnapWait)
	type window struct{ from, to time.Time }
	var windows []window
	// The writes the export's flow control made wait, over every node, at
	// each poll: a write slowed during a snapshot may have waited for etcd
	// rather than for the node.
	type pacedAt struct {
		at time.Time
		n  float64
	}
	var paced []pacedAt
	polls := 0
	for i := 0; i < len(s.lc.procs); {
		p := s.lc.procs[i]
		var m map[string]*dto.MetricFamily
		var err error
		var n float64
		for _, q := range s.lc.procs {
			qm, qerr := s.metrics(ctx, q)
			if q == p {
				m, err = qm, qerr
			}
			if qerr == nil {
				n += gauge(qm, "moonraft_writes_paced_total")
			}
		}
		paced = append(paced, pacedAt{time.Now(), n})
		if err == nil && histCount(m, "moonraft_snapshot_write_seconds") > counts[i] {
			taken := histCount(m, "moonraft_snapshot_write_seconds") - counts[i]
			secs := (gauge(m, "moonraft_snapshot_write_seconds") - sums[i]) / float64(taken)
			end := time.Unix(0, int64(gauge(m, "moonraft_snapshot_last_written_timestamp_seconds")*1e9))
			windows = append(windows, window{end.Add(-time.Duration(secs * float64(time.Second))), end})
			progressf("%s wrote a snapshot from %s to %s", p.ID, windows[len(windows)-1].from.Format(clockFormat), end.Format(clockFormat))
			r.Nodes[i].SnapshotBytes = gauge(m, "moonraft_snapshot_size_bytes")
			r.Nodes[i].SnapshotSecs = secs
			r.Nodes[i].SnapshotCPUSecs = gauge(m, "moonraft_snapshot_write_cpu_seconds")
			r.Nodes[i].SnapshotSyncSecs = gauge(m, "moonraft_snapshot_sync_seconds")
			i++
			continue
		}
		if time.Now().After(deadline) {
			pr.finish()
			return fmt.Errorf("%s wrote no snapshot in %s", p.ID, scaleSnapWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		if polls++; polls%10 == 0 {
			progressf("churning: %d objects put and removed; %d of %d nodes have snapshotted", churned.Load(), i, len(s.lc.procs))
		}
	}
	var in, out []float64
	for _, o := range pr.finish() {
		if o.err != nil {
			continue
		}
		ms := float64(o.lat.Microseconds()) / 1000
		if slices.ContainsFunc(windows, func(w window) bool { return o.at.Before(w.to) && o.at.Add(o.lat).After(w.from) }) {
			in = append(in, ms)
		} else {
			out = append(out, ms)
		}
	}
	r.WriteP99Ms, r.WriteP99SnapMs, r.WritesInSnap = percentile(out, 0.99), percentile(in, 0.99), len(in)
	var pacedIn, pacedOut, secsIn, secsOut float64
	for k := 1; k < len(paced); k++ {
		a, b := paced[k-1], paced[k]
		if slices.ContainsFunc(windows, func(w window) bool { return a.at.Before(w.to) && b.at.After(w.from) }) {
			pacedIn, secsIn = pacedIn+b.n-a.n, secsIn+b.at.Sub(a.at).Seconds()
		} else {
			pacedOut, secsOut = pacedOut+b.n-a.n, secsOut+b.at.Sub(a.at).Seconds()
		}
	}
	r.PacedSec, r.PacedSnapSec = pacedOut/max(secsOut, 1), pacedIn/max(secsIn, 1)
	return nil
}

// churn starts churnWriters writers that put a batch of objects and remove
// them again, until the returned stop is called; the counter is how many
// objects they have put and removed. Each writer reuses its keys: fresh
// ones would leave a tombstone each for an hour (fsm.Params.KeySeqRetainMs), and
// the state would grow with them.
func (s *scaleRun) churn(ctx context.Context) (stop func(), churned *atomic.Int64) {
	ctx, cancel := context.WithCancel(ctx)
	churned = &atomic.Int64{}
	var wg sync.WaitGroup
	for i := range churnWriters {
		w := s.newWriter(s.clients[i%len(s.clients)])
		wg.Go(func() {
			defer w.close()
			keys := make([]string, scaleBatch)
			for j := range keys {
				keys[j] = fmt.Sprintf("scale-churn/%d/%d", i, j)
			}
			for ctx.Err() == nil {
				if _, err := w.put(ctx, keys); err != nil {
					w.failed(ctx)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				if w.remove(ctx, keys) == nil {
					churned.Add(scaleBatch)
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }, churned
}

func percentile(vs []float64, q float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	slices.Sort(vs)
	return vs[min(len(vs)-1, int(q*float64(len(vs))))]
}

// scaleKey is the fill's i-th key, 16 bytes: "scale/" and 10 hex digits of
// a bijection of i, so keys come in hash order, as Mooncake's clients' keys
// (hashes of token blocks) do. Made in key order, the objects would lie in
// memory in the order the tree is walked, and the collector and the
// snapshot writer would look cheaper than users see.
func scaleKey(i uint64) string {
	v := i * 0x9e3779b97f4a7c15 & (1<<40 - 1)
	return fmt.Sprintf("scale/%010x", v^v>>20)
}
