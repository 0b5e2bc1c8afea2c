package tests

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// python3 is the interpreter Mooncake's Python module was built for
// (Debian's, Python 3.11; ../shared/mooncake/README.md).
const python3 = "/usr/bin/python3"

// pythonLoop is tests/mooncakepy/loop.py writing through master for 8 s,
// under Debian's python3 with the Mooncake build's module.
func pythonLoop(ctx context.Context, t *testing.T, master string) *exec.Cmd {
	_, err := os.Stat(python3)
	require.NoError(t, err, "Debian's python3 runs Mooncake's Python module (.ci/run installs it)")
	cmd := exec.CommandContext(ctx, python3, filepath.Join(testsDir(), "mooncakepy", "loop.py"), master, "8")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(mooncakeDir(t), "python"))
	return cmd
}

// TestMooncakePythonClient: Mooncake's Python module (mooncake.store, as
// vLLM's and SGLang's connectors use it), unmodified, given a follower's
// address, runs a KV-cache-shaped loop (tests/mooncakepy/loop.py: batches of
// 4–256 KiB blocks through batch_put_from, batch_is_exist, batch_get_into,
// batch_remove) while the leader is SIGKILLed: every acknowledged block it
// kept reads back byte for byte, and a batch is acknowledged after the kill.
func TestMooncakePythonClient(t *testing.T) {
	dir := t.TempDir()
	c := StartCluster(t, dir, 3)
	ctx, cl, leader := c.Serving(2 * time.Minute)
	var master string
	for _, p := range c.Procs {
		if p != leader {
			master = p.MooncakeAddr
			break
		}
	}
	cmd := pythonLoop(ctx, t, master)
	var logs strings.Builder // the Mooncake client's own log, shown on failure
	cmd.Stderr = &logs
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var out strings.Builder
	ready := make(chan struct{})
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			out.WriteString(sc.Text() + "\n")
			if sc.Text() == "READY" {
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
	case <-copied:
		t.Fatalf("the Python client ended before it was set up (%v):\n%s\n%s", cmd.Wait(), out.String(), tail([]byte(logs.String())))
	case <-ctx.Done():
		t.Fatal("the Python client was not set up in time")
	}
	time.Sleep(3 * time.Second)
	c.Kill(leader, syscall.SIGKILL)
	require.NotEqual(t, leader.ID, c.Leader(ctx, cl).ID)
	<-copied
	err = cmd.Wait()
	t.Logf("Python client of %s, leader %s SIGKILLed 3 s into its 8 s:\n%s", master, leader.ID, out.String())
	require.NoError(t, err, "its log ends:\n%s", tail([]byte(logs.String())))
	assert.Contains(t, out.String(), "lost 0 ", "every acknowledged block is read back")
	assert.Contains(t, out.String(), "PY LOOP OK")
	// The loop ends ~5 s after the kill: a longest gap under that means a
	// batch was acknowledged after it.
	assert.Less(t, loopFigure(t, out.String(), `longest_gap_ms (\d+)`), 5000, "a batch was acknowledged after the leader's kill")
}
