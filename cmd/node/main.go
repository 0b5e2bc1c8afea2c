// Command moonraft (built from cmd/node) runs one moonraft server. It only
// parses flags and signals; everything else lives in node/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/node"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "moonraft:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) > 0 && args[0] == "etcd" {
		return runEtcd(args[1:])
	}
	cfg := node.DefaultConfig()
	fs := flag.NewFlagSet("moonraft", flag.ContinueOnError)
	fs.StringVar(&cfg.ID, "id", "", "node id, unique in the cluster (required)")
	fs.StringVar(&cfg.DataDir, "data-dir", "", "directory for the Raft log and snapshots (required)")
	fs.StringVar(&cfg.RaftAddr, "raft-addr", "127.0.0.1:7200", "host:port for Raft traffic, advertised to peers")
	fs.StringVar(&cfg.GRPCAddr, "grpc-addr", "127.0.0.1:7100", "host:port for clients (gRPC)")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", "", "host:port for /healthz, /readyz and /status (empty: off)")
	fs.BoolVar(&cfg.Bootstrap, "bootstrap", false, "form a new cluster from --peers if the data dir is empty")
	peers := fs.String("peers", "", "initial members id=raft-addr,... (identical on every bootstrapping node)")
	raftDial := fs.String("raft-dial", "", "id=host:port,...: dial these peers at these addresses instead of their advertised ones (NAT, proxies)")
	fs.StringVar(&cfg.Join, "join", "", "gRPC address of any member to join through (when the data dir is empty)")
	fs.StringVar(&cfg.ClusterID, "cluster-id", cfg.ClusterID, "cluster id, recorded in snapshots")
	leaseTTL := fs.Duration("lease-ttl", time.Duration(cfg.Params.LeaseTTLMs)*time.Millisecond, "read lease granted by GetReplicaList and ExistKey")
	softPinTTL := fs.Duration("soft-pin-ttl", time.Duration(cfg.Params.SoftPinTTLMs)*time.Millisecond, "soft pin of objects put with soft pin")
	clientTTL := fs.Duration("client-ttl", time.Duration(cfg.Params.ClientTTLMs)*time.Millisecond, "a client's session ends this long after its last ping")
	fs.DurationVar(&cfg.Tick, "tick", cfg.Tick, "how often the leader replicates time, renewals and pings")
	highWatermark := fs.Float64("high-watermark", float64(cfg.Params.HighWatermarkPPM)/1e6, "evict when used/capacity exceeds this")
	evictionRatio := fs.Float64("eviction-ratio", float64(cfg.Params.EvictionRatioPPM)/1e6, "share of capacity each eviction frees")
	fs.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "Raft heartbeat timeout")
	fs.DurationVar(&cfg.ElectionTimeout, "election-timeout", cfg.ElectionTimeout, "Raft election timeout")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "how often Raft checks whether to snapshot")
	fs.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", cfg.SnapshotThreshold, "log entries since the last snapshot that trigger a new one")
	logLevel := fs.String("log-level", "info", "trace, debug, info, warn or error")
	etcdEndpoints := fs.String("etcd-endpoints", "", "etcd client URLs, comma-separated; the leader exports the OpLog there (empty: no export)")
	fs.StringVar(&cfg.Etcd.Prefix, "etcd-prefix", "mooncake-store", "prefix of every moonraft key in etcd")
	fs.IntVar(&cfg.Etcd.MaxTxnOps, "etcd-max-txn-ops", 128, "etcd's --max-txn-ops: an export transaction writes this many operations at most")
	fs.BoolVar(&cfg.ExportRenewals, "etcd-export-renewals", cfg.ExportRenewals, "write lease renewals to etcd once a second")
	fs.Uint64Var(&cfg.OplogRetain, "oplog-retain", cfg.OplogRetain, "OpLog entries kept in etcd behind the last snapshot")
	fs.Uint64Var(&cfg.Params.ExportRingCap, "export-ring", cfg.Params.ExportRingCap, "OpLog entries held while etcd is unreachable before writes are refused")
	etcdCert := fs.String("etcd-cert", "", "client certificate for etcd (PEM)")
	etcdKey := fs.String("etcd-key", "", "client key for etcd (PEM)")
	etcdCA := fs.String("etcd-ca", "", "CA that signed etcd's server certificate (PEM)")
	dev := fs.Bool("dev", false, "one-node cluster with an embedded etcd in a temporary directory, for trying moonraft out")
	followEtcd := fs.Bool("follow-etcd", false, "run a read-only observer that follows the OpLog in etcd instead of a Raft node")
	followSnapshot := fs.String("snapshot", "", "with --follow-etcd: start from this snapshot file instead of seq 1")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Etcd.Endpoints = splitList(*etcdEndpoints)
	cfg.Etcd.ClusterID = cfg.ClusterID
	tlsCfg, err := etcdTLS(*etcdCert, *etcdKey, *etcdCA)
	if err != nil {
		return err
	}
	cfg.Etcd.TLS = tlsCfg
	if cfg.Peers, err = node.ParsePeers(*peers); err != nil {
		return err
	}
	dials, err := node.ParsePeers(*raftDial)
	if err != nil {
		return err
	}
	for _, d := range dials {
		if cfg.RaftDial == nil {
			cfg.RaftDial = map[string]string{}
		}
		cfg.RaftDial[d.ID] = d.RaftAddr
	}
	cfg.Params.LeaseTTLMs = leaseTTL.Milliseconds()
	cfg.Params.SoftPinTTLMs = softPinTTL.Milliseconds()
	cfg.Params.ClientTTLMs = clientTTL.Milliseconds()
	cfg.Params.HighWatermarkPPM = uint64(*highWatermark*1e6 + 0.5)
	cfg.Params.EvictionRatioPPM = uint64(*evictionRatio*1e6 + 0.5)
	if cfg.LeaderLeaseTimeout > cfg.HeartbeatTimeout {
		cfg.LeaderLeaseTimeout = cfg.HeartbeatTimeout
	}
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "moonraft", Level: hclog.LevelFromString(*logLevel)})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *followEtcd {
		return follow(ctx, cfg, *followSnapshot)
	}
	if *dev {
		cleanup, err := devMode(&cfg)
		if err != nil {
			return err
		}
		defer cleanup()
	}
	n, err := node.Start(ctx, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	// A stopping leader hands over first so clients see no election gap.
	tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if members, _ := n.Members(tctx); n.IsLeader() && len(members) > 1 {
		if err := n.TransferLeadership(tctx, ""); err != nil {
			cfg.Logger.Warn("leadership transfer before stop failed", "error", err)
		}
	}
	if err := n.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
