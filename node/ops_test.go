package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/transport"
	"github.com/moonraft/moonraft/transport/certgen"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testPKI writes a CA, a node certificate, a client certificate, and the
// bad ones (another CA's, an expired one) into a temporary directory.
type testPKI struct {
	node, client, other, stale transport.TLSFiles
	ca                         string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	ca, err := certgen.NewCA("test CA")
	require.NoError(t, err)
	other, err := certgen.NewCA("other CA")
	require.NoError(t, err)
	p := &testPKI{}
	p.ca, err = ca.WriteCA(dir, false)
	require.NoError(t, err)
	files := func(pair *certgen.Pair, err error) func(string) transport.TLSFiles {
		require.NoError(t, err)
		return func(name string) transport.TLSFiles {
			cert, key, err := pair.Write(dir, name)
			require.NoError(t, err)
			return transport.TLSFiles{Cert: cert, Key: key, CA: p.ca}
		}
	}
	p.node = files(ca.Node("node"))("node")
	p.client = files(ca.Client("client"))("client")
	p.other = files(other.Node("intruder"))("other")
	now := time.Now()
	p.stale = files(ca.Issue(certgen.Options{CommonName: "old", Client: true, Server: true,
		NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)}))("stale")
	return p
}

// TestTLSCluster: three nodes with mutual TLS on gRPC and Raft elect a
// leader, replicate and converge; a fourth joins through gRPC with TLS and
// the admin token. The Raft and gRPC ports refuse a peer or client without
// a certificate, with one of another CA, or with an expired one.
func TestTLSCluster(t *testing.T) {
	p := newTestPKI(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("admin-secret\n"), 0o600))
	token, err := transport.ReadTokenFile(tokenFile)
	require.NoError(t, err)
	c := newCluster(t, 3, time.Hour, func(cfg *Config) {
		cfg.TLS = p.node
		cfg.AdminToken = token
		// Handshakes are slow under the race detector: timeouts that keep
		// a loaded test machine from losing the leader mid-join.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = time.Second, time.Second, 500*time.Millisecond
	})
	l := c.leader()
	mountSegments(t, c.nodes[l])
	for i := 0; i < 10; i++ {
		put(t, c.nodes[l], fmt.Sprintf("k%d", i))
	}
	c.converged()

	// Join over TLS: the joining node's AddVoter carries the token.
	cfg := c.cfgs[0]
	cfg.ID, cfg.RaftAddr, cfg.GRPCAddr, cfg.DataDir = "n3", freeAddr(t), freeAddr(t), t.TempDir()
	cfg.Bootstrap, cfg.Peers = false, nil
	cfg.Join = c.cfgs[l].GRPCAddr
	c.cfgs = append(c.cfgs, cfg)
	c.start(3)
	c.converged()
	assert.Equal(t, 10, int(c.nodes[3].Status().Objects))

	// A joiner without the token is refused.
	bad := cfg
	bad.ID, bad.RaftAddr, bad.GRPCAddr, bad.DataDir, bad.AdminToken = "n4", freeAddr(t), freeAddr(t), t.TempDir(), ""
	_, err = Start(context.Background(), bad)
	assert.Equal(t, errcode.PermissionDenied, errcode.Of(err), "%v", err)

	// Raft port: a handshake with a bad certificate fails.
	raftAddr := raft.ServerAddress(c.cfgs[l].RaftAddr)
	for name, files := range map[string]transport.TLSFiles{
		"no certificate": {CA: p.ca}, "another CA": p.other, "expired certificate": p.stale,
	} {
		t.Run("raft/"+name, func(t *testing.T) {
			cc, err := files.ClientConfig()
			require.NoError(t, err)
			conn, err := tls.Dial("tcp", string(raftAddr), cc)
			if err == nil {
				// TLS 1.3: the client finishes first; the server's refusal
				// arrives as an alert on the first read.
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = conn.Write([]byte{0})
				_, err = conn.Read(make([]byte, 1))
				conn.Close()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "tls", "%v", err)
		})
	}
	cc, err := p.node.ClientConfig()
	require.NoError(t, err)
	conn, err := tls.Dial("tcp", string(raftAddr), cc)
	require.NoError(t, err, "a peer with a node certificate completes the handshake")
	conn.Close()

	// gRPC port: the same certificates are refused; the client's is served.
	for name, files := range map[string]transport.TLSFiles{
		"no certificate": {CA: p.ca}, "another CA": p.other, "expired certificate": p.stale, "client": p.client,
	} {
		t.Run("grpc/"+name, func(t *testing.T) {
			tc, err := files.ClientConfig()
			require.NoError(t, err)
			cl, err := client.Dial(client.Config{Endpoints: []string{c.cfgs[l].GRPCAddr}, TLS: tc})
			require.NoError(t, err)
			defer cl.Close()
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, _, err = cl.GetReplicaList(cctx, "k1")
			if name == "client" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(err), "%v", err)
		})
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestReadyzFlipsDuringElection: a follower's /readyz answers 200 while it
// knows a leader, 503 once the leader is gone and no new one is known,
// and 200 again after the election.
func TestReadyzFlipsDuringElection(t *testing.T) {
	c := newCluster(t, 3, 100*time.Millisecond, func(cfg *Config) { cfg.HTTPAddr = freeAddr(t) })
	l := c.leader()
	f := (l + 1) % 3
	url := "http://" + c.cfgs[f].HTTPAddr + "/readyz"
	require.Eventually(t, func() bool { code, _ := httpGet(t, url); return code == 200 }, 10*time.Second, 10*time.Millisecond)

	// Until the election the follower's /readyz is polled as fast as
	// possible, so the 503 window (an election timeout at least) is seen.
	saw503 := make(chan string, 1)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if code, body := httpGet(t, url); code == http.StatusServiceUnavailable {
				saw503 <- body
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	c.stop(l)
	select {
	case body := <-saw503:
		assert.Contains(t, body, "not ready")
	case <-time.After(10 * time.Second):
		close(stop)
		t.Fatal("/readyz never answered 503 after the leader stopped")
	}
	nl := c.leader()
	require.NotEqual(t, l, nl)
	require.Eventually(t, func() bool { code, _ := httpGet(t, url); return code == 200 }, 10*time.Second, 10*time.Millisecond,
		"/readyz is 200 again once a new leader is known")
	code, _ := httpGet(t, "http://"+c.cfgs[f].HTTPAddr+"/healthz")
	assert.Equal(t, 200, code, "/healthz: the process is up throughout")
}

// TestMetrics: /metrics serves moonraft's own metrics — state, per-segment
// bytes, RPCs by method and code with latency, ticks, evictions, export
// ring, Raft indexes and lag — and hashicorp/raft's, bridged.
func TestMetrics(t *testing.T) {
	c := newCluster(t, 3, 50*time.Millisecond, func(cfg *Config) { cfg.HTTPAddr = freeAddr(t) })
	l := c.leader()
	mountSegments(t, c.nodes[l])
	put(t, c.nodes[l], "k1")
	cl, err := client.Dial(client.Config{Endpoints: []string{c.cfgs[l].GRPCAddr}})
	require.NoError(t, err)
	defer cl.Close()
	_, _, err = cl.GetReplicaList(ctx(t), "k1")
	require.NoError(t, err)
	_, _, err = cl.GetReplicaList(ctx(t), "missing")
	require.Equal(t, errcode.ObjectNotFound, errcode.Of(err))

	var body string
	require.Eventually(t, func() bool {
		var code int
		code, body = httpGet(t, "http://"+c.cfgs[l].HTTPAddr+"/metrics")
		return code == 200 && strings.Contains(body, "moonraft_tick_duration_seconds_count")
	}, 10*time.Second, 50*time.Millisecond)
	for _, want := range []string{
		"moonraft_objects 1",
		"moonraft_segments 3",
		"moonraft_sessions 1",
		`moonraft_segment_used_bytes{client="c1",name="host`,
		`moonraft_segment_capacity_bytes{client="c1",name="host0",segment="s0"} 1.073741824e+09`,
		"moonraft_used_bytes 2048",
		`moonraft_rpc_requests_total{code="OK",method="GetReplicaList"} 1`,
		`moonraft_rpc_requests_total{code="OBJECT_NOT_FOUND",method="GetReplicaList"} 1`,
		`moonraft_rpc_duration_seconds_bucket{method="GetReplicaList"`,
		"moonraft_tick_duration_seconds_bucket",
		"moonraft_evictions_total 0",
		"moonraft_export_ring_entries 0",
		"moonraft_leader 1",
		`moonraft_raft_state{state="leader"} 1`,
		"moonraft_raft_applied_index",
		"moonraft_raft_commit_index",
		"moonraft_follower_lag_seconds",
		"moonraft_raft_last_contact_seconds 0",
		"go_goroutines",
		// hashicorp/raft's own, through go-metrics.
		"moonraft_raft_apply",
		"moonraft_raft_commitTime",
	} {
		assert.Contains(t, body, want)
	}
	appends := regexp.MustCompile(`(?m)^moonraft_raft_log_append_seconds_count (\d+)$`).FindStringSubmatch(body)
	require.NotNil(t, appends, "the log append histogram")
	assert.NotEqual(t, "0", appends[1], "every log write is timed")
	for _, name := range []string{"moonraft_raft_log_appended_bytes_total", "moonraft_raft_log_appended_entries_total"} {
		assert.Positive(t, metricValue(t, body, name), "%s counts what the log was written", name)
	}

	// A snapshot's size, time and moment.
	snapshots := metricValue(t, body, "moonraft_snapshot_write_seconds_count")
	snapSecs := metricValue(t, body, "moonraft_snapshot_write_seconds_sum")
	require.NoError(t, c.nodes[l].raft.Snapshot().Error())
	_, body = httpGet(t, "http://"+c.cfgs[l].HTTPAddr+"/metrics")
	assert.Equal(t, snapshots+1, metricValue(t, body, "moonraft_snapshot_write_seconds_count"))
	// Where its time went: the writer's CPU and the syncs, each within it.
	took := metricValue(t, body, "moonraft_snapshot_write_seconds_sum") - snapSecs
	for _, name := range []string{"moonraft_snapshot_write_cpu_seconds", "moonraft_snapshot_sync_seconds"} {
		v := metricValue(t, body, name)
		assert.Positive(t, v, name)
		assert.LessOrEqual(t, v, took, "%s within the snapshot's %.6f s", name, took)
	}
	assert.Positive(t, metricValue(t, body, "moonraft_snapshot_size_bytes"))
	assert.InDelta(t, float64(time.Now().Unix()), metricValue(t, body, "moonraft_snapshot_last_written_timestamp_seconds"), 60)

	// A follower reports its lag and contact with the leader.
	f := (l + 1) % 3
	var fbody string
	require.Eventually(t, func() bool {
		var code int
		code, fbody = httpGet(t, "http://"+c.cfgs[f].HTTPAddr+"/metrics")
		return code == 200 && strings.Contains(fbody, "moonraft_objects 1")
	}, 10*time.Second, 20*time.Millisecond, "a follower's state metrics match the leader's")
	assert.Contains(t, fbody, "moonraft_leader 0")
	assert.Contains(t, fbody, `moonraft_raft_state{state="follower"} 1`)
	assert.Contains(t, fbody, "moonraft_follower_lag_seconds")
}

// TestEvictionMetric: evictions applied are counted on every node.
func TestEvictionMetric(t *testing.T) {
	c := newCluster(t, 1, time.Hour)
	nd := c.nodes[c.leader()]
	mustPropose(t, nd, &fsm.MountSegment{NowMs: time.Now().UnixMilli(), ClientID: "c1",
		Segment: fsm.SegmentSpec{ID: "s", Name: "s", Base: 0, Size: 100 << 10}})
	for i := 0; i < 99; i++ {
		now := time.Now().UnixMilli()
		mustPropose(t, nd, &fsm.PutStart{NowMs: now, Key: fmt.Sprintf("k%d", i), SliceLengths: []uint64{1 << 10}, ReplicaNum: 1, ClientID: "c1"})
		mustPropose(t, nd, &fsm.PutEnd{NowMs: now, Key: fmt.Sprintf("k%d", i), ClientID: "c1"})
	}
	// Past the read leases (5 s), within the client TTL (10 s), a tick
	// evicts: used is over the 95% watermark.
	r := mustPropose(t, nd, &fsm.Tick{NowMs: time.Now().UnixMilli() + 6_000, Evict: true})
	require.NotZero(t, r.Evicted)
	assert.Equal(t, r.Evicted, nd.sm.evicted.Load())
}

// metricValue is the value of the unlabelled sample name in a /metrics body.
func metricValue(t *testing.T, body, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	require.NotNil(t, m, "no %s in /metrics", name)
	v, err := strconv.ParseFloat(m[1], 64)
	require.NoError(t, err)
	return v
}
