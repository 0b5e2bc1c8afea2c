// Package tests holds moonraft's process-level tests: a harness that builds
// the real binaries and runs a cluster of real processes on loopback.
package tests

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/internal/localcluster"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// built holds bin/moonraft and bin/moonctl, built once for the whole run:
// linking the node takes seconds, and every test starts a cluster.
var built struct {
	once sync.Once
	dir  string // removed by TestMain
	bins map[string]string
	err  error
}

// binaries builds bin/moonraft and bin/moonctl the first time a test asks
// for them.
func binaries(t testing.TB) (moonraft, moonctl string) {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "moonraft-tests-"); built.err != nil {
			return
		}
		built.bins, built.err = localcluster.Build(built.dir, nil, false, map[string]string{"moonraft": "./cmd/node", "moonctl": "./cmd/moonctl"})
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bins["moonraft"], built.bins["moonctl"]
}

// removeBinaries removes what binaries built.
func removeBinaries() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}

// Cluster is n moonraft processes bootstrapped together.
type Cluster struct {
	t     testing.TB
	ctl   string // bin/moonctl
	Procs []*localcluster.Node
}

// StartCluster starts n nodes at the default flags and extra, each serving
// the Mooncake protocol too, their data and logs under dir.
func StartCluster(t testing.TB, dir string, n int, extra ...string) *Cluster {
	bin, ctl := binaries(t)
	nodes, err := localcluster.Layout(localcluster.Options{Nodes: n, Bin: bin, Dir: dir, LogDir: dir, Mooncake: true})
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, ctl: ctl, Procs: nodes}
	for _, p := range c.Procs {
		p.Args = append(p.Args, append([]string{"--log-level", "warn"}, extra...)...)
		c.Start(p)
	}
	t.Cleanup(c.StopAll)
	return c
}

// Start (re)starts p with its original flags and data dir.
func (c *Cluster) Start(p *localcluster.Node) {
	if err := p.Proc.Start(); err != nil {
		c.t.Fatal(err)
	}
}

// Kill sends sig to p and waits for it to exit.
func (c *Cluster) Kill(p *localcluster.Node, sig syscall.Signal) {
	p.Signal(sig)
	if !p.Wait(15 * time.Second) {
		c.t.Fatalf("%s did not exit after %v", p.ID, sig)
	}
}

// StopAll stops every process still running.
func (c *Cluster) StopAll() { localcluster.StopAll(c.Procs) }

// Client dials every node's gRPC address; the client closes when the test
// ends.
func (c *Cluster) Client() *client.Client {
	cl, err := client.Dial(client.Config{Endpoints: c.Endpoints()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// Serving waits for a promoted leader and returns a context that ends
// after timeout (or with the test), a client of every node, and the leader.
func (c *Cluster) Serving(timeout time.Duration) (context.Context, *client.Client, *localcluster.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	c.t.Cleanup(cancel)
	cl := c.Client()
	return ctx, cl, c.Leader(ctx, cl)
}

// Moonctl runs moonctl against every node's gRPC address (a later
// --endpoints wins) and returns its stdout, its stderr and its exit code.
func (c *Cluster) Moonctl(args ...string) (stdout, stderr string, code int) {
	cmd := exec.Command(c.ctl, append([]string{"--endpoints", strings.Join(c.Endpoints(), ",")}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		c.t.Fatalf("moonctl %v: %v", args, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// Endpoints lists every node's gRPC address.
func (c *Cluster) Endpoints() []string { return localcluster.Endpoints(c.Procs) }

// Leader waits for a promoted leader and returns it.
func (c *Cluster) Leader(ctx context.Context, cl *client.Client) *localcluster.Node {
	for {
		for _, p := range c.Procs {
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			st, err := cl.Status(sctx, p.GRPCAddr)
			cancel()
			if err == nil && st.Role == "leader" && st.Promoted {
				return p
			}
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("no leader: %v", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Converged waits until every node reports the same applied index and
// returns their statuses there.
func (c *Cluster) Converged(ctx context.Context, cl *client.Client) []*moonraftpb.NodeStatus {
	for {
		var sts []*moonraftpb.NodeStatus
		same := true
		for _, p := range c.Procs {
			st, err := cl.Status(ctx, p.GRPCAddr)
			if err != nil {
				same = false
				break
			}
			if len(sts) > 0 && st.AppliedIndex != sts[0].AppliedIndex {
				same = false
			}
			sts = append(sts, st)
		}
		if same {
			return sts
		}
		select {
		case <-ctx.Done():
			c.t.Fatalf("nodes did not converge: %v", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
