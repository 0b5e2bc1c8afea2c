package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/localcluster"
)

// cmdEtcd is the command under which this binary runs a system's etcd.
const cmdEtcd = "etcd"

// runEtcdProcess serves an embedded etcd (etcdbridge's, as moonraft's own
// `moonraft etcd`) until signalled.
func runEtcdProcess(args []string) error {
	fs := flag.NewFlagSet("moonbench "+cmdEtcd, flag.ContinueOnError)
	dir := fs.String("data-dir", "", "etcd data directory")
	clientURL := fs.String("listen-client", "", "client URL")
	peerURL := fs.String("listen-peer", "", "peer URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	e, err := etcdbridge.StartEmbedded(*dir, *clientURL, *peerURL)
	if err != nil {
		return err
	}
	defer e.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		return err
	}
}

// etcdProc is a system's own etcd, in a process of its own: its /metrics
// count only that system's load while the other systems of the run stay up
// beside it (embedded etcds in one process would share one set of
// counters).
type etcdProc struct {
	*localcluster.Etcd
	http *http.Client
}

// startEtcd starts an etcd with its data under dir and waits until it
// answers.
func startEtcd(ctx context.Context, cfg config, dir string) (*etcdProc, error) {
	e, err := localcluster.NewEtcd(cfg.benchBin, filepath.Join(dir, "etcd"))
	if err != nil {
		return nil, err
	}
	if cfg.verbose {
		e.Output = os.Stderr
	}
	ep := &etcdProc{Etcd: e, http: &http.Client{Timeout: 5 * time.Second}}
	if err := e.Ready(ctx); err != nil {
		ep.close()
		return nil, err
	}
	return ep, nil
}

func (e *etcdProc) endpoints() []string { return []string{e.URL} }

// load reads the etcd's counters: committed proposals (one per write
// transaction or lease grant) and bytes received from clients.
func (e *etcdProc) load(ctx context.Context) (etcdLoad, error) {
	families, err := scrapeMetrics(ctx, e.http, e.URL)
	if err != nil {
		return etcdLoad{}, err
	}
	var l etcdLoad
	sum := func(name string) (float64, bool) {
		mf, ok := families[name]
		var v float64
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		return v, ok
	}
	if l.txns, l.known = sum("etcd_server_proposals_committed_total"); !l.known {
		return l, fmt.Errorf("GET %s/metrics: no etcd_server_proposals_committed_total", e.URL)
	}
	l.bytes, _ = sum("etcd_network_client_grpc_received_bytes_total")
	return l, nil
}

func (e *etcdProc) close() { child.StopAll(10*time.Second, &e.Proc) }
