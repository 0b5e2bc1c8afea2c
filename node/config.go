package node

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/moonraft/moonraft/transport"
)

// Config is everything one node needs.
type Config struct {
	ID       string
	DataDir  string
	RaftAddr string // host:port to listen on and advertise for Raft
	GRPCAddr string // clients' address: served by Listen, advertised in Promote for NOT_LEADER answers
	HTTPAddr string // health and status over HTTP; empty for none
	// MooncakeAddr serves the Mooncake master's own protocol (coro_rpc,
	// release 0.3.12.post1) for unmodified Mooncake clients; empty for none.
	MooncakeAddr string
	// MooncakeLoops is the number of event loops serving MooncakeAddr
	// (cororpc.Server.Loops: 0 for its default).
	MooncakeLoops int
	Pprof         bool   // also serve Go's profiler at /debug/pprof/ on HTTPAddr
	Join          string // gRPC address of a member to join through when the data dir is empty
	ClusterID     string

	Bootstrap bool             // form a new cluster from Peers if DataDir holds no Raft state
	Peers     []raftstore.Peer // identical on every bootstrapping node
	// RaftDial overrides, per peer id, the address this node dials for
	// Raft (NAT, a local proxy, the fault suite's per-link proxies); the
	// configuration keeps the peers' advertised addresses.
	RaftDial map[string]string

	// Etcd is where the leader exports the OpLog; no endpoints: no export.
	Etcd           etcdbridge.Config
	ExportRenewals bool // write lease_renewals/ once a second
	// ExportLinger is how long the exporter, under load, waits for a fuller
	// etcd transaction (Kafka's linger.ms): the longest an entry waits
	// before etcd's watchers can see it. 0: every entry as soon as read.
	ExportLinger time.Duration
	OplogRetain  uint64 // OpLog entries kept in etcd behind the last snapshot
	// ExportSoftEntries and ExportSoftAge are the export's soft bound:
	// past that many entries etcd has not taken, or an oldest one that old,
	// client writes are paced to etcd's rate (pace.go). The hard bound is
	// Params.ExportRingCap.
	ExportSoftEntries uint64
	ExportSoftAge     time.Duration

	// TLS secures the node's gRPC server and client, and its Raft
	// transport (a TLS stream layer); with a CA, both require mutual TLS.
	// No files: plaintext.
	TLS transport.TLSFiles
	// HTTPTLS serves HTTPAddr over TLS with the node's certificate (client
	// certificates are checked if presented, never required, so probes
	// and scrapers without one still work).
	HTTPTLS bool
	// AdminToken, when set, guards the admin RPCs (transport.AdminMethod);
	// this node's own admin calls (join) send it.
	AdminToken string
	// Limits bound requests and clients on the gRPC API.
	Limits transport.Limits
	// Listen opens the node's listeners on GRPCAddr, MooncakeAddr and
	// HTTPAddr once Raft runs (bin/moonraft: cmd/node/serve); Close calls
	// stop before it stops Raft. nil: none.
	Listen func(*Node) (stop func(), err error)

	Params fsm.Params    // applied cluster-wide when this node becomes leader
	Tick   time.Duration // how often the leader proposes a Tick
	// KeyIndexAfter is how long a new leader serves before it builds its
	// key index (fsm/keyindex.go); until then its reads go through the
	// object tree.
	KeyIndexAfter time.Duration
	// GracefulUnmountMax bounds a graceful unmount's grace period: a
	// request for none or for longer gets this.
	GracefulUnmountMax time.Duration
	// MaxPendingWrites bounds the client writes this node has sent to the
	// log and not yet seen applied; past it a write is refused at once with
	// TOO_MANY_REQUESTS (-1: no bound).
	MaxPendingWrites int

	HeartbeatTimeout time.Duration
	ElectionTimeout  time.Duration
	// LeaderLeaseTimeout: a leader without contact from a quorum this
	// long steps down; 0 takes the heartbeat timeout (leaderLease).
	LeaderLeaseTimeout time.Duration

	// ReadMode is how the leader makes reads linearizable: ReadLease
	// (default) or ReadQuorum.
	ReadMode ReadMode
	// ReadLease is the read lease's length; 0 takes the longest safe one,
	// maxReadLease(HeartbeatTimeout). A node also waits this long before
	// it starts Raft (it must not vote while a lease it confirmed before a
	// restart may still hold).
	ReadLease time.Duration
	// UnsafeReadLease allows a ReadLease longer than the safe bound. For
	// testing only: the fault suite uses it to show that the stale reads
	// such a lease allows are caught.
	UnsafeReadLease bool

	// RaftLogStore is the Raft log store of a new data dir ("": the
	// default); an existing one keeps its own, and a different explicit
	// choice is refused.
	RaftLogStore raftstore.LogStore
	// WALSegmentBytes sizes the raft-wal segments created from now on (0:
	// raft-wal's default, 64 MiB).
	WALSegmentBytes int

	// A snapshot is taken, checked every SnapshotInterval, once at least
	// SnapshotThreshold log entries (or that many puts' bytes) and
	// SnapshotLogRatio times the last snapshot's size in log bytes have
	// followed it (snapshotpolicy.go);
	// with a ratio of 0, at SnapshotThreshold entries alone. The default
	// interval is short because a check is a few loads and a restart
	// replays the log since the last snapshot, which grows past the
	// ratio's share until the next check (at 30 s a node checked every
	// 30–60 s and held 96 s of log where 45 s was due: docs/BENCHMARKS.md,
	// "Production size").
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	SnapshotLogRatio  float64
	SnapshotRetain    int

	Logger hclog.Logger
	// OnStall, if set, is called with a stall's kind (stall.go) when this
	// node sees one; cmd/node passes the flight recorder's dump.
	OnStall func(kind string)
	// Now is the leader's clock in Unix milliseconds; tests replace it.
	// Unset, it is the wall clock read when this node last became leader,
	// counted on with the monotonic clock (clock.go).
	Now func() int64
	// clocks reads the wall clock, which Now reads at each term and the
	// stall watcher compares with the monotonic clock, and the monotonic
	// clock at one moment; tests step the first.
	clocks func() (wall, mono time.Time)
}

// DefaultMaxPendingWrites is the default of Config.MaxPendingWrites: twice
// the clients at which puts peak on a small cluster (docs/BENCHMARKS.md),
// and a wait behind it of about 0.1 s at this kind of cluster's commit
// rate, within the deadlines clients use.
const DefaultMaxPendingWrites = 512

// The export's default soft bound (docs/OPERATIONS.md, "When writes
// outpace etcd"): a quarter of the default ring, and half a minute of
// what a rebuild from etcd would miss. A sweep step of batch puts at
// several times etcd's rate (moonbench, 7 s) stays under it.
const (
	DefaultExportSoftEntries = 250_000
	DefaultExportSoftAge     = 30 * time.Second
)

// DefaultSnapshotLogRatio is Config.SnapshotLogRatio's default: a snapshot
// once the log since the last one is half as large as it was. A restart
// loads the snapshot, then replays the log since, and a byte of either
// costs about the same to load; at 1.0 a restart at three million objects
// took up to twice a snapshot's load, 16–21 s against issue 41's 15 s, and
// at half it is at most one and a half (docs/OPERATIONS.md, "Snapshots").
const DefaultSnapshotLogRatio = 0.5

// DefaultKeyIndexAfter is Config.KeyIndexAfter's default. Built at the
// promotion, the index took a core of a new leader of six million objects
// for two seconds, and its allocation (~300 MB within 0.1 s) began a
// collection of the whole heap that took most of the rest: the new leader
// answered its first writes 0.2–0.5 s late (docs/BENCHMARKS.md, "The
// failover at 6M"). Five seconds on, the clients have come back.
const DefaultKeyIndexAfter = 5 * time.Second

// DefaultConfig returns the defaults, with timeouts tuned for a LAN.
func DefaultConfig() Config {
	return Config{
		ClusterID:          "mooncake_cluster",
		Params:             fsm.DefaultParams(),
		Tick:               100 * time.Millisecond,
		KeyIndexAfter:      DefaultKeyIndexAfter,
		GracefulUnmountMax: 30 * time.Second,
		MaxPendingWrites:   DefaultMaxPendingWrites,
		HeartbeatTimeout:   300 * time.Millisecond,
		ElectionTimeout:    300 * time.Millisecond,
		ReadMode:           ReadLease,
		SnapshotInterval:   10 * time.Second,
		SnapshotThreshold:  16384,
		SnapshotLogRatio:   DefaultSnapshotLogRatio,
		SnapshotRetain:     2,
		ExportRenewals:     true,
		ExportLinger:       200 * time.Millisecond,
		OplogRetain:        10_000,
		ExportSoftEntries:  DefaultExportSoftEntries,
		ExportSoftAge:      DefaultExportSoftAge,
	}
}

// leaderLease is how long a leader goes without contact from a quorum
// before it steps down: by default the heartbeat timeout, as etcd's
// CheckQuorum waits an election timeout, so that a leader steps down when
// its followers would elect another, not before. hashicorp/raft's half of
// it cost leaderships to a busy leader's own stalls: its goroutines waited
// to run 150–300 ms behind hundreds of request handlers while no follower
// lost it (docs/RELIABILITY.md, finding 27). The read lease does not rest
// on it (leadership.go).
func (c *Config) leaderLease() time.Duration {
	if c.LeaderLeaseTimeout > 0 {
		return c.LeaderLeaseTimeout
	}
	return c.HeartbeatTimeout
}

// readLease is the read lease's length in force (also the wait before Raft
// starts).
func (c *Config) readLease() time.Duration {
	if c.ReadLease > 0 {
		return c.ReadLease
	}
	return maxReadLease(c.HeartbeatTimeout)
}

func (c *Config) validate() error {
	switch {
	case c.ID == "":
		return errcode.New(errcode.InvalidParams, "node id is empty")
	case c.DataDir == "":
		return errcode.New(errcode.InvalidParams, "data dir is empty")
	case c.RaftAddr == "":
		return errcode.New(errcode.InvalidParams, "raft address is empty")
	case c.Tick <= 0:
		return errcode.New(errcode.InvalidParams, "tick must be positive, got %v", c.Tick)
	case c.KeyIndexAfter < 0:
		return errcode.New(errcode.InvalidParams, "key index delay must not be negative, got %v", c.KeyIndexAfter)
	case c.ExportLinger < 0:
		return errcode.New(errcode.InvalidParams, "export linger must not be negative, got %v", c.ExportLinger)
	case c.GracefulUnmountMax < 0:
		return errcode.New(errcode.InvalidParams, "graceful unmount bound must not be negative, got %v", c.GracefulUnmountMax)
	case c.ExportSoftEntries == 0 || c.ExportSoftAge <= 0:
		return errcode.New(errcode.InvalidParams, "the export's soft bound must be positive, got %d entries and %v", c.ExportSoftEntries, c.ExportSoftAge)
	case c.Params.ExportRingCap > 0 && c.ExportSoftEntries >= c.Params.ExportRingCap:
		return errcode.New(errcode.InvalidParams, "the export's soft bound (%d entries) must be below its hard bound --export-ring (%d)", c.ExportSoftEntries, c.Params.ExportRingCap)
	case c.MaxPendingWrites == 0 || c.MaxPendingWrites < -1:
		return errcode.New(errcode.InvalidParams, "max pending writes must be positive or -1 (no bound), got %d", c.MaxPendingWrites)
	case c.Bootstrap && len(c.Peers) == 0:
		return errcode.New(errcode.InvalidParams, "bootstrap needs --peers")
	case !(c.SnapshotLogRatio >= 0):
		return errcode.New(errcode.InvalidParams, "--snapshot-log-ratio %g: want 0 (entries alone) or a positive multiple of the last snapshot's size", c.SnapshotLogRatio)
	}
	if c.Bootstrap {
		found := false
		for _, p := range c.Peers {
			found = found || p.ID == c.ID
		}
		if !found {
			return errcode.New(errcode.InvalidParams, "bootstrap peers %v do not include this node %q", c.Peers, c.ID)
		}
	}
	switch c.ReadMode {
	case ReadLease, ReadQuorum:
	default:
		return errcode.New(errcode.InvalidParams, "read mode %q: want %q or %q", c.ReadMode, ReadLease, ReadQuorum)
	}
	if c.ReadLease < 0 {
		return errcode.New(errcode.InvalidParams, "read lease must not be negative, got %v", c.ReadLease)
	}
	if max := maxReadLease(c.HeartbeatTimeout); c.ReadLease > max && !c.UnsafeReadLease {
		return errcode.New(errcode.InvalidParams,
			"read lease %v is longer than %v (90%% of the heartbeat timeout %v): followers refuse other candidates only for one heartbeat timeout, so a longer lease allows stale reads; shorten it or raise --heartbeat-timeout",
			c.ReadLease, max, c.HeartbeatTimeout)
	}
	if c.HTTPTLS && c.TLS.Cert == "" {
		return errcode.New(errcode.InvalidParams, "--http-tls needs --tls-cert and --tls-key")
	}
	if c.TLS.Enabled() && (c.TLS.Cert == "" || c.TLS.Key == "") {
		return errcode.New(errcode.InvalidParams, "TLS on a node needs --tls-cert and --tls-key (it serves gRPC and Raft); --tls-ca alone is not enough")
	}
	if err := c.Limits.Validate(); err != nil {
		return err
	}
	if err := c.Params.Validate(); err != nil {
		return fmt.Errorf("cluster parameters: %w", err)
	}
	return nil
}
