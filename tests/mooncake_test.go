package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moonraft/moonraft/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mooncakeBin returns a binary of the real Mooncake build (MOONCAKE_DIR, or
// ../shared/mooncake beside the repository), failing when it is missing:
// these tests are the proof that unmodified Mooncake clients work.
func mooncakeBin(t *testing.T, name string) string {
	dir := os.Getenv("MOONCAKE_DIR")
	if dir == "" {
		_, self, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(filepath.Dir(self)), "..", "shared", "mooncake")
	}
	p := filepath.Join(dir, "bin", name)
	_, err := os.Stat(p)
	require.NoError(t, err, "the real Mooncake build (kvcache-ai/Mooncake 3b5a594) is needed: set MOONCAKE_DIR")
	return p
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
// transfer engine over TCP) and master benchmark, unmodified, against a
// three-node cluster through the leader's Mooncake address.
func TestMooncakeClients(t *testing.T) {
	smoke, bench := mooncakeBin(t, "store_c_smoke"), mooncakeBin(t, "master_bench")
	dir := t.TempDir()
	bin, _ := Binaries(t, dir)
	c := StartCluster(t, bin, dir, 3, "--heartbeat-timeout", "300ms", "--election-timeout", "300ms")
	cl, err := transport.Dial(transport.ClientConfig{Endpoints: c.Endpoints()})
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leader := c.Leader(ctx, cl)

	out := runMooncake(t, time.Minute, smoke, leader.MooncakeAddr)
	assert.Contains(t, out, `get_into n=25 value="hello from store_c_smoke"`, "the bytes read back are the bytes written")
	assert.Contains(t, out, "SMOKE OK")

	for _, op := range []string{"Put", "Get", "BatchPut", "BatchGet"} {
		out := runMooncake(t, time.Minute, bench, "--master_server="+leader.MooncakeAddr, "--operation="+op, "--duration=2")
		assert.Regexp(t, `Operations per second: [1-9]`, out, op)
	}
	logs, err := os.ReadFile(filepath.Join(dir, leader.ID+".log"))
	require.NoError(t, err)
	assert.NotContains(t, string(logs), "mooncake protocol", "no call the leader could not decode or does not serve")
}
