package node

import (
	"net/http"
	"strings"
	"sync"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/fsm"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics. Every node has its own prometheus.Registry (so several nodes in
// one process, as in tests, do not collide), served on HTTPAddr /metrics.
// hashicorp/raft reports through the process-wide go-metrics global (it
// offers no per-instance sink), so one Prometheus sink is installed once per
// process and registered in every node's registry: with several nodes in a
// process, the raft metrics are their sum. docs/OPERATIONS.md lists every
// metric and the alerts to set.

const ns = "moonraft"

var (
	raftSinkOnce sync.Once
	raftSink     prometheus.Collector
)

// raftMetricsSink installs the go-metrics Prometheus sink as the global
// go-metrics sink (once per process) and returns it as a collector. Raft's
// metrics appear as moonraft_raft_*.
func raftMetricsSink() prometheus.Collector {
	raftSinkOnce.Do(func() {
		opts := gmprom.DefaultPrometheusOpts
		opts.Name = "moonraft_go_metrics_sink"
		opts.Registerer = prometheus.NewRegistry() // not the global registry: each node registers it
		sink, err := gmprom.NewPrometheusSinkFrom(opts)
		if err != nil {
			return
		}
		cfg := gometrics.DefaultConfig(ns)
		cfg.EnableHostname = false
		cfg.EnableHostnameLabel = false
		cfg.EnableRuntimeMetrics = false // the Go collector covers the runtime
		if _, err := gometrics.NewGlobal(cfg, sink); err != nil {
			return
		}
		raftSink = sink
	})
	return raftSink
}

type nodeMetrics struct {
	reg         *prometheus.Registry
	rpcObs      sync.Map // rpcKey -> rpcObservers: label lookups once per method and code
	leaseReads  prometheus.Counter
	quorumReads prometheus.Counter
	rpcs        *prometheus.CounterVec
	rpcDur      *prometheus.HistogramVec
	mooncakeObs sync.Map // function -> prometheus.Observer
	mooncakeDur *prometheus.HistogramVec
	tickDur     prometheus.Histogram
	etcdDur     *prometheus.HistogramVec
	etcdErrs    *prometheus.CounterVec
	// writesRefused counts client writes refused past --max-pending-writes,
	// through either front door (gRPC, Mooncake's protocol).
	writesRefused prometheus.Counter
	stalls        *prometheus.CounterVec
	clockSteps    prometheus.Counter
}

// Latency buckets from 0.25 ms to ~8 s: Raft round trips on a LAN are
// around a millisecond, a leader change costs seconds.
var latencyBuckets = prometheus.ExponentialBuckets(0.00025, 2, 16)

func newNodeMetrics(n *Node) *nodeMetrics {
	m := &nodeMetrics{
		reg: prometheus.NewRegistry(),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "rpc_requests_total",
			Help: "gRPC requests served, by method and answer code (a Mooncake error-code name, or GRPC_<code> for a call gRPC failed)."},
			[]string{"method", "code"}),
		rpcDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "rpc_duration_seconds",
			Help: "gRPC request latency on this node, by method.", Buckets: latencyBuckets}, []string{"method"}),
		mooncakeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "mooncake_call_duration_seconds",
			Help: "Mooncake-protocol calls' latency on this node, by function: the handler's time, a forward to the leader's included.", Buckets: latencyBuckets},
			[]string{"function"}),
		tickDur: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "tick_duration_seconds",
			Help: "Time for the leader to replicate and apply one Tick (renewals, pings, expiry, eviction).", Buckets: latencyBuckets}),
		etcdDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "etcd_txn_duration_seconds",
			Help:    "Latency of the leader's etcd calls, by operation (oplog_write, latest, renewals, master_view, snapshot_seq, cleanup).",
			Buckets: latencyBuckets}, []string{"op"}),
		etcdErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "etcd_errors_total",
			Help: "Failed etcd calls of the leader, by operation (fenced writes included)."}, []string{"op"}),
	}
	reads := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reads_total",
		Help: "Linearizable reads served by this leader, by how leadership was proven: under the read lease, or by a quorum round."},
		[]string{"path"})
	m.leaseReads, m.quorumReads = reads.WithLabelValues("lease"), reads.WithLabelValues("quorum")
	m.writesRefused = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "writes_refused_total",
		Help: "Client writes refused with TOO_MANY_REQUESTS because --max-pending-writes were already waiting for the log."})
	m.stalls = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "stalls_total",
		Help: "Stalls this node saw, by kind: sched (its goroutines waited over a quarter of the heartbeat timeout to run), leadership-lost (it lost a leadership it was not handing over), leader-silent (it stood for election after its leader went silent)."},
		[]string{"kind"})
	m.clockSteps = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "wall_clock_steps_total",
		Help: "Steps of this host's wall clock (100 ms or more beyond the monotonic clock) this node saw; a leader's clock leaves them out until its next term."})
	pending := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "pending_writes",
		Help: "Client writes sent to the log and not yet applied on this node (bounded by --max-pending-writes)."},
		func() float64 { return float64(n.pendingWrites.Load()) })
	m.reg.MustRegister(reads, m.rpcs, m.rpcDur, m.mooncakeDur, m.tickDur, m.etcdDur, m.etcdErrs, m.writesRefused, m.stalls, m.clockSteps, pending,
		&stateCollector{n: n},
		// The scheduler's latencies and the GC's pauses: what a node
		// starved of CPU shows (RELIABILITY finding 10).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler, collectors.MetricsGC)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(n.disk.collectors()...)
	if s := raftMetricsSink(); s != nil {
		m.reg.MustRegister(s)
	}
	return m
}

type rpcKey struct{ method, code string }

type rpcObservers struct {
	count prometheus.Counter
	dur   prometheus.Observer
}

func (m *nodeMetrics) observeRPC(method, code string, d time.Duration) {
	k := rpcKey{method, code}
	o, ok := m.rpcObs.Load(k)
	if !ok {
		o, _ = m.rpcObs.LoadOrStore(k, rpcObservers{m.rpcs.WithLabelValues(method, code), m.rpcDur.WithLabelValues(method)})
	}
	obs := o.(rpcObservers)
	obs.count.Inc()
	obs.dur.Observe(d.Seconds())
}

func (m *nodeMetrics) observeMooncake(function string, d time.Duration) {
	o, ok := m.mooncakeObs.Load(function)
	if !ok {
		o, _ = m.mooncakeObs.LoadOrStore(function, m.mooncakeDur.WithLabelValues(function))
	}
	o.(prometheus.Observer).Observe(d.Seconds())
}

func (m *nodeMetrics) observeEtcd(op string, start time.Time, err error) {
	m.etcdDur.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		m.etcdErrs.WithLabelValues(op).Inc()
	}
}

func (m *nodeMetrics) handler() http.Handler {
	// ContinueOnError: a metric that fails to gather (say a future raft
	// metric clashing with one of ours) must not hide all the others.
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, ErrorHandling: promhttp.ContinueOnError})
}

// Registry is the node's Prometheus registry (served on /metrics), for
// embedding a node in a program with its own metrics endpoint.
func (n *Node) Registry() *prometheus.Registry { return n.metrics.reg }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(ns+"_"+name, help, labels, nil)
}

// stateCollector reads the replicated state and Raft at scrape time, under
// one read lock, so the numbers of one scrape are consistent.
type stateCollector struct{ n *Node }

var (
	dObjects      = desc("objects", "Objects in the state (complete and being written).")
	dProcessing   = desc("objects_processing", "Objects whose put has started but not ended.")
	dSegments     = desc("segments", "Mounted segments.")
	dSessions     = desc("sessions", "Client sessions (clients that pinged within client-ttl).")
	dUsed         = desc("used_bytes", "Bytes allocated to buffers, over all segments.")
	dCapacity     = desc("capacity_bytes", "Bytes of all mounted segments.")
	dSegUsed      = desc("segment_used_bytes", "Bytes allocated to buffers in one segment.", "segment", "name", "client")
	dSegCapacity  = desc("segment_capacity_bytes", "Size of one segment.", "segment", "name", "client")
	dRing         = desc("export_ring_entries", "OpLog entries produced but not yet acknowledged as written to etcd.")
	dAppliedSeq   = desc("applied_seq", "Last OpLog sequence id produced by the state machine.")
	dExportedSeq  = desc("exported_seq", "Last OpLog sequence id the leader wrote to etcd (leader only).")
	dBacklogAge   = desc("export_backlog_seconds", "Age of the oldest OpLog entry the leader has not yet written to etcd: the window a rebuild from a snapshot plus etcd would miss (leader only; 0 when none waits).")
	dBacklog      = desc("export_backlog_entries", "OpLog entries the leader has applied and etcd has not taken (leader only); past --export-soft-entries client writes are paced.")
	dTakeRate     = desc("export_take_rate", "OpLog entries a second etcd takes, as the leader measures it while its export is busy (leader only; 0 until measured).")
	dEtcdDown     = desc("export_etcd_down", "1 while the leader's last etcd call for the export failed: writes are then not paced but refused at --export-ring (leader only).")
	dPacedNow     = desc("writes_paced", "Client writes waiting now for etcd to take the OpLog backlog (leader only).")
	dPaced        = desc("writes_paced_total", "Client writes that waited for etcd to take the OpLog backlog, as leader.")
	dPaceRefused  = desc("writes_pace_refused_total", "Client writes refused (TOO_MANY_REQUESTS, or ETCD_OPERATION_ERROR at the hard bound) because of the OpLog backlog, as leader.")
	dDeferred     = desc("export_deferred_removals", "REMOVEs of bulk removals (unmounts, expiry, eviction, RemoveAll) waiting to enter the export ring, released at etcd's pace.")
	dDeferredAge  = desc("export_deferred_seconds", "How long the oldest deferred REMOVE has waited (0: none); with export_backlog_seconds, what a rebuild from etcd would miss.")
	dEvictions    = desc("evictions_total", "Objects evicted under memory pressure, as applied on this node.")
	dRestore      = desc("snapshot_restore_seconds", "Time the last restore of a Raft snapshot into the state took (at start, or one installed from the leader); 0 before the first.")
	dRestoreCPU   = desc("snapshot_restore_cpu_seconds", "CPU time the last restore of a Raft snapshot used (Linux); of its snapshot_restore_seconds, the rest it waited for a CPU.")
	dLeader       = desc("leader", "1 on the promoted leader (serving clients), else 0.")
	dState        = desc("raft_state", "1 for this node's current Raft state.", "state")
	dTerm         = desc("raft_term", "Current Raft term.")
	dCommitIndex  = desc("raft_commit_index", "Raft commit index known to this node.")
	dAppliedIndex = desc("raft_applied_index", "Raft index last applied to the state machine.")
	dLastIndex    = desc("raft_last_log_index", "Last index in this node's Raft log.")
	dLastContact  = desc("raft_last_contact_seconds", "Seconds since a follower last heard from the leader (0 on the leader).")
	dLag          = desc("follower_lag_seconds", "Wall clock minus the time stamped by the leader on the newest command applied here: how far this node's state trails the leader's clock (about one tick when healthy).")
	dEtcdTxns     = desc("etcd_txns_total", "etcd write transactions made by this node, by kind.", "kind")
	dEtcdBytes    = desc("etcd_bytes_total", "Bytes of keys and values put to etcd by this node, by kind.", "kind")
	dReadMode     = desc("read_mode", "1 for the read mode in force (--read-mode).", "mode")
	dLease        = desc("read_lease_remaining_seconds", "How long this leader's read lease still holds (0: none; reads then wait for a quorum round).")
	dRounds       = desc("read_quorum_rounds_total", "Quorum rounds (barrier entries) run to confirm leadership for reads and to renew the read lease.")
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{dObjects, dProcessing, dSegments, dSessions, dUsed, dCapacity, dSegUsed, dSegCapacity,
		dRing, dAppliedSeq, dExportedSeq, dBacklogAge, dBacklog, dTakeRate, dEtcdDown, dPacedNow, dPaced, dPaceRefused, dDeferred, dDeferredAge, dEvictions, dRestore, dRestoreCPU, dLeader, dState, dTerm, dCommitIndex, dAppliedIndex, dLastIndex,
		dLastContact, dLag, dEtcdTxns, dEtcdBytes, dReadMode, dLease, dRounds} {
		ch <- d
	}
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	var (
		st       fsm.Stats
		segs     []fsm.SegmentInfo
		deferred int
		oldestMs int64
		waiting  bool
	)
	n.sm.read(func(f *fsm.FSM) {
		st = f.Stats()
		segs = f.Segments()
		deferred, oldestMs, waiting = f.DeferredRemovals()
	})
	gauge(ch, dObjects, float64(st.Objects))
	gauge(ch, dProcessing, float64(st.Processing))
	gauge(ch, dSegments, float64(st.Segments))
	gauge(ch, dSessions, float64(st.Sessions))
	gauge(ch, dUsed, float64(st.UsedBytes))
	gauge(ch, dCapacity, float64(st.CapacityBytes))
	for _, s := range segs {
		gauge(ch, dSegUsed, float64(s.Used), s.ID, s.Name, s.ClientID)
		gauge(ch, dSegCapacity, float64(s.Size), s.ID, s.Name, s.ClientID)
	}
	gauge(ch, dRing, float64(st.RingLen))
	gauge(ch, dDeferred, float64(deferred))
	age := 0.0
	if waiting {
		age = max(0, float64(n.now()-oldestMs)/1000)
	}
	gauge(ch, dDeferredAge, age)
	gauge(ch, dAppliedSeq, float64(st.AppliedSeq))
	counter(ch, dEvictions, float64(n.sm.evicted.Load()))
	var last restored
	if r := n.sm.lastRestore.Load(); r != nil {
		last = *r
	}
	gauge(ch, dRestore, last.took.Seconds())
	gauge(ch, dRestoreCPU, last.cpu.Seconds())

	leader := n.IsLeader()
	if leader {
		exported := n.exportedSeq.Load()
		gauge(ch, dExportedSeq, float64(exported))
		if n.etcd != nil {
			gauge(ch, dBacklogAge, n.backlogAge(exported).Seconds())
			gauge(ch, dBacklog, float64(n.backlog()))
		}
	}
	if n.etcd != nil {
		ps := n.pacer.stats()
		if leader {
			gauge(ch, dTakeRate, ps.TakeRate)
			gauge(ch, dEtcdDown, b2f(ps.EtcdDown()))
			gauge(ch, dPacedNow, float64(ps.Waiting))
		}
		counter(ch, dPaced, float64(ps.Paced))
		counter(ch, dPaceRefused, float64(ps.Refused))
	}
	gauge(ch, dLeader, b2f(leader))
	state := n.raft.State()
	for _, s := range []raft.RaftState{raft.Follower, raft.Candidate, raft.Leader, raft.Shutdown} {
		gauge(ch, dState, b2f(s == state), strings.ToLower(s.String()))
	}
	gauge(ch, dTerm, float64(n.raft.CurrentTerm()))
	gauge(ch, dCommitIndex, float64(n.raft.CommitIndex()))
	gauge(ch, dAppliedIndex, float64(n.sm.appliedIndex.Load()))
	gauge(ch, dLastIndex, float64(n.raft.LastIndex()))
	contact := 0.0
	if state != raft.Leader {
		if lc := n.raft.LastContact(); !lc.IsZero() {
			contact = time.Since(lc).Seconds()
		}
	}
	gauge(ch, dLastContact, contact)
	if st.NowMs > 0 {
		gauge(ch, dLag, max(0, float64(n.now()-st.NowMs)/1000))
	}
	for _, m := range []ReadMode{ReadLease, ReadQuorum} {
		gauge(ch, dReadMode, b2f(m == n.cfg.ReadMode), string(m))
	}
	gauge(ch, dLease, n.leadership.remaining().Seconds())
	counter(ch, dRounds, float64(n.leadership.rounds.Load()))
	if n.etcd != nil {
		es := n.etcd.Stats()
		counter(ch, dEtcdTxns, float64(es.OplogTxns), "oplog")
		counter(ch, dEtcdTxns, float64(es.RenewalTxns), "renewals")
		counter(ch, dEtcdBytes, float64(es.OplogBytes), "oplog")
		counter(ch, dEtcdBytes, float64(es.RenewalBytes), "renewals")
	}
}

// backlogAge is how long the oldest OpLog entry after exported has waited
// for etcd (0: none waits).
func (n *Node) backlogAge(exported uint64) time.Duration {
	var (
		oldest int64
		waits  bool
	)
	n.sm.read(func(f *fsm.FSM) { oldest, waits = f.RingAfter(exported, 1).OldestMs() })
	if !waits {
		return 0
	}
	return time.Duration(max(0, n.now()-oldest)) * time.Millisecond
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
