package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/etcdfollower"
	"github.com/moonraft/moonraft/node"
	"github.com/moonraft/moonraft/raftstore"
)

// etcdTLS builds the etcd client's TLS config from PEM files; nil when none
// is given (plaintext).
func etcdTLS(cert, key, ca string) (*tls.Config, error) {
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, errcode.New(errcode.InvalidParams, "etcd client certificate: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, errcode.New(errcode.FileNotFound, "etcd CA: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, errcode.New(errcode.InvalidParams, "etcd CA %s holds no PEM certificate", ca)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// runEtcd is `moonraft etcd`: a standalone embedded etcd, for `make run` and
// for trying moonraft without installing etcd.
func runEtcd(args []string) error {
	fs := flag.NewFlagSet("moonraft etcd", flag.ContinueOnError)
	dir := fs.String("data-dir", "", "etcd data directory (required)")
	client := fs.String("listen-client", "http://127.0.0.1:2379", "client URL")
	peer := fs.String("listen-peer", "http://127.0.0.1:2380", "peer URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errcode.New(errcode.InvalidParams, "etcd needs --data-dir")
	}
	e, err := etcdbridge.StartEmbedded(*dir, *client, *peer)
	if err != nil {
		return err
	}
	defer e.Close()
	fmt.Printf("embedded etcd serving %s (data in %s)\n", strings.Join(e.Endpoints(), ","), *dir)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return nil
}

// devMode turns cfg into a one-node cluster with an embedded etcd, both in
// a temporary directory removed on exit (as `consul agent -dev` does).
func devMode(cfg *node.Config) (func(), error) {
	dir, err := os.MkdirTemp("", "moonraft-dev-")
	if err != nil {
		return nil, errcode.New(errcode.FileWriteFail, "temporary directory: %v", err)
	}
	e, err := etcdbridge.StartEmbedded(dir+"/etcd", "http://127.0.0.1:2379", "http://127.0.0.1:2380")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if cfg.ID == "" {
		cfg.ID = "dev"
	}
	cfg.DataDir = dir + "/raft"
	cfg.Bootstrap = true
	cfg.Peers = []raftstore.Peer{{ID: cfg.ID, RaftAddr: cfg.RaftAddr}}
	cfg.Etcd.Endpoints = e.Endpoints()
	fmt.Printf("==> moonraft dev mode: one node and an embedded etcd, data in %s (removed on exit)\n", dir)
	fmt.Printf("    gRPC: %s\n    Raft: %s\n    etcd: %s\n", cfg.GRPCAddr, cfg.RaftAddr, strings.Join(e.Endpoints(), ","))
	if cfg.MooncakeAddr != "" {
		fmt.Printf("    Mooncake clients: %s\n", cfg.MooncakeAddr)
	}
	fmt.Printf("    try:  bin/moonctl --endpoints %s status\n", cfg.GRPCAddr)
	return func() {
		e.Close()
		os.RemoveAll(dir)
	}, nil
}

// follow is `moonraft --follow-etcd`: a read-only observer of the OpLog.
func follow(ctx context.Context, cfg node.Config, snapshot string) error {
	if len(cfg.Etcd.Endpoints) == 0 {
		return errcode.New(errcode.InvalidParams, "--follow-etcd needs --etcd-endpoints")
	}
	id := cfg.ID
	if id == "" {
		id = "etcd-follower"
	}
	f, err := etcdfollower.Start(etcdfollower.Config{ID: id, GRPCAddr: cfg.GRPCAddr, Etcd: cfg.Etcd, Snapshot: snapshot,
		TLS: cfg.TLS, Limits: cfg.Limits, Logger: cfg.Logger})
	if err != nil {
		return err
	}
	<-ctx.Done()
	if err := f.Close(); err != nil {
		return err
	}
	return f.Err()
}

// runMigrateLogStore is `moonraft migrate-log-store --data-dir D --to
// wal|boltdb`: it moves a stopped node's Raft log to the other store.
func runMigrateLogStore(args []string) error {
	fs := flag.NewFlagSet("moonraft migrate-log-store", flag.ContinueOnError)
	dir := fs.String("data-dir", "", "data directory of a stopped node (required)")
	to := fs.String("to", "", "the store to move to: wal or boltdb (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ls, err := raftstore.ParseLogStore(*to)
	switch {
	case err != nil:
		return err
	case *dir == "" || ls == "":
		return errcode.New(errcode.InvalidParams, "migrate-log-store needs --data-dir and --to (wal or boltdb)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	n, err := raftstore.MigrateLogStore(ctx, *dir, ls)
	if err != nil {
		return err
	}
	fmt.Printf("moved %d Raft log entries and the node's term and vote in %s to %s\n", n, *dir, ls)
	return nil
}
