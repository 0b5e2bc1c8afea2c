// Command moonraft (built from cmd/node) runs one moonraft server. It only
// parses flags (and the config file, whose keys are the flag names) and
// signals; everything else lives in node/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/cmd/node/serve"
	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/internal/flightrec"
	"github.com/moonraft/moonraft/internal/listflag"
	"github.com/moonraft/moonraft/internal/memlimit"
	"github.com/moonraft/moonraft/node"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/moonraft/moonraft/transport"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "moonraft:", err)
		os.Exit(1)
	}
}

// options is a parsed command line: the node's configuration and the mode
// to run in.
type options struct {
	cfg            node.Config
	gcPercent      int
	heapHeadroom   float64
	mooncakeDrain  time.Duration
	flightDir      string
	dev            bool
	followEtcd     bool
	followSnapshot string
}

// parseArgs parses the flags, then the --config file for the flags not
// given on the command line, and builds the node configuration.
func parseArgs(args []string) (*options, error) {
	o := &options{cfg: node.DefaultConfig()}
	fs, configFile, finish := newFlags(o)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, errcode.New(errcode.InvalidParams, "unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if *configFile != "" {
		onCommandLine := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
		if err := applyConfigFile(fs, *configFile, onCommandLine); err != nil {
			return nil, err
		}
	}
	if err := finish(); err != nil {
		return nil, err
	}
	return o, nil
}

// newFlags defines every flag on a new FlagSet, writing into o; finish
// turns the parsed values into o.cfg once flags and config file are read.
func newFlags(o *options) (fs *flag.FlagSet, configFile *string, finish func() error) {
	cfg := &o.cfg
	fs = flag.NewFlagSet("moonraft", flag.ContinueOnError)
	configFile = fs.String("config", "", "HCL (or JSON) file whose keys are these flag names, e.g. raft-addr = \"10.0.0.1:7200\"; flags given on the command line win")
	fs.StringVar(&cfg.ID, "id", "", "node id, unique in the cluster (required)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the Raft log and snapshots (required)")
	fs.StringVar(&cfg.RaftAddr, "raft-addr", "127.0.0.1:7200", "host:port for Raft traffic, advertised to peers")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:7100", "host:port for clients (gRPC)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", "", "host:port for /metrics, /healthz, /readyz and /status (empty: off)")
	fs.StringVar(&cfg.MooncakeAddr, "mooncake-addr", "", "host:port for unmodified Mooncake clients: the Mooncake master's own protocol (coro_rpc, release 0.3.12.post1; Mooncake's default port is 50051; empty: off)")
	fs.BoolVar(&cfg.Bootstrap, "bootstrap", false, "form a new cluster from --peers if the data dir is empty")
	peers := fs.String("peers", "", "initial members id=raft-addr,... (identical on every bootstrapping node)")
	raftDial := fs.String("raft-dial", "", "id=host:port,...: dial these peers at these addresses instead of their advertised ones (NAT, proxies)")
	fs.StringVar(&cfg.Join, "join", "", "gRPC address of any member to join through (when the data dir is empty)")
	fs.StringVar(&cfg.ClusterID, "cluster-id", cfg.ClusterID, "cluster id, recorded in snapshots")
	leaseTTL := fs.Duration("lease-ttl", time.Duration(cfg.Params.LeaseTTLMs)*time.Millisecond, "read lease granted by GetReplicaList and ExistKey")
	softPinTTL := fs.Duration("soft-pin-ttl", time.Duration(cfg.Params.SoftPinTTLMs)*time.Millisecond, "soft pin of objects put with soft pin")
	clientTTL := fs.Duration("client-ttl", time.Duration(cfg.Params.ClientTTLMs)*time.Millisecond, "a client's session ends this long after its last ping")
	fs.DurationVar(&cfg.Tick, "tick", cfg.Tick, "how often the leader replicates time, renewals and pings")
	fs.DurationVar(&cfg.GracefulUnmountMax, "graceful-unmount-max", cfg.GracefulUnmountMax,
		"longest wait of a graceful unmount before the segment goes whatever holds it (a request for none or more gets this)")
	highWatermark := fs.Float64("high-watermark", float64(cfg.Params.HighWatermarkPPM)/1e6, "evict when used/capacity exceeds this")
	evictionRatio := fs.Float64("eviction-ratio", float64(cfg.Params.EvictionRatioPPM)/1e6, "share of capacity each eviction frees")
	fs.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "Raft heartbeat timeout")
	fs.DurationVar(&cfg.ElectionTimeout, "election-timeout", cfg.ElectionTimeout, "Raft election timeout")
	readMode := fs.String("read-mode", string(cfg.ReadMode), "how the leader makes reads linearizable: lease (no round trip while a quorum-confirmed read lease holds) or quorum (a round per read); docs/OPERATIONS.md")
	fs.DurationVar(&cfg.ReadLease, "read-lease", 0, "read lease length (0: 90% of --heartbeat-timeout, the longest safe one); a node also waits this long before starting Raft")
	fs.BoolVar(&cfg.UnsafeReadLease, "unsafe-read-lease", false, "allow --read-lease beyond the safe bound: stale reads become possible (testing only)")
	logStore := fs.String("raft-log-store", "", "Raft log store of a new data dir: wal (one fsync per append; the default) or boltdb; an existing data dir keeps its own (docs/OPERATIONS.md)")
	walSegmentMB := fs.Int("raft-wal-segment-mb", 64, "size of each raft-wal segment file created from now on, in MiB (preallocated; Consul's segment_size_mb)")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "how often Raft checks whether to snapshot")
	fs.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", cfg.SnapshotThreshold, "log entries since the last snapshot before a new one is taken, or that many times 256 bytes of log (and --snapshot-log-ratio's bytes)")
	fs.Float64Var(&cfg.SnapshotLogRatio, "snapshot-log-ratio", cfg.SnapshotLogRatio,
		"take a snapshot once the log written since the last one is this many times that snapshot's size (and --snapshot-threshold entries); 0: at --snapshot-threshold entries alone (docs/OPERATIONS.md)")
	logLevel := fs.String("log-level", "info", "trace, debug, info, warn or error")
	fs.StringVar(&o.flightDir, "flight-recorder", "",
		"keep the last seconds of this node's Go execution trace in memory and write them into this directory at each stall (go tool trace reads them; docs/OPERATIONS.md); empty: off")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on --http-addr (off by default: it exposes internals)")
	etcdEndpoints := fs.String("etcd-endpoints", "", "etcd client URLs, comma-separated; the leader exports the OpLog there (empty: no export)")
	fs.StringVar(&cfg.Etcd.Prefix, "etcd-prefix", "mooncake-store", "prefix of every moonraft key in etcd")
	fs.IntVar(&cfg.Etcd.MaxTxnOps, "etcd-max-txn-ops", 128, "etcd's --max-txn-ops: an export transaction writes this many operations at most")
	fs.BoolVar(&cfg.ExportRenewals, "etcd-export-renewals", cfg.ExportRenewals, "write lease renewals to etcd once a second")
	fs.DurationVar(&cfg.ExportLinger, "etcd-export-linger", cfg.ExportLinger, "under load, how long an OpLog entry may wait for a fuller etcd transaction (0: none)")
	fs.Uint64Var(&cfg.OplogRetain, "oplog-retain", cfg.OplogRetain, "OpLog entries kept in etcd behind the last snapshot")
	fs.Uint64Var(&cfg.Params.ExportRingCap, "export-ring", cfg.Params.ExportRingCap, "OpLog entries held while etcd is unreachable before writes are refused (the export's hard bound)")
	fs.Uint64Var(&cfg.ExportSoftEntries, "export-soft-entries", cfg.ExportSoftEntries, "OpLog entries etcd has not taken past which client writes are paced to etcd's rate")
	fs.DurationVar(&cfg.ExportSoftAge, "export-soft-age", cfg.ExportSoftAge, "age of the oldest OpLog entry etcd has not taken past which client writes are paced to etcd's rate")
	etcdCert := fs.String("etcd-cert", "", "client certificate for etcd (PEM; default --tls-cert when an etcd endpoint is https://)")
	etcdKey := fs.String("etcd-key", "", "client key for etcd (PEM; default --tls-key likewise)")
	etcdCA := fs.String("etcd-ca", "", "CA that signed etcd's server certificate (PEM; default --tls-ca likewise)")
	fs.StringVar(&cfg.TLS.Cert, "tls-cert", "", "this node's certificate (PEM) for gRPC and Raft, server and client usage; turns TLS on")
	fs.StringVar(&cfg.TLS.Key, "tls-key", "", "the private key of --tls-cert (PEM)")
	fs.StringVar(&cfg.TLS.CA, "tls-ca", "", "CA bundle (PEM) that signs peers' and clients' certificates; requires mutual TLS on gRPC and Raft")
	fs.StringVar(&cfg.TLS.ServerName, "tls-server-name", "", "name to verify in peers' certificates instead of the address dialled (e.g. one name shared by all nodes)")
	fs.BoolVar(&cfg.HTTPTLS, "http-tls", false, "serve --http-addr over TLS with --tls-cert (client certificates checked if presented, not required)")
	tokenFile := fs.String("admin-token-file", "", "file holding the token admin RPCs must carry (members, leadership, snapshots, RemoveAll); empty: no admin auth")
	fs.IntVar(&cfg.Limits.MaxMessageBytes, "max-message-bytes", moonraftpb.MaxMessageBytes, "largest gRPC message accepted or sent (at least 2 MiB)")
	fs.IntVar(&cfg.Limits.MaxBatch, "max-batch", transport.MaxBatch, "most keys or items in one batch RPC")
	fs.IntVar(&cfg.Limits.MaxRegexLen, "max-regex-len", 4096, "longest regex of GetReplicaListByRegex and RemoveByRegex (at most 4096)")
	fs.IntVar(&cfg.Limits.MaxInFlightPerClient, "max-in-flight-per-client", transport.DefaultMaxInFlightPerClient, "requests one client (client id, else connection) may have in progress at once; -1: no cap")
	fs.IntVar(&cfg.MooncakeLoops, "mooncake-loops", 0,
		"event loops serving --mooncake-addr, each given a P of its own (docs/OPERATIONS.md); 0: one per two CPUs Go may use ($GOMAXPROCS), at least one; -1: a goroutine per connection")
	fs.DurationVar(&o.mooncakeDrain, "mooncake-drain", 3*time.Second,
		"on SIGTERM, a leader that handed over keeps answering its Mooncake clients (forwarding) until none has called for 300 ms, at most this long (0: close at once; docs/OPERATIONS.md)")
	fs.IntVar(&o.gcPercent, "gc-percent", defaultGCPercent(os.Getenv("GOGC")),
		"Go's GOGC: the heap may grow this many percent over the live heap before a collection (-1: off); higher spends memory to save CPU per write (docs/OPERATIONS.md)")
	fs.Float64Var(&o.heapHeadroom, "heap-headroom", DefaultHeapHeadroom,
		"once the state is large, hold the heap within this fraction of the live heap above it (Go's soft memory limit, set after each collection: the live heap and the runtime's other memory, plus the larger of this fraction of the live heap and 256 MiB); 0: --gc-percent alone; ignored when $GOMEMLIMIT is set (docs/OPERATIONS.md)")
	fs.IntVar(&cfg.MaxPendingWrites, "max-pending-writes", node.DefaultMaxPendingWrites, "client writes this node may have waiting for the log at once; past it a write is refused with TOO_MANY_REQUESTS; -1: no bound")
	dev := fs.Bool("dev", false, "one-node cluster with an embedded etcd in a temporary directory, for trying moonraft out")
	followEtcd := fs.Bool("follow-etcd", false, "run a read-only observer that follows the OpLog in etcd instead of a Raft node")
	followSnapshot := fs.String("snapshot", "", "with --follow-etcd: start from this snapshot file instead of seq 1")
	return fs, configFile, func() error {
		return o.finish(finishArgs{peers: *peers, raftDial: *raftDial, leaseTTL: *leaseTTL, softPinTTL: *softPinTTL,
			clientTTL: *clientTTL, highWatermark: *highWatermark, evictionRatio: *evictionRatio, logLevel: *logLevel, etcdEndpoints: *etcdEndpoints,
			etcdCert: *etcdCert, etcdKey: *etcdKey, etcdCA: *etcdCA, tokenFile: *tokenFile, dev: *dev, followEtcd: *followEtcd, followSnapshot: *followSnapshot,
			readMode: *readMode, logStore: *logStore, walSegmentMB: *walSegmentMB})
	}
}

// finishArgs are the flags that need converting into the configuration.
type finishArgs struct {
	peers, raftDial                 string
	leaseTTL, softPinTTL, clientTTL time.Duration
	highWatermark, evictionRatio    float64
	logLevel, etcdEndpoints         string
	etcdCert, etcdKey, etcdCA       string
	tokenFile                       string
	dev, followEtcd                 bool
	followSnapshot                  string
	readMode, logStore              string
	walSegmentMB                    int
}

func (o *options) finish(a finishArgs) error {
	cfg := &o.cfg
	o.dev, o.followEtcd, o.followSnapshot = a.dev, a.followEtcd, a.followSnapshot
	cfg.ReadMode = node.ReadMode(a.readMode)
	ls, err := raftstore.ParseLogStore(a.logStore)
	if err != nil {
		return err
	}
	cfg.RaftLogStore = ls
	if o.mooncakeDrain < 0 {
		return errcode.New(errcode.InvalidParams, "--mooncake-drain %v: want 0 (close at once) or a positive bound", o.mooncakeDrain)
	}
	if o.flightDir != "" && o.followEtcd {
		return errcode.New(errcode.InvalidParams, "--flight-recorder traces a Raft node's stalls; --follow-etcd runs none")
	}
	if o.heapHeadroom < 0 || math.IsNaN(o.heapHeadroom) {
		return errcode.New(errcode.InvalidParams, "--heap-headroom %g: want 0 (off) or a positive fraction of the live heap", o.heapHeadroom)
	}
	if a.walSegmentMB < 1 || a.walSegmentMB > 1024 {
		return errcode.New(errcode.InvalidParams, "--raft-wal-segment-mb %d: want 1 to 1024", a.walSegmentMB)
	}
	cfg.WALSegmentBytes = a.walSegmentMB << 20
	cfg.Etcd.Endpoints = listflag.Split(a.etcdEndpoints)
	cfg.Etcd.ClusterID = cfg.ClusterID
	// The node's TLS files default the etcd client's when etcd is reached
	// over https:// and no --etcd-* file is given.
	if a.etcdCert == "" && a.etcdKey == "" && a.etcdCA == "" && cfg.TLS.Enabled() && anyHTTPS(cfg.Etcd.Endpoints) {
		a.etcdCert, a.etcdKey, a.etcdCA = cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.CA
	}
	tlsCfg, err := etcdTLS(a.etcdCert, a.etcdKey, a.etcdCA)
	if err != nil {
		return err
	}
	cfg.Etcd.TLS = tlsCfg
	if a.tokenFile != "" {
		if cfg.AdminToken, err = transport.ReadTokenFile(a.tokenFile); err != nil {
			return err
		}
	}
	if cfg.Peers, err = raftstore.ParsePeers(a.peers); err != nil {
		return err
	}
	dials, err := raftstore.ParsePeers(a.raftDial)
	if err != nil {
		return err
	}
	for _, d := range dials {
		if cfg.RaftDial == nil {
			cfg.RaftDial = map[string]string{}
		}
		cfg.RaftDial[d.ID] = d.RaftAddr
	}
	cfg.Params.LeaseTTLMs = a.leaseTTL.Milliseconds()
	cfg.Params.SoftPinTTLMs = a.softPinTTL.Milliseconds()
	cfg.Params.ClientTTLMs = a.clientTTL.Milliseconds()
	cfg.Params.HighWatermarkPPM = uint64(a.highWatermark*1e6 + 0.5)
	cfg.Params.EvictionRatioPPM = uint64(a.evictionRatio*1e6 + 0.5)
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "moonraft", Level: hclog.LevelFromString(a.logLevel)})
	return nil
}

// mooncakeDrainQuiet is how long a stopping leader's Mooncake clients must
// have made no call, once a new leader is known, before it closes: an HA
// client follows the new master_view within milliseconds of its
// publication.
const mooncakeDrainQuiet = 300 * time.Millisecond

// DefaultGCPercent is the node's GOGC unless $GOGC is set. At Go's 100 the
// collector took about a sixth of a node's CPU under puts; 200 cut the CPU
// per put pair by 10–25% (400 did no better) for a peak heap of about three
// times the live one instead of two (docs/OPERATIONS.md "Memory").
const DefaultGCPercent = 200

// DefaultHeapHeadroom is --heap-headroom's default. Without it a leader's
// resident memory was 2.5–3 times its live heap (GOGC 200's room), 1.2
// times mooncake_master's per key at one and three million objects; at 0.5
// it held 0.72× and 0.76× with the fill no slower, since etcd paces it
// (docs/OPERATIONS.md, "Memory"). Its price is CPU once the live heap
// passes 512 MiB: the collector runs as at a GOGC of 50.
const DefaultHeapHeadroom = 0.5

// heapFloor is the headroom a small state keeps whatever its fraction: up
// to a live heap of 128 MiB GOGC's 200 % decides alone.
const heapFloor = 256 << 20

// defaultGCPercent is --gc-percent's default: $GOGC as the Go runtime reads
// it when set ("off" is -1, anything unreadable 100), else
// DefaultGCPercent.
func defaultGCPercent(env string) int {
	switch env {
	case "":
		return DefaultGCPercent
	case "off":
		return -1
	}
	n, err := strconv.Atoi(env)
	if err != nil {
		return 100
	}
	return n
}

// listenConfig is where and how cfg's node serves its clients.
func listenConfig(cfg node.Config) serve.Config {
	return serve.Config{
		GRPCAddr: cfg.GRPCAddr, MooncakeAddr: cfg.MooncakeAddr, HTTPAddr: cfg.HTTPAddr,
		MooncakeLoops: cfg.MooncakeLoops, HTTPTLS: cfg.HTTPTLS, Pprof: cfg.Pprof,
		AdminToken: cfg.AdminToken, Limits: cfg.Limits,
		LeaseTTLMs: uint64(cfg.Params.LeaseTTLMs), LeaderWithin: 2 * cfg.ElectionTimeout,
		Logger: cfg.Logger.With("node", cfg.ID),
	}
}

// mooncakeLoops is the number of the Mooncake protocol's event loops for
// --mooncake-loops n (0: cororpc's default), and gives each loop a P of its
// own unless GOMAXPROCS was set by hand: a loop sleeps in epoll_wait
// holding its P until the runtime's monitor takes it back, and without the
// extra Ps two loops on two CPUs made Get slower. One loop per CPU was not
// reliably faster than the default (master_bench Get, 2026-11-26).
func mooncakeLoops(n int, gomaxprocsSet bool) int {
	if n < 0 {
		return n
	}
	procs := runtime.GOMAXPROCS(0)
	if n == 0 {
		n = cororpc.DefaultLoops()
	}
	if !gomaxprocsSet {
		runtime.GOMAXPROCS(procs + n)
	}
	return n
}

func anyHTTPS(endpoints []string) bool {
	for _, e := range endpoints {
		if strings.HasPrefix(e, "https://") {
			return true
		}
	}
	return false
}

func run(args []string) error {
	if len(args) > 0 {
		switch args[0] {
		case "etcd":
			return runEtcd(args[1:])
		case "migrate-log-store":
			return runMigrateLogStore(args[1:])
		}
	}
	o, err := parseArgs(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg := o.cfg
	debug.SetGCPercent(o.gcPercent)
	if cfg.MooncakeAddr != "" {
		cfg.MooncakeLoops = mooncakeLoops(cfg.MooncakeLoops, os.Getenv("GOMAXPROCS") != "")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if o.heapHeadroom > 0 && os.Getenv("GOMEMLIMIT") == "" {
		var wg sync.WaitGroup
		tctx, stopTuning := context.WithCancel(ctx)
		wg.Go(func() { memlimit.Tune(tctx, o.heapHeadroom, heapFloor, 100*time.Millisecond) })
		defer wg.Wait()
		defer stopTuning()
	}
	if o.followEtcd {
		return follow(ctx, cfg, o.followSnapshot)
	}
	if o.dev {
		cleanup, err := devMode(&cfg)
		if err != nil {
			return err
		}
		defer cleanup()
	}
	if o.flightDir != "" {
		stopRecorder, err := startFlightRecorder(&cfg, o.flightDir)
		if err != nil {
			return err
		}
		defer stopRecorder()
	}
	var lis *serve.Listeners
	cfg.Listen = func(n *node.Node) (func(), error) {
		l, err := serve.Open(n, listenConfig(cfg))
		if err != nil {
			return nil, err
		}
		lis = l
		return l.Stop, nil
	}
	n, err := node.Start(ctx, cfg)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-n.Halted():
		// Nothing to hand over: this node cannot apply what the others do.
		if err := n.Close(); err != nil {
			cfg.Logger.Warn("close after halt", "error", err)
		}
		return n.HaltErr()
	}
	// A stopping leader hands over first so clients see no election gap.
	tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if members, _ := n.Members(tctx); n.IsLeader() && len(members) > 1 {
		if err := n.TransferLeadership(tctx, ""); err != nil {
			cfg.Logger.Warn("leadership transfer before stop failed", "error", err)
		} else {
			// Its Mooncake clients move on the new master_view; until then
			// this node forwards their calls.
			dctx, dcancel := context.WithTimeout(context.Background(), o.mooncakeDrain)
			lis.DrainMooncake(dctx, mooncakeDrainQuiet)
			dcancel()
		}
	}
	if err := n.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// startFlightRecorder runs the process's flight recorder and has the node
// dump it into dir at each stall.
func startFlightRecorder(cfg *node.Config, dir string) (stop func(), err error) {
	log := cfg.Logger
	rec, err := flightrec.Start(dir, "moonraft-"+cfg.ID, func(path string, err error) {
		if err != nil {
			log.Warn("could not write the flight recorder's trace", "error", err)
			return
		}
		log.Info("wrote the flight recorder's trace of the seconds around a stall", "file", path)
	})
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "--flight-recorder %s: %v", dir, err)
	}
	cfg.OnStall = rec.Dump
	return rec.Stop, nil
}
