package tests

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/internal/localcluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// haproxyConfig fronts the nodes' Mooncake ports with one address, as a
// Kubernetes Service or a DNS name would (docs/OPERATIONS.md "One address
// for every node"). balance first sends every connection to the first
// server that is up, so a test knows which node its client is connected
// to. A server is taken out after two failed /readyz checks 300 ms apart;
// a connection to a dead one that is not yet out is retried on another
// (retries, redispatch).
func haproxyConfig(front string, servers []*localcluster.Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
  maxconn 4096
defaults
  mode tcp
  timeout connect 1s
  timeout client 1h
  timeout server 1h
  retries 3
  option redispatch
frontend mooncake
  bind %s
  default_backend moonraft
backend moonraft
  balance first
  option httpchk GET /readyz
  default-server inter 300ms fall 2 rise 2
`, front)
	for _, p := range servers {
		_, port, _ := net.SplitHostPort(p.HTTPAddr)
		fmt.Fprintf(&b, "  server %s %s check port %s\n", p.ID, p.MooncakeAddr, port)
	}
	return b.String()
}

// haproxyBin is Debian's haproxy, which .ci/run installs (in /usr/sbin,
// which a user's PATH may lack).
func haproxyBin(t *testing.T) string {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/haproxy")
	}
	require.NoError(t, err, "Debian's haproxy fronts the nodes (.ci/run installs it)")
	return bin
}

// startHAProxy runs haproxy in front of servers (the first takes every
// connection while it is up) and returns its address.
func startHAProxy(t *testing.T, dir string, servers []*localcluster.Node) string {
	bin := haproxyBin(t)
	front, err := freeport.Addr()
	require.NoError(t, err)
	cfg := filepath.Join(dir, "haproxy.cfg")
	require.NoError(t, os.WriteFile(cfg, []byte(haproxyConfig(front, servers)), 0o644))
	check := exec.Command(bin, "-c", "-f", cfg)
	out, err := check.CombinedOutput()
	require.NoError(t, err, "haproxy -c:\n%s", out)
	cmd := exec.Command(bin, "-db", "-f", cfg)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", front, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "haproxy listens on %s:\n%s", front, logs.String())
	return front
}

// TestMooncakeClientsBehindBalancer: plain Mooncake clients (not the etcd
// HA build) given only a TCP load balancer's address (haproxy, in front of
// the three nodes' Mooncake ports) keep working, with no etcd at all,
// across a SIGKILL of the node they are connected to, a follower or the
// leader: every acknowledged write reads back, byte for byte, and a write
// succeeds after the kill. The C loop (tests/mooncakeloop, the store's C
// API) and the Python loop (tests/mooncakepy, mooncake.store) run in turn.
func TestMooncakeClientsBehindBalancer(t *testing.T) {
	loopC := buildLoop(t, mooncakeDir(t), filepath.Join(t.TempDir(), "mooncakeloop"))
	for _, tc := range []struct {
		name   string
		leader bool // the node the client is connected to, and killed, is the leader
		python bool
	}{
		{"C client, its node a follower", false, false},
		{"C client, its node the leader", true, false},
		{"Python client, its node a follower", false, true},
		{"Python client, its node the leader", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := StartCluster(t, dir, 3)
			ctx, cl, leader := c.Serving(2 * time.Minute)
			order := []*localcluster.Node{leader}
			for _, p := range c.Procs {
				if p != leader {
					order = append(order, p)
				}
			}
			if !tc.leader {
				order[0], order[1] = order[1], order[0]
			}
			front := startHAProxy(t, dir, order)
			var cmd *exec.Cmd
			if tc.python {
				cmd = pythonLoop(ctx, t, front)
			} else {
				cmd = exec.CommandContext(ctx, "stdbuf", "-oL", loopC, front, "8")
			}
			var stdout, logs strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &logs
			require.NoError(t, cmd.Start())
			time.Sleep(4 * time.Second) // setup, then ~3 s of writes
			c.Kill(order[0], syscall.SIGKILL)
			if tc.leader {
				require.NotEqual(t, leader.ID, c.Leader(ctx, cl).ID)
			}
			err := cmd.Wait()
			t.Logf("client of %s (haproxy; %s first), %s SIGKILLed:\n%s", front, order[0].ID, order[0].ID, stdout.String())
			require.NoError(t, err, "its log ends:\n%s", tail([]byte(logs.String())))
			if tc.python {
				assert.Contains(t, stdout.String(), "lost 0 ", "every acknowledged block is read back")
				assert.Contains(t, stdout.String(), "PY LOOP OK")
				assert.Less(t, loopFigure(t, stdout.String(), `longest_gap_ms (\d+)`), 4000, "a batch was acknowledged after the kill")
			} else {
				assert.Contains(t, stdout.String(), "lost 0\nLOOP OK", "every acknowledged put is read back")
				assert.Less(t, loopFigure(t, stdout.String(), `(?m)^fresh_gap (\d+)$`), 4000, "a call made after the kill succeeded")
			}
		})
	}
}
