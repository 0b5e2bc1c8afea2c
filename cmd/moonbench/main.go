// Command moonbench measures moonraft: throughput and latency of its
// workloads over a sweep of client counts, replication lag, etcd load and
// failover — and, with --baseline raw-etcd-watch, the same workload on the
// source notes' design in the same run, with moonraft/baseline ratios.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moonraft/moonraft/internal/listflag"
)

type config struct {
	endpoints    []string
	local        bool
	moonraftBin  string
	benchBin     string // this binary: the baseline's processes run it
	workloads    []string
	batch        int
	clients      []int
	duration     time.Duration
	warmup       time.Duration
	ops          int
	repeat       int
	keys         int
	failover     int
	failoverStop bool // SIGSTOP the leader instead of SIGKILL
	baselines    []string
	readModes    []string
	logStores    []string
	jsonOut      string
	plotOut      string
	verbose      bool
	profileDir   string
	nodeFlags    []string // with --local: more flags for every node
	fromJSON     string
	watchFor     time.Duration
	scale        []int // object counts to fill to, in turn
	scaleClients int
	scaleKills   int
	scalePings   string // the clients' protocol: scalePingsMooncake or scalePingsGRPC
}

func main() {
	isChild, err := runChild(os.Args[1:])
	if !isChild {
		err = run(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "moonbench:", err)
		os.Exit(1)
	}
}

// runChild runs the processes a local run starts from this binary (a
// baseline's, an etcd, a probe, the scale harness's clients); isChild is
// false for any other command line.
func runChild(args []string) (isChild bool, err error) {
	if len(args) == 0 {
		return false, nil
	}
	switch args[0] {
	case cmdBaselinePrimary, cmdBaselineStandby:
		return true, runBaselineProcess(args[0], args[1:])
	case cmdEtcd:
		return true, runEtcdProcess(args[1:])
	case cmdProbe:
		return true, runProbeProcess(args[1:])
	case cmdClients:
		return true, runClientsProcess(args[1:])
	}
	return false, nil
}

func parse(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("moonbench", flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "gRPC addresses of a running cluster (comma-separated); or use --local")
	fs.BoolVar(&c.local, "local", false, "start an embedded etcd and three moonraft nodes on loopback, torn down at the end")
	self, _ := os.Executable()
	fs.StringVar(&c.moonraftBin, "moonraft-bin", filepath.Join(filepath.Dir(self), "moonraft"), "moonraft binary for --local")
	c.benchBin = self
	workloads := fs.String("workload", "put", "comma-separated: put, get, mixed (90% get), batch-put, batch-get, exist, batch-exist, evict")
	fs.IntVar(&c.batch, "batch", 32, "items per call in the batch workloads")
	clients := fs.String("clients", "1,8,64,256", "concurrency sweep: client counts, comma-separated")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "measured time per step (after warm-up)")
	fs.DurationVar(&c.warmup, "warmup", 2*time.Second, "time per step before measuring")
	fs.IntVar(&c.repeat, "repeat", 1, "measure every step this many times, the systems taking turns; the table shows each column's median (odd counts give a measured median)")
	fs.IntVar(&c.ops, "ops", 0, "measured operations per step instead of --duration (0: use --duration)")
	fs.IntVar(&c.keys, "keys", 10_000, "keys the get workloads read (written first)")
	fs.IntVar(&c.failover, "failover", 0, "kill the leader this many times under a steady write load (--local only)")
	fs.BoolVar(&c.failoverStop, "failover-stop", false, "with --failover: stop the leader (SIGSTOP: its sockets stay open and answer nothing, as a frozen host's) instead of killing it, and resume it once another serves; moonraft only")
	baselines := fs.String("baseline", "", "also run the source notes' design and compare, comma-separated: raw-etcd-watch (answers once its OpLog entry is in etcd), raw-etcd-watch-async (answers first, writes its OpLog in background batches, as the Mooncake master does)")
	readModes := fs.String("read-mode", "", "with --local: the nodes' --read-mode, comma-separated to compare several in one run (lease, quorum; empty: the default)")
	logStores := fs.String("raft-log-store", "", "with --local: the nodes' --raft-log-store, comma-separated to compare several in one run (wal, boltdb; empty: the default)")
	fs.StringVar(&c.jsonOut, "json", "", "write every result to this file as JSON")
	fs.StringVar(&c.plotOut, "plot", "", "draw latency against throughput to this SVG file")
	fs.BoolVar(&c.verbose, "v", false, "show the systems' logs")
	fs.StringVar(&c.fromJSON, "from-json", "", "print the table (and --plot) of a saved --json file instead of running")
	fs.DurationVar(&c.watchFor, "watch", 0, "with --endpoints: sample the leader's OpLog export every second for this long, beside a load run elsewhere (the backlog, etcd's rate, paced writes; --json and --plot save them)")
	scale := fs.String("scale", "", "with --local: fill the cluster to each of these object counts in turn (comma-separated, ascending) and measure memory, snapshots, idle clients, a failover, a restart and a join at each")
	fs.IntVar(&c.scaleClients, "scale-clients", 1000, "with --scale: clients mounted (one segment each) and pinging every second")
	fs.IntVar(&c.scaleKills, "scale-kills", 1, "with --scale: SIGKILL the leader this many times at each size, each once the last old leader has caught up")
	fs.StringVar(&c.scalePings, "scale-pings", scalePingsMooncake, "with --scale: the clients' protocol, for their pings and the writers' puts and removes: mooncake (Mooncake's, each client and writer on its own connection, finding the leader in etcd as Mooncake's HA clients do) or grpc (moonraft's Go client, the pings on one connection, the writes on another)")
	fs.StringVar(&c.profileDir, "profile", "", "with --local: save a CPU profile of every node for every measured step into this directory (with --scale: a heap profile of every node at every size, back-to-back 5 s CPU profiles of every node while they snapshot, and a CPU profile and an execution trace of the survivors of each failover, with a trace of moonbench, and a 5 s CPU profile of the restarted node from when it serves)")
	nodeFlags := fs.String("node-flags", "", "with --local: more flags for every node, space-separated (\"--heap-headroom 1\", say)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.nodeFlags = strings.Fields(*nodeFlags)
	c.endpoints = listflag.Split(*endpoints)
	c.workloads = listflag.Split(*workloads)
	c.readModes = listflag.Split(*readModes)
	for _, m := range c.readModes {
		if m != "lease" && m != "quorum" {
			return c, fmt.Errorf("--read-mode: %q is neither lease nor quorum", m)
		}
	}
	c.logStores = listflag.Split(*logStores)
	for _, m := range c.logStores {
		if m != "wal" && m != "boltdb" {
			return c, fmt.Errorf("--raft-log-store: %q is neither wal nor boltdb", m)
		}
	}
	c.baselines = listflag.Split(*baselines)
	for _, b := range c.baselines {
		if _, ok := baselineModes[b]; !ok {
			return c, fmt.Errorf("--baseline: %q is neither raw-etcd-watch nor raw-etcd-watch-async", b)
		}
	}
	for _, w := range c.workloads {
		if _, ok := workloadByName[w]; !ok {
			return c, fmt.Errorf("unknown workload %q (put, get, mixed, batch-put, batch-get, exist, batch-exist, evict)", w)
		}
	}
	for _, s := range listflag.Split(*clients) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return c, fmt.Errorf("--clients: %q is not a positive number", s)
		}
		c.clients = append(c.clients, n)
	}
	for _, s := range listflag.Split(*scale) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || (len(c.scale) > 0 && n <= c.scale[len(c.scale)-1]) {
			return c, fmt.Errorf("--scale: %q is not a positive count above the one before", s)
		}
		c.scale = append(c.scale, n)
	}
	switch {
	case c.fromJSON != "":
		return c, nil
	case c.watchFor > 0 && len(c.endpoints) == 0:
		return c, fmt.Errorf("--watch needs --endpoints")
	case c.watchFor > 0:
		return c, nil
	case c.local == (len(c.endpoints) > 0):
		return c, fmt.Errorf("give either --endpoints or --local")
	case len(c.baselines) > 0 && !c.local:
		return c, fmt.Errorf("--baseline needs --local (it starts its own etcd and standbys)")
	case len(c.readModes) > 0 && !c.local:
		return c, fmt.Errorf("--read-mode needs --local (it is the nodes' flag)")
	case len(c.logStores) > 0 && !c.local:
		return c, fmt.Errorf("--raft-log-store needs --local (it is the nodes' flag)")
	case len(c.scale) > 0 && !c.local:
		return c, fmt.Errorf("--scale needs --local (it starts, kills and adds nodes)")
	case len(c.scale) > 0 && c.scaleKills < 1:
		return c, fmt.Errorf("--scale-kills must be at least 1")
	case len(c.scale) > 0 && c.scaleClients < scaleWriters:
		return c, fmt.Errorf("--scale-clients must be at least %d", scaleWriters)
	case c.scalePings != scalePingsMooncake && c.scalePings != scalePingsGRPC:
		return c, fmt.Errorf("--scale-pings %q: want %s or %s", c.scalePings, scalePingsMooncake, scalePingsGRPC)
	case c.profileDir != "" && !c.local:
		return c, fmt.Errorf("--profile needs --local")
	case len(c.nodeFlags) > 0 && !c.local:
		return c, fmt.Errorf("--node-flags needs --local")
	case c.failover > 0 && !c.local:
		return c, fmt.Errorf("--failover needs --local (it kills and restarts nodes)")
	case c.failoverStop && c.failover == 0:
		return c, fmt.Errorf("--failover-stop needs --failover")
	case c.failoverStop && len(c.baselines) > 0:
		return c, fmt.Errorf("--failover-stop measures moonraft alone (a baseline's standby is promoted by hand)")
	case c.batch < 1:
		return c, fmt.Errorf("--batch must be positive")
	case c.repeat < 1:
		return c, fmt.Errorf("--repeat must be positive")
	}
	return c, nil
}

// variant is one configuration of the local cluster's nodes ("": the
// node's default).
type variant struct {
	readMode, logStore string
	mooncake           bool // the nodes serve the Mooncake protocol too
}

// variants are the clusters to measure, one after the other: every read
// mode with every log store asked for.
func (c config) variants() []variant {
	modes, stores := c.readModes, c.logStores
	if len(modes) == 0 {
		modes = []string{""}
	}
	if len(stores) == 0 {
		stores = []string{""}
	}
	var vs []variant
	for _, m := range modes {
		for _, s := range stores {
			vs = append(vs, variant{readMode: m, logStore: s})
		}
	}
	return vs
}

func run(args []string) error {
	cfg, err := parse(args)
	if err != nil {
		return err
	}
	if cfg.fromJSON != "" {
		b, err := os.ReadFile(cfg.fromJSON)
		if err != nil {
			return err
		}
		var rep report
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("%s: %w", cfg.fromJSON, err)
		}
		return rep.output(os.Stdout, cfg)
	}
	if cfg.profileDir != "" {
		if err := os.MkdirAll(cfg.profileDir, 0o755); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.watchFor > 0 {
		return watch(ctx, cfg, cfg.watchFor, os.Stdout)
	}
	if len(cfg.scale) > 0 {
		return runScale(ctx, cfg, strings.Join(args, " "))
	}
	rep := &report{Machine: machine(), Date: time.Now().UTC().Format(time.RFC3339), Args: strings.Join(args, " ")}

	// Every system is up for the whole sweep, so that they can take turns
	// at each step; the ones not measured are idle meanwhile.
	var systems []system
	defer func() {
		for _, sys := range systems {
			sys.close()
		}
	}()
	for _, v := range cfg.variants() {
		sys, err := openMoonraft(ctx, cfg, v)
		if err != nil {
			return err
		}
		systems = append(systems, sys)
	}
	for _, mode := range cfg.baselines {
		base, err := openBaseline(ctx, cfg, mode)
		if err != nil {
			return err
		}
		systems = append(systems, base)
	}
	if err := sweep(ctx, cfg, systems, rep); err != nil {
		return err
	}
	if cfg.failover > 0 {
		// The first cluster, alone: the others would only take CPU.
		for _, sys := range systems[1:] {
			sys.close()
		}
		systems = systems[:1]
		f, err := measureFailover(ctx, cfg, systems[0].(*localCluster))
		if err != nil {
			return err
		}
		rep.Failovers = append(rep.Failovers, *f)
		for _, mode := range cfg.baselines {
			if f, err = measureBaselineFailover(ctx, cfg, mode); err != nil {
				return err
			}
			rep.Failovers = append(rep.Failovers, *f)
		}
	}
	return rep.output(os.Stdout, cfg)
}
