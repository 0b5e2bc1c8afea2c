// Package localcluster runs moonraft as real processes on loopback, for
// the process-level tests (tests/), the fault suite (tests/jepsen) and
// `moonbench --local`: it builds the binaries, starts an etcd process,
// and lays out the nodes of a bootstrapped cluster — their addresses, data
// dirs and flags. What each caller adds (proxies on the links, extra
// flags, clients) stays with the caller.
package localcluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/freeport"
)

// Build builds pkgs (binary name → package path such as "./cmd/node")
// into dir, with the build tags given and, if race, the race detector. It
// returns each binary's path by name.
func Build(dir string, tags []string, race bool, pkgs map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for name, pkg := range pkgs {
		bin := filepath.Join(dir, name)
		args := []string{"build", "-o", bin}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, ","))
		}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Dir = RepoRoot()
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
		}
		out[name] = bin
	}
	return out, nil
}

// RepoRoot is the module root, found from this file so callers run from
// any directory.
func RepoRoot() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(self)))
}

// Etcd is an etcd in a process of its own: etcdbridge's embedded etcd, run
// by a binary's `etcd` command (`moonraft etcd`, `moonbench etcd`), so it
// shares nothing with the caller's process.
type Etcd struct {
	child.Proc
	URL string // client URL
}

// NewEtcd is bin's etcd with its data in dataDir, on free loopback ports;
// set its LogPath or Output, then start it with Ready.
func NewEtcd(bin, dataDir string) (*Etcd, error) {
	clientURL, err := etcdbridge.FreeLocalURL()
	if err != nil {
		return nil, err
	}
	peerURL, err := etcdbridge.FreeLocalURL()
	if err != nil {
		return nil, err
	}
	e := &Etcd{URL: clientURL, Proc: child.Proc{Bin: bin,
		Args: []string{"etcd", "--data-dir", dataDir, "--listen-client", clientURL, "--listen-peer", peerURL}}}
	return e, nil
}

// Ready starts e (with its LogPath or Output as the caller set them) and
// waits, up to etcdbridge.EmbeddedReadyTimeout, until it answers.
func (e *Etcd) Ready(ctx context.Context) error {
	if err := e.Start(); err != nil {
		return err
	}
	deadline := time.Now().Add(etcdbridge.EmbeddedReadyTimeout)
	for {
		s, err := etcdbridge.Open(etcdbridge.Config{Endpoints: []string{e.URL}, DialTimeout: 2 * time.Second})
		if err == nil {
			return s.Close()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("etcd at %s did not come up: %w", e.URL, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Node is one moonraft process of a bootstrapped cluster.
type Node struct {
	child.Proc
	ID, DataDir                  string
	RaftAddr, GRPCAddr, HTTPAddr string
	MooncakeAddr                 string // "" unless Layout was asked for it
}

// Options lay out a cluster.
type Options struct {
	Nodes  int
	Bin    string // bin/moonraft
	Dir    string // each node's data dir is Dir/<id>
	LogDir string // "": no log files; else each node logs to LogDir/<id>.log
	// Mooncake gives every node a Mooncake protocol address (--mooncake-addr).
	Mooncake bool
}

// Layout allocates the nodes' addresses and sets each one's flags to
// bootstrap the cluster together at the default settings: --id,
// --data-dir, --raft-addr, --grpc-addr, --http-addr, --mooncake-addr if
// asked, --bootstrap and --peers. Callers append their own flags to Args.
func Layout(o Options) ([]*Node, error) {
	var nodes []*Node
	var peers []string
	for i := 0; i < o.Nodes; i++ {
		n := &Node{ID: fmt.Sprintf("n%d", i), Proc: child.Proc{Bin: o.Bin}}
		n.DataDir = filepath.Join(o.Dir, n.ID)
		if o.LogDir != "" {
			n.LogPath = filepath.Join(o.LogDir, n.ID+".log")
		}
		addrs := []*string{&n.RaftAddr, &n.GRPCAddr, &n.HTTPAddr}
		if o.Mooncake {
			addrs = append(addrs, &n.MooncakeAddr)
		}
		for _, a := range addrs {
			var err error
			if *a, err = freeport.Addr(); err != nil {
				return nil, err
			}
		}
		nodes = append(nodes, n)
		peers = append(peers, n.ID+"="+n.RaftAddr)
	}
	for _, n := range nodes {
		n.Args = []string{"--id", n.ID, "--data-dir", n.DataDir,
			"--raft-addr", n.RaftAddr, "--grpc-addr", n.GRPCAddr, "--http-addr", n.HTTPAddr,
			"--bootstrap", "--peers", strings.Join(peers, ",")}
		if n.MooncakeAddr != "" {
			n.Args = append(n.Args, "--mooncake-addr", n.MooncakeAddr)
		}
	}
	return nodes, nil
}

// Endpoints are the nodes' gRPC addresses.
func Endpoints(nodes []*Node) []string {
	eps := make([]string, len(nodes))
	for i, n := range nodes {
		eps[i] = n.GRPCAddr
	}
	return eps
}

// StopAll stops every node still running.
func StopAll(nodes []*Node) {
	ps := make([]*child.Proc, len(nodes))
	for i, n := range nodes {
		ps[i] = &n.Proc
	}
	child.StopAll(10*time.Second, ps...)
}
