// Package tests holds moonraft's process-level tests: a harness that builds
// the real binaries and runs a cluster of real processes on loopback.
package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/freeport"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// built holds bin/moonraft and bin/moonctl, built once for the whole run:
// linking the node takes seconds, and every test starts a cluster.
var built struct {
	once              sync.Once
	dir               string // removed by TestMain
	moonraft, moonctl string
	err               error
}

// binaries builds bin/moonraft and bin/moonctl the first time a test asks
// for them.
func binaries(t testing.TB) (moonraft, moonctl string) {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "moonraft-tests-"); built.err != nil {
			return
		}
		_, self, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(self))
		for _, b := range []struct{ out, pkg string }{{"moonraft", "./cmd/node"}, {"moonctl", "./cmd/moonctl"}} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(built.dir, b.out), b.pkg)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				built.err = fmt.Errorf("build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
		built.moonraft, built.moonctl = filepath.Join(built.dir, "moonraft"), filepath.Join(built.dir, "moonctl")
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.moonraft, built.moonctl
}

// removeBinaries removes what binaries built.
func removeBinaries() {
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
}

// Proc is one moonraft process.
type Proc struct {
	child.Proc
	ID, GRPCAddr, RaftAddr string
	MooncakeAddr           string // the Mooncake protocol (--mooncake-addr)
}

// Cluster is n moonraft processes bootstrapped together.
type Cluster struct {
	t     testing.TB
	ctl   string // bin/moonctl
	Procs []*Proc
}

func freePort(t testing.TB) string {
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// StartCluster starts n nodes at the default flags and extra, their data
// and logs under dir.
func StartCluster(t testing.TB, dir string, n int, extra ...string) *Cluster {
	bin, ctl := binaries(t)
	c := &Cluster{t: t, ctl: ctl}
	var peers []string
	for i := 0; i < n; i++ {
		p := &Proc{ID: fmt.Sprintf("n%d", i), GRPCAddr: freePort(t), RaftAddr: freePort(t), MooncakeAddr: freePort(t),
			Proc: child.Proc{Bin: bin, LogPath: filepath.Join(dir, fmt.Sprintf("n%d.log", i))}}
		c.Procs = append(c.Procs, p)
		peers = append(peers, p.ID+"="+p.RaftAddr)
	}
	for _, p := range c.Procs {
		p.Args = append([]string{"--id", p.ID, "--data-dir", filepath.Join(dir, p.ID),
			"--raft-addr", p.RaftAddr, "--grpc-addr", p.GRPCAddr, "--mooncake-addr", p.MooncakeAddr,
			"--bootstrap", "--peers", strings.Join(peers, ","), "--log-level", "warn"}, extra...)
		c.Start(p)
	}
	t.Cleanup(c.StopAll)
	return c
}

// Start (re)starts p with its original flags and data dir.
func (c *Cluster) Start(p *Proc) {
	if err := p.Proc.Start(); err != nil {
		c.t.Fatal(err)
	}
}

// Kill sends sig to p and waits for it to exit.
func (c *Cluster) Kill(p *Proc, sig syscall.Signal) {
	p.Signal(sig)
	if !p.Wait(15 * time.Second) {
		c.t.Fatalf("%s did not exit after %v", p.ID, sig)
	}
}

// StopAll stops every process still running.
func (c *Cluster) StopAll() {
	var ps []*child.Proc
	for _, p := range c.Procs {
		ps = append(ps, &p.Proc)
	}
	child.StopAll(10*time.Second, ps...)
}

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
func (c *Cluster) Serving(timeout time.Duration) (context.Context, *client.Client, *Proc) {
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
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, p := range c.Procs {
		out = append(out, p.GRPCAddr)
	}
	return out
}

// Leader waits for a promoted leader and returns it.
func (c *Cluster) Leader(ctx context.Context, cl *client.Client) *Proc {
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
