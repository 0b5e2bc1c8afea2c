package tests

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/internal/localcluster"
	"github.com/moonraft/moonraft/mooncakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// mooncakeBin returns a binary of the real Mooncake build (MOONCAKE_DIR, or
// ../shared/mooncake beside the repository), failing when it is missing:
// these tests are the proof that unmodified Mooncake clients work.
func mooncakeBin(t *testing.T, name string) string {
	dir := os.Getenv("MOONCAKE_DIR")
	if dir == "" {
		dir = filepath.Join(testsDir(), "..", "..", "shared", "mooncake")
	}
	p := filepath.Join(dir, "bin", name)
	_, err := os.Stat(p)
	require.NoError(t, err, "the real Mooncake build (kvcache-ai/Mooncake 3b5a594) is needed: set MOONCAKE_DIR")
	return p
}

// mooncakeDir is the real Mooncake build's directory (bin, lib, python,
// ha/), failing as mooncakeBin does when it is missing.
func mooncakeDir(t *testing.T) string {
	return filepath.Dir(filepath.Dir(mooncakeBin(t, "store_c_smoke")))
}

// testsDir is this package's source directory.
func testsDir() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Dir(self)
}

// runMooncake runs a Mooncake program and returns its output.
func runMooncake(t *testing.T, timeout time.Duration, bin string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	require.NoError(t, err, "%s %v:\n%s", filepath.Base(bin), args, tail(out))
	return string(out)
}

func tail(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// TestMooncakeClients: Mooncake's own C client (the store's C API, its
// transfer engine over TCP) through every node's Mooncake address, and its
// master benchmark through the leader's, unmodified, against a three-node
// cluster.
func TestMooncakeClients(t *testing.T) {
	smoke, bench := mooncakeBin(t, "store_c_smoke"), mooncakeBin(t, "master_bench")
	dir := t.TempDir()
	c := StartCluster(t, dir, 3)
	_, _, leader := c.Serving(30 * time.Second)

	for _, p := range c.Procs { // the leader answers; a follower forwards to it
		out := runMooncake(t, time.Minute, smoke, p.MooncakeAddr)
		assert.Contains(t, out, `get_into n=25 value="hello from store_c_smoke"`, "the bytes read back are the bytes written, through %s", p.ID)
		assert.Contains(t, out, "SMOKE OK", p.ID)
	}

	// The C API's batch exist and removes by regex and of everything, whose
	// frames `make mooncake-golden` captures from the real master.
	calls := buildC(t, filepath.Dir(filepath.Dir(smoke)), filepath.Join("..", "mooncakeapi", "testdata", "calls.c"), filepath.Join(dir, "calls"))
	out := runMooncake(t, time.Minute, calls, c.Procs[(slices.Index(c.Procs, leader)+1)%len(c.Procs)].MooncakeAddr)
	assert.Contains(t, out, "batch_is_exist rc=0 found=1,1,0\nremove_by_regex removed=1\nremove_by_regex (no match) removed=0\nremove_all removed=1\nremove_all (empty) removed=0\nCALLS OK",
		"the same answers as mooncake_master, through a follower")

	for _, op := range []string{"Put", "Get", "BatchPut", "BatchGet"} {
		out := runMooncake(t, time.Minute, bench, "--master_server="+leader.MooncakeAddr, "--operation="+op, "--duration=2")
		assert.Regexp(t, `Operations per second: [1-9]`, out, op)
	}
	logs, err := os.ReadFile(filepath.Join(dir, leader.ID+".log"))
	require.NoError(t, err)
	assert.NotContains(t, string(logs), "mooncake protocol", "no call the leader could not decode or does not serve")
}

// TestMooncakeHAClientFollowsFailover: Mooncake's HA client build, given
// only etcd, finds the leader through the master_view moonraft publishes in
// Mooncake's format, and finds the new one after the leader is killed.
func TestMooncakeHAClientFollowsFailover(t *testing.T) {
	smoke := mooncakeBin(t, filepath.Join("..", "ha", "bin", "store_c_smoke"))
	etcd := startEtcd(t)
	c := StartCluster(t, t.TempDir(), 3, "--etcd-endpoints", etcd, "--client-ttl", "2s")
	ctx, cl, leader := c.Serving(2 * time.Minute)
	viaEtcd := haMaster(etcd)

	waitView(t, etcd, leader.MooncakeAddr)
	start := time.Now()
	haSmoke(t, smoke, viaEtcd)
	t.Logf("an HA client's session (setup, put, get, remove) took %v", time.Since(start).Round(time.Millisecond))
	// The killed client's segment stays until its session expires, as with
	// Mooncake's master: a put placed there would fail to transfer.
	require.Eventually(t, func() bool {
		segs, err := cl.ListSegments(ctx)
		return err == nil && len(segs) == 0
	}, 20*time.Second, 100*time.Millisecond, "the killed client's segment is dropped with its session")

	c.Kill(leader, syscall.SIGKILL)
	killed := time.Now()
	next := c.Leader(ctx, cl)
	require.NotEqual(t, leader.ID, next.ID)
	waitView(t, etcd, next.MooncakeAddr)
	haSmoke(t, smoke, viaEtcd)
	t.Logf("a fresh HA client served %v after the leader was killed", time.Since(killed).Round(time.Millisecond))
}

// haSmoke runs store_c_smoke until it has removed its key, having read back
// what it wrote, and kills it then: the HA client's teardown waits out its
// leader monitor's 30-second watch, which tests nothing of the master.
func haSmoke(t *testing.T, bin, master string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Line-buffered, or stdio holds every line until the process exits.
	cmd := exec.CommandContext(ctx, "stdbuf", "-oL", bin, master)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "remove rc=") {
			break
		}
	}
	got := strings.Join(lines, "\n")
	assert.Contains(t, got, "put rc=0")
	assert.Contains(t, got, `get_into n=25 value="hello from store_c_smoke"`, "the bytes read back are the bytes written")
	assert.Contains(t, got, "remove rc=0")
}

// haMaster is the master address that makes a Mooncake HA client look the
// leader up in etcd: etcd://HOST:PORT, of the first of endpoints.
func haMaster(endpoints string) string {
	return "etcd://" + strings.TrimPrefix(strings.Split(endpoints, ",")[0], "http://")
}

// waitView waits until etcd's master_view (Mooncake's key and format)
// names addr.
func waitView(t *testing.T, endpoints, addr string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, "mooncake-store/mooncake_cluster/master_view")
		return err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == addr
	}, 20*time.Second, 50*time.Millisecond, "master_view names %s", addr)
}

// TestMooncakeClientSurvivesLeaderKill: a Mooncake client (tests/mooncakeloop,
// over the store's C API) keeps putting — through a follower's address, and
// as an HA client given only etcd — while the leader is SIGKILLed, or
// stopped with SIGTERM (a handover);
// afterwards it reads back every put that was acknowledged, through the
// transfer engine, byte for byte, and a call made after the kill has
// succeeded.
func TestMooncakeClientSurvivesLeaderKill(t *testing.T) {
	mcDir := mooncakeDir(t)
	for _, tc := range []struct {
		name, build string // build: the Mooncake build under mcDir ("" or "ha")
		viaEtcd     bool
		sig         syscall.Signal
	}{
		{"through a follower", "", false, syscall.SIGKILL},
		{"as an HA client through etcd", "ha", true, syscall.SIGKILL},
		{"as an HA client, the leader stopped", "ha", true, syscall.SIGTERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			loop := buildLoop(t, filepath.Join(mcDir, tc.build), filepath.Join(dir, "mooncakeloop"))
			etcd := startEtcd(t)
			c := StartCluster(t, dir, 3, "--etcd-endpoints", etcd)
			ctx, cl, leader := c.Serving(2 * time.Minute)
			master := haMaster(etcd)
			if tc.viaEtcd {
				waitView(t, etcd, leader.MooncakeAddr)
			} else {
				for _, p := range c.Procs {
					if p != leader {
						master = p.MooncakeAddr
						break
					}
				}
			}

			cmd := exec.CommandContext(ctx, "stdbuf", "-oL", loop, master, "8")
			var stdout strings.Builder
			cmd.Stdout = &stdout
			require.NoError(t, cmd.Start())
			time.Sleep(3 * time.Second)
			c.Kill(leader, tc.sig)
			require.NotEqual(t, leader.ID, c.Leader(ctx, cl).ID)
			err := cmd.Wait()
			t.Logf("client of %s, leader %s %v at 3 s:\n%s", master, leader.ID, tc.sig, stdout.String())
			require.NoError(t, err)
			assert.Contains(t, stdout.String(), "lost 0\nLOOP OK", "every acknowledged put is read back")
			if tc.sig == syscall.SIGTERM {
				// A planned handover refuses no write: those Raft turned
				// away during it went to the new leader. Only the one put
				// in flight when the leader stepped down may have failed,
				// its outcome unknown.
				assert.LessOrEqual(t, loopFigure(t, stdout.String(), `(?m)^acked \d+ failed (\d+) `), 1, "puts failed across a handover")
			}
			// The run ends ~5 s after the kill: a longest stretch without a
			// successful fresh call under that means one succeeded after it.
			assert.Less(t, loopFigure(t, stdout.String(), `(?m)^fresh_gap (\d+)$`), 5000, "a call made after the leader's kill reached the new leader")
		})
	}
}

// TestStoppingLeaderKeepsItsMooncakeClients: a leader stopped with SIGTERM
// hands over, then keeps its Mooncake connections open, forwarding their
// calls to the new leader, while the client keeps calling; once the client
// is quiet it exits. Closing at once would leave a Mooncake client's next
// call on a closed address, which its connection pool retries for ~4 s.
func TestStoppingLeaderKeepsItsMooncakeClients(t *testing.T) {
	c := StartCluster(t, t.TempDir(), 3)
	ctx, cl, old := c.Serving(time.Minute)
	mc, err := cororpc.Dial(ctx, old.MooncakeAddr, 0)
	require.NoError(t, err)
	defer mc.Close()

	// The client calls every 10 ms until stop; connection errors are kept.
	stop := make(chan struct{})
	done := make(chan []error)
	go func() {
		var errs []error
		for {
			select {
			case <-stop:
				done <- errs
				return
			case <-time.After(10 * time.Millisecond):
			}
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
			if _, err := mc.Call(cctx, mooncakeapi.FunctionID("ServiceReady"), nil); err != nil {
				errs = append(errs, err)
			}
			ccancel()
		}
	}()

	old.Signal(syscall.SIGTERM)
	var next *localcluster.Node
	for next == nil || next == old {
		time.Sleep(20 * time.Millisecond)
		next = c.Leader(ctx, cl)
	}
	time.Sleep(500 * time.Millisecond) // the client still calls the stopping node
	close(stop)
	if errs := <-done; len(errs) > 0 {
		t.Errorf("the stopping leader dropped its client while it kept calling: %d calls failed, the first with %v", len(errs), errs[0])
	}
	require.True(t, old.Wait(15*time.Second), "the stopping leader exits once its client is quiet")
	_, err = mc.Call(ctx, mooncakeapi.FunctionID("ServiceReady"), nil)
	assert.Error(t, err, "and then its connections are closed")
}

// loopFigure is the number that pattern's group matches in the loop's output.
func loopFigure(t *testing.T, out, pattern string) int {
	m := regexp.MustCompile(pattern).FindStringSubmatch(out)
	require.NotNil(t, m, "the loop's output has %s", pattern)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// buildLoop compiles tests/mooncakeloop against the Mooncake build in mc.
func buildLoop(t *testing.T, mc, out string) string {
	return buildC(t, mc, filepath.Join("mooncakeloop", "loop.c"), out)
}

// buildC compiles src (relative to tests/) against the Mooncake build in
// mc's C API.
func buildC(t *testing.T, mc, src, out string) string {
	cc := exec.Command("gcc", "-O2", "-pthread", "-o", out, filepath.Join(testsDir(), src),
		"-I"+filepath.Join(mc, "include"), "-L"+filepath.Join(mc, "lib"), "-lmooncake_store", "-Wl,-rpath,"+filepath.Join(mc, "lib"))
	b, err := cc.CombinedOutput()
	require.NoError(t, err, "build %s against Mooncake's C API:\n%s", src, b)
	return out
}
