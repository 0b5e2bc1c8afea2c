package tests

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/internal/localcluster"
)

// TestStallsLeaveTraces: a leadership handed over is no stall; a leader
// stopped (SIGSTOP) until another is elected reports, once it runs again,
// that its goroutines waited and that it lost the leadership,
// its followers report their leader went silent, and with
// --flight-recorder each writes the trace of the seconds before.
func TestStallsLeaveTraces(t *testing.T) {
	dir := t.TempDir()
	traces := filepath.Join(dir, "traces")
	// Timeouts long enough that a loaded CI machine elects nobody unasked.
	c := StartCluster(t, dir, 3, "--flight-recorder", traces, "--heartbeat-timeout", "1s", "--election-timeout", "1s")
	ctx, cl, leader := c.Serving(time.Minute)

	_, stderr, code := c.Moonctl("leader", "transfer")
	require.Zero(t, code, stderr)
	leader = c.Leader(ctx, cl)
	for _, p := range c.Procs {
		for _, kind := range []string{"leadership-lost", "leader-silent"} {
			assert.Zero(t, stalls(ctx, t, p, kind), "%s: a handover counted as %s", p.ID, kind)
		}
	}

	// Stopped until another node leads: a follower's first pre-vote can be
	// refused by the other, which still knows the leader, and a leader
	// that runs again before anyone is elected keeps the lead.
	leader.Signal(syscall.SIGSTOP)
	require.Eventually(t, func() bool { s, err := leader.Stopped(); return err == nil && s }, 5*time.Second, 5*time.Millisecond,
		"the leader's threads stop")
	if next := c.Leader(ctx, cl); next == leader {
		t.Fatal("the stopped leader answered as leader")
	}
	leader.Signal(syscall.SIGCONT)
	assert.Eventually(t, func() bool {
		return stalls(ctx, t, leader, "sched") > 0 && stalls(ctx, t, leader, "leadership-lost") > 0
	}, 10*time.Second, 50*time.Millisecond, "the stopped leader reports its stall and its lost leadership")
	if t.Failed() {
		for _, p := range c.Procs {
			b, _ := os.ReadFile(p.LogPath)
			t.Logf("%s (stopped %v):\n%s", p.ID, p == leader, b)
		}
	}
	silent := 0
	for _, p := range c.Procs {
		if p != leader && stalls(ctx, t, p, "leader-silent") > 0 {
			silent++
			requireTrace(t, traces, p.ID, "leader-silent")
		}
	}
	assert.Positive(t, silent, "a follower stood for election after its leader went silent")
	requireTrace(t, traces, leader.ID, "*")
}

// stalls reads p's moonraft_stalls_total of kind (0 before the first).
func stalls(ctx context.Context, t *testing.T, p *localcluster.Node, kind string) float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.HTTPAddr+"/metrics", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(fmt.Sprintf(`(?m)^moonraft_stalls_total\{kind="%s"\} (\S+)$`, regexp.QuoteMeta(kind))).FindSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}

// requireTrace checks that node id writes a trace of a stall of kind (a
// glob) into dir within a few seconds (a file is written flightrec.Delay
// after its stall), and that it is a Go execution trace.
func requireTrace(t *testing.T, dir, id, kind string) {
	t.Helper()
	var files []string
	require.Eventually(t, func() bool {
		files, _ = filepath.Glob(filepath.Join(dir, "moonraft-"+id+"-*-"+kind+".trace"))
		return len(files) > 0
	}, 10*time.Second, 100*time.Millisecond, "%s wrote no %s trace into %s", id, kind, dir)
	b, err := os.ReadFile(files[0])
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(b, []byte("go 1.")), "%s is a Go execution trace", files[0])
	assert.Greater(t, len(b), 1000, "%s holds events", files[0])
}
