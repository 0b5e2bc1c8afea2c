package main

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/node"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "moonraft.hcl")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
	return p
}

// TestConfigFileAndFlags: values come from the file, flags given on the
// command line win, underscores stand for hyphens, lists become comma
// lists, and defaults stay for keys the file leaves out.
func TestConfigFileAndFlags(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(token, []byte("tok\n"), 0o600))
	cfgFile := writeConfig(t, `
# a comment
id        = "n0"
data-dir  = "/tmp/file-dir"
raft-addr = "10.0.0.1:7200"
grpc_addr = "10.0.0.1:7100"
bootstrap = true
peers     = ["n0=10.0.0.1:7200", "n1=10.0.0.2:7200"]
tick      = "50ms"
max-batch = 100
high-watermark = 0.9
admin-token-file = "`+token+`"
`)
	o, err := parseArgs([]string{"--config", cfgFile, "--raft-addr", "10.0.0.9:7200", "--tick=20ms", "--bootstrap=false"})
	require.NoError(t, err)
	c := o.cfg
	assert.Equal(t, "n0", c.ID, "from the file")
	assert.Equal(t, "/tmp/file-dir", c.DataDir)
	assert.Equal(t, "10.0.0.1:7100", c.GRPCAddr, "grpc_addr is grpc-addr")
	assert.Equal(t, []raftstore.Peer{{ID: "n0", RaftAddr: "10.0.0.1:7200"}, {ID: "n1", RaftAddr: "10.0.0.2:7200"}}, c.Peers)
	assert.Equal(t, 100, c.Limits.MaxBatch)
	assert.Equal(t, uint64(900_000), c.Params.HighWatermarkPPM)
	assert.Equal(t, "tok", c.AdminToken)
	assert.Equal(t, "10.0.0.9:7200", c.RaftAddr, "the flag wins")
	assert.Equal(t, 20*time.Millisecond, c.Tick, "the flag wins")
	assert.False(t, c.Bootstrap, "an explicit false flag wins over the file's true")
	assert.Equal(t, node.DefaultConfig().SnapshotThreshold, c.SnapshotThreshold, "defaults stay")
	assert.Equal(t, "mooncake-store", c.Etcd.Prefix)
}

func TestConfigFileErrors(t *testing.T) {
	tests := []struct {
		name, text string
		want       []string
	}{
		{"unknown key", "id = \"n0\"\nraft-adress = \"x\"\n", []string{`key "raft-adress"`, "line 2", "unknown key"}},
		{"unknown key with underscores", "data_dirr = \"/x\"\n", []string{`key "data_dirr"`, "unknown key"}},
		{"block", "raft-addr {\n  host = \"a\"\n}\n", []string{`key "raft-addr"`, "blocks"}},
		{"labelled block", "raft \"x\" {\n}\n", []string{`key "raft"`, "blocks"}},
		{"twice", "id = \"a\"\nid = \"b\"\n", []string{`key "id"`, "given twice (first on line 1)"}},
		{"twice with underscore", "data-dir = \"a\"\ndata_dir = \"b\"\n", []string{`key "data_dir"`, "given twice"}},
		{"config in config", "config = \"other.hcl\"\n", []string{`key "config"`}},
		{"bad value", "tick = \"soon\"\n", []string{`key "tick"`, `value "soon"`, "parse error"}},
		{"syntax", "id = \"n0\nraft-addr = 1\n", []string{"config file"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseArgs([]string{"--config", writeConfig(t, tt.text)})
			require.Error(t, err)
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	_, err := parseArgs([]string{"--config", filepath.Join(t.TempDir(), "missing.hcl")})
	assert.Equal(t, errcode.FileNotFound, errcode.Of(err))
}

// TestMooncakeDrain: --mooncake-drain defaults to 3 s; 0 turns it off and a
// negative bound is refused with a message naming the flag.
func TestMooncakeDrain(t *testing.T) {
	o, err := parseArgs([]string{"--id", "n0", "--data-dir", t.TempDir()})
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, o.mooncakeDrain)
	o, err = parseArgs([]string{"--id", "n0", "--data-dir", t.TempDir(), "--mooncake-drain", "0"})
	require.NoError(t, err)
	assert.Zero(t, o.mooncakeDrain)
	_, err = parseArgs([]string{"--id", "n0", "--data-dir", t.TempDir(), "--mooncake-drain", "-1s"})
	require.Error(t, err)
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
	assert.Contains(t, err.Error(), "--mooncake-drain")
}

// TestFlightRecorderNeedsANode: --flight-recorder with --follow-etcd,
// which has no stalls to report, is refused instead of ignored.
func TestFlightRecorderNeedsANode(t *testing.T) {
	_, err := parseArgs([]string{"--follow-etcd", "--etcd-endpoints", "http://127.0.0.1:2379", "--flight-recorder", t.TempDir()})
	require.Error(t, err)
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
	assert.Contains(t, err.Error(), "--flight-recorder")
	o, err := parseArgs([]string{"--id", "n0", "--data-dir", t.TempDir(), "--flight-recorder", t.TempDir()})
	require.NoError(t, err)
	assert.NotEmpty(t, o.flightDir)
}

// TestExampleConfig: docs/moonraft.example.hcl uses only real keys with
// valid values, and shows the snapshot rule's defaults.
func TestExampleConfig(t *testing.T) {
	o := &options{cfg: node.DefaultConfig()}
	fs, _, _ := newFlags(o)
	require.NoError(t, applyConfigFile(fs, "../../docs/moonraft.example.hcl", nil))
	assert.Equal(t, "n0", o.cfg.ID)
	assert.Equal(t, "10.0.0.1:7200", o.cfg.RaftAddr)
	assert.Equal(t, "/etc/moonraft/tls/ca.pem", o.cfg.TLS.CA)
	assert.Equal(t, 256, o.cfg.Limits.MaxInFlightPerClient)
	assert.Equal(t, 512, o.cfg.MaxPendingWrites)
	assert.Equal(t, "n0=10.0.0.1:7200,n1=10.0.0.2:7200,n2=10.0.0.3:7200", fs.Lookup("peers").Value.String())
	def := node.DefaultConfig()
	assert.Equal(t, def.SnapshotInterval, o.cfg.SnapshotInterval, "the example's snapshot rule is the default's")
	assert.Equal(t, def.SnapshotThreshold, o.cfg.SnapshotThreshold)
	assert.Equal(t, def.SnapshotLogRatio, o.cfg.SnapshotLogRatio)
}

// TestEtcdTLSDefaultsToNodeTLS: with https:// etcd endpoints and no
// --etcd-* files, the etcd client uses the node's TLS files.
func TestEtcdTLSDefaultsToNodeTLS(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeTestCerts(t, dir)
	o, err := parseArgs([]string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--etcd-endpoints", "https://127.0.0.1:2379"})
	require.NoError(t, err)
	require.NotNil(t, o.cfg.Etcd.TLS)
	assert.Len(t, o.cfg.Etcd.TLS.Certificates, 1)
	o, err = parseArgs([]string{"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--etcd-endpoints", "http://127.0.0.1:2379"})
	require.NoError(t, err)
	assert.Nil(t, o.cfg.Etcd.TLS, "plaintext etcd stays plaintext")
}

// --raft-log-store: empty leaves the choice to the data dir, a name is
// passed on, anything else is refused before the node starts.
func TestRaftLogStoreFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want raftstore.LogStore
		err  string
	}{
		{nil, "", ""},
		{[]string{"--raft-log-store", "boltdb"}, raftstore.LogStoreBoltDB, ""},
		{[]string{"--raft-log-store=wal"}, raftstore.LogStoreWAL, ""},
		{[]string{"--raft-log-store", "rocksdb"}, "", "want wal or boltdb"},
	} {
		o, err := parseArgs(append([]string{"--id", "n0", "--data-dir", t.TempDir()}, tc.args...))
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, "%v", tc.args)
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
			continue
		}
		require.NoError(t, err, "%v", tc.args)
		assert.Equal(t, tc.want, o.cfg.RaftLogStore, "%v", tc.args)
	}
}

// TestRaftWALSegmentFlag: --raft-wal-segment-mb sizes new segments in MiB
// (64 by default) and is refused outside 1–1024.
func TestRaftWALSegmentFlag(t *testing.T) {
	o, err := parseArgs([]string{"--id", "n0"})
	require.NoError(t, err)
	assert.Equal(t, 64<<20, o.cfg.WALSegmentBytes)
	o, err = parseArgs([]string{"--id", "n0", "--raft-wal-segment-mb", "1"})
	require.NoError(t, err)
	assert.Equal(t, 1<<20, o.cfg.WALSegmentBytes)
	for _, bad := range []string{"0", "2048"} {
		_, err = parseArgs([]string{"--id", "n0", "--raft-wal-segment-mb", bad})
		assert.Equal(t, errcode.InvalidParams, errcode.Of(err), bad)
	}
}

// TestGCPercent: --gc-percent defaults to DefaultGCPercent unless $GOGC is set, which
// it then follows as the Go runtime reads it; the flag wins over both.
func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int
	}{{"", DefaultGCPercent}, {"off", -1}, {"50", 50}, {"bogus", 100}} {
		assert.Equal(t, tc.want, defaultGCPercent(tc.env), "GOGC=%q", tc.env)
	}
	t.Setenv("GOGC", "")
	o, err := parseArgs([]string{"--id", "n0"})
	require.NoError(t, err)
	assert.Equal(t, DefaultGCPercent, o.gcPercent)
	t.Setenv("GOGC", "150")
	o, err = parseArgs([]string{"--id", "n0"})
	require.NoError(t, err)
	assert.Equal(t, 150, o.gcPercent, "$GOGC when set")
	o, err = parseArgs([]string{"--gc-percent", "-1"})
	require.NoError(t, err)
	assert.Equal(t, -1, o.gcPercent, "the flag wins")
}

// TestHeapHeadroom: --heap-headroom defaults to DefaultHeapHeadroom, 0
// turns it off, and a negative one is refused.
func TestHeapHeadroom(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want float64
		err  bool
	}{
		{[]string{"--id", "n0"}, DefaultHeapHeadroom, false},
		{[]string{"--id", "n0", "--heap-headroom", "0"}, 0, false},
		{[]string{"--id", "n0", "--heap-headroom", "1.5"}, 1.5, false},
		{[]string{"--id", "n0", "--heap-headroom", "-0.1"}, 0, true},
		{[]string{"--id", "n0", "--heap-headroom", "NaN"}, 0, true},
	} {
		o, err := parseArgs(tc.args)
		if tc.err {
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", tc.args)
			continue
		}
		require.NoError(t, err, "%v", tc.args)
		assert.Equal(t, tc.want, o.heapHeadroom, "%v", tc.args)
	}
}

// The Mooncake protocol's event loops default to one per two CPUs Go may
// use (at least one), and each loop gets a P of its own unless GOMAXPROCS
// was set by hand.
func TestMooncakeLoops(t *testing.T) {
	procs := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procs)
	half := max(1, procs/2)
	for _, tc := range []struct {
		name          string
		flag          int
		gomaxprocsSet bool
		wantLoops     int
		wantProcs     int
	}{
		{"default", 0, false, half, procs + half},
		{"given", 3, false, 3, procs + 3},
		{"GOMAXPROCS set by hand", 0, true, half, procs},
		{"no loops", -1, false, -1, procs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(procs)
			assert.Equal(t, tc.wantLoops, mooncakeLoops(tc.flag, tc.gomaxprocsSet))
			assert.Equal(t, tc.wantProcs, runtime.GOMAXPROCS(0))
		})
	}
	o, err := parseArgs([]string{"--id", "n0", "--mooncake-loops", "2"})
	require.NoError(t, err)
	assert.Equal(t, 2, o.cfg.MooncakeLoops)
}
