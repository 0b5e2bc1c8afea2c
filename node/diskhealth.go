package node

import (
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/prometheus/client_golang/prometheus"
)

// A full or failing disk shows in hashicorp/raft's log lines only; a node
// also keeps the last failed write of each kind for Status and counts them
// in moonraft_disk_errors_total, until a write of that kind succeeds again.
const (
	diskLogAppend = "log_append"
	diskSnapshot  = "snapshot"
)

type diskHealth struct {
	failing atomic.Bool // last is not empty: lets a good write skip the lock
	mu      sync.Mutex
	last    map[string]string // op -> the last error, while it stands
	errs    *prometheus.CounterVec
	// appendDur is what etcd's wal_fsync_duration_seconds is to etcd: a
	// commit waits for the slowest of a quorum's log writes, and a follower
	// applies an entry only after its next log write.
	appendDur prometheus.Histogram
	// What the log and the snapshots cost the disk: a scale run reads
	// them for the Raft traffic of idle clients and the price of a
	// snapshot at size (issue 41).
	appendedBytes, appendedEntries prometheus.Counter
	snapshotDur                    prometheus.Histogram
	snapshotBytes, snapshotLast    prometheus.Gauge
	// Where the last snapshot's time went: the writer's CPU and the
	// file's syncs; the rest of its time the writer waited for a CPU.
	snapshotCPU, snapshotSync prometheus.Gauge
	// For the snapshot rule (snapshotpolicy.go): log bytes written in
	// this process's life, the count when the last snapshot was written,
	// and that snapshot's size and last index.
	logBytes      atomic.Uint64
	logBytesMark  atomic.Uint64
	snapSize      atomic.Uint64
	snapLastIndex atomic.Uint64
}

func newDiskHealth() *diskHealth {
	return &diskHealth{
		last: map[string]string{},
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "disk_errors_total",
			Help: "Failed writes of the Raft log (log_append) or of a Raft snapshot (snapshot) on this node: a full or failing disk."},
			[]string{"op"}),
		appendDur: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "raft_log_append_seconds",
			Help:    "Time to write one batch of Raft log entries to this node's log store, fsync included.",
			Buckets: latencyBuckets}),
		appendedBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "raft_log_appended_bytes_total",
			Help: "Bytes of Raft log entry data written to this node's log store."}),
		appendedEntries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "raft_log_appended_entries_total",
			Help: "Raft log entries written to this node's log store."}),
		snapshotDur: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "snapshot_write_seconds",
			Help:    "Time to write one Raft snapshot (taken here, or installed from the leader) to the snapshot store, fsync included.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		snapshotBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "snapshot_size_bytes",
			Help: "Size of the last Raft snapshot written to the snapshot store."}),
		snapshotLast: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "snapshot_last_written_timestamp_seconds",
			Help: "When the last Raft snapshot was written (Unix time)."}),
		snapshotCPU: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "snapshot_write_cpu_seconds",
			Help: "CPU time the writer of the last Raft snapshot taken here used (Linux); of its snapshot_write_seconds, what is neither this nor snapshot_sync_seconds it waited for a CPU."}),
		snapshotSync: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "snapshot_sync_seconds",
			Help: "Time the last Raft snapshot written here spent syncing its file to disk (the syncs while it is written and the last, at close)."}),
	}
}

// collectors are the metrics diskHealth keeps, for the node's registry.
func (d *diskHealth) collectors() []prometheus.Collector {
	return []prometheus.Collector{d.errs, d.appendDur, d.appendedBytes, d.appendedEntries, d.snapshotDur, d.snapshotBytes, d.snapshotLast, d.snapshotCPU, d.snapshotSync}
}

func (d *diskHealth) observe(op string, err error) {
	if err == nil && !d.failing.Load() {
		return // every append passes here
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil {
		delete(d.last, op)
	} else {
		d.last[op] = err.Error()
		d.errs.WithLabelValues(op).Inc()
	}
	d.failing.Store(len(d.last) > 0)
}

// standing says whether a failed write of kind op stands.
func (d *diskHealth) standing(op string) bool {
	if !d.failing.Load() {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.last[op]
	return ok
}

// String is the standing errors, "op: error" each, "" when there are none.
func (d *diskHealth) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for op, e := range d.last {
		out = append(out, op+": "+e)
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// watchedLog reports each append's outcome, and when the one under way
// began (for the disk watchdog, fence.go).
type watchedLog struct {
	raft.LogStore
	h     *diskHealth
	since instant // when the write under way began
}

func (w *watchedLog) StoreLog(l *raft.Log) error {
	return w.StoreLogs([]*raft.Log{l})
}

func (w *watchedLog) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	w.since.set(start)
	err := w.LogStore.StoreLogs(logs)
	w.since.clear()
	w.h.appendDur.Observe(time.Since(start).Seconds())
	w.h.observe(diskLogAppend, err)
	if err == nil {
		var bytes int
		for _, l := range logs {
			bytes += len(l.Data)
		}
		w.h.logBytes.Add(uint64(bytes))
		w.h.appendedBytes.Add(float64(bytes))
		w.h.appendedEntries.Add(float64(len(logs)))
	}
	return err
}

// outstanding says since when a write has been under way, if one is.
func (w *watchedLog) outstanding() (time.Time, bool) { return w.since.get() }

func (w *watchedLog) IsMonotonic() bool { return raftstore.IsMonotonic(w.LogStore) }

// watchedSnapshots reports each snapshot's outcome: creating its files,
// writing it, and closing it (where a buffered write or the fsync fails).
// Its sinks also flush the file every snapshotSyncEvery bytes.
type watchedSnapshots struct {
	raft.SnapshotStore
	h       *diskHealth
	dataDir string // the store's, for the file a sink writes ("": no flushes)
}

// snapshotSyncEvery is how much of a snapshot is written between syncs of
// its file. Without them the file is flushed whole when the sink closes,
// and the Raft log's own syncs queue behind that: a 4 KiB append's sync
// waited up to 82 ms behind a 270 MB file's on the machine of
// docs/BENCHMARKS.md, 5 ms with a sync every 8 MB; a slower disk or a
// larger state would make the wait seconds, past the disk watchdog.
const snapshotSyncEvery = 8 << 20

func (w *watchedSnapshots) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration, confIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := w.SnapshotStore.Create(version, index, term, conf, confIndex, trans)
	if err != nil {
		w.h.observe(diskSnapshot, err)
		return nil, err
	}
	ws := &watchedSink{SnapshotSink: sink, h: w.h, start: time.Now(), index: index}
	if w.dataDir != "" {
		// A second descriptor of the file the sink writes: syncing it
		// flushes what the sink has written so far.
		if f, err := os.OpenFile(raftstore.SnapshotStateFile(w.dataDir, sink.ID()), os.O_WRONLY, 0); err == nil {
			ws.file = f
		}
	}
	return ws, nil
}

type watchedSink struct {
	raft.SnapshotSink
	h      *diskHealth
	failed bool
	start  time.Time
	index  uint64
	bytes  int
	closed bool
	file   *os.File // the state file, synced every snapshotSyncEvery; nil if it could not be opened
	synced int      // bytes written when it was last synced
	syncs  int
	// syncTime is the time spent in syncs; encodeCPU the writer's CPU
	// (Persist), 0 for a snapshot installed from the leader.
	syncTime, encodeCPU time.Duration
}

func (w *watchedSink) Write(p []byte) (int, error) {
	n, err := w.SnapshotSink.Write(p)
	w.bytes += n
	if err != nil {
		w.failed = true
		w.h.observe(diskSnapshot, err)
	}
	if w.file != nil && w.bytes-w.synced >= snapshotSyncEvery {
		// An error here is the final sync's to report, at Close.
		t0 := time.Now()
		_ = w.file.Sync()
		w.syncTime += time.Since(t0)
		w.synced = w.bytes
		w.syncs++
	}
	return n, err
}

func (w *watchedSink) Cancel() error {
	w.closeFile()
	return w.SnapshotSink.Cancel()
}

func (w *watchedSink) closeFile() {
	if w.file != nil {
		_ = w.file.Close()
		w.file = nil
	}
}

func (w *watchedSink) Close() error {
	w.closeFile()
	t0 := time.Now()
	err := w.SnapshotSink.Close() // the last sync
	w.syncTime += time.Since(t0)
	if err != nil || !w.failed {
		w.h.observe(diskSnapshot, err)
	}
	// hashicorp/raft closes the sink again after Persist has: one
	// snapshot, counted once.
	if err == nil && !w.failed && !w.closed {
		w.closed = true
		now := time.Now()
		w.h.snapshotDur.Observe(now.Sub(w.start).Seconds())
		w.h.snapshotBytes.Set(float64(w.bytes))
		w.h.snapshotLast.Set(float64(now.UnixNano()) / 1e9)
		w.h.snapshotSync.Set(w.syncTime.Seconds())
		if w.encodeCPU > 0 {
			w.h.snapshotCPU.Set(w.encodeCPU.Seconds())
		}
		w.h.snapshotWritten(w.index, uint64(w.bytes))
	}
	return err
}

// snapshotWritten records a snapshot of size bytes up to index: the log
// since is counted from here.
func (d *diskHealth) snapshotWritten(index, size uint64) {
	d.snapSize.Store(size)
	d.snapLastIndex.Store(index)
	d.logBytesMark.Store(d.logBytes.Load())
}
