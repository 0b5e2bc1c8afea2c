//go:build mooncakecapture

package mooncakeapi

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/structpack"
	"github.com/stretchr/testify/require"
)

// mooncakeDir is where the real Mooncake build lives (MOONCAKE_DIR, or the
// shared directory beside the repository).
func mooncakeDir(t testing.TB) string {
	if d := os.Getenv("MOONCAKE_DIR"); d != "" {
		return d
	}
	d, err := filepath.Abs("../../shared/mooncake")
	require.NoError(t, err)
	return d
}

// recorder keeps, per function id, the first few request/response pairs
// seen, matched by connection and sequence number.
type recorder struct {
	mu    sync.Mutex
	keep  int
	reqs  map[string]cororpc.Request // "conn/seq" → request in flight
	pairs map[uint32][][2][]byte
}

func (r *recorder) request(conn int, req cororpc.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs[fmt.Sprintf("%d/%d", conn, req.Header.Seq)] = req
}

func (r *recorder) response(conn int, resp cororpc.Response) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := fmt.Sprintf("%d/%d", conn, resp.Header.Seq)
	req, ok := r.reqs[k]
	if !ok {
		return
	}
	delete(r.reqs, k)
	if len(r.pairs[req.Header.FunctionID]) < r.keep {
		r.pairs[req.Header.FunctionID] = append(r.pairs[req.Header.FunctionID],
			[2][]byte{cororpc.AppendRequest(nil, req), cororpc.AppendResponse(nil, resp)})
	}
}

// proxy forwards connections from l to target, recording every frame.
func proxy(ctx context.Context, t *testing.T, l net.Listener, target string, rec *recorder) {
	var n int
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		n++
		conn := n
		go func() {
			defer c.Close()
			s, err := net.Dial("tcp", target)
			if err != nil {
				t.Errorf("proxy dial: %v", err)
				return
			}
			defer s.Close()
			go func() {
				<-ctx.Done()
				c.Close()
				s.Close()
			}()
			done := make(chan struct{})
			go func() {
				defer close(done)
				br := bufio.NewReader(s)
				for {
					resp, err := cororpc.ReadResponse(br)
					if err != nil {
						c.Close()
						return
					}
					rec.response(conn, resp)
					if _, err := c.Write(cororpc.AppendResponse(nil, resp)); err != nil {
						return
					}
				}
			}()
			br := bufio.NewReader(c)
			for {
				req, err := cororpc.ReadRequest(br)
				if err != nil {
					s.Close()
					break
				}
				rec.request(conn, req)
				if _, err := s.Write(cororpc.AppendRequest(nil, req)); err != nil {
					break
				}
			}
			<-done
		}()
	}
}

// TestCaptureGolden records what the real Mooncake client and benchmark
// exchange with the real master: the ground truth for every byte. Built
// only with the mooncakecapture tag (`make mooncake-golden`): it rewrites
// testdata/golden.txt and needs the real Mooncake build and its Debian
// libraries.
func TestCaptureGolden(t *testing.T) {
	dir := mooncakeDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	masterAddr, err := freeport.Addr()
	require.NoError(t, err)
	metricsAddr, err := freeport.Addr()
	require.NoError(t, err)
	_, mport, _ := net.SplitHostPort(masterAddr)
	_, metricsPort, _ := net.SplitHostPort(metricsAddr)
	master := exec.CommandContext(ctx, filepath.Join(dir, "bin/mooncake_master"), "--rpc_port="+mport,
		"--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1", "--metrics_port="+metricsPort, "--logtostderr")
	master.Stderr = io.Discard
	require.NoError(t, master.Start())
	defer func() { _ = master.Process.Kill(); _ = master.Wait() }()
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", masterAddr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	rec := &recorder{keep: 2, reqs: map[string]cororpc.Request{}, pairs: map[uint32][][2][]byte{}}
	go proxy(ctx, t, l, masterAddr, rec)

	run := func(bin string, args ...string) {
		cmd := exec.CommandContext(ctx, bin, args...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s %v:\n%s", bin, args, out)
		t.Logf("%s %v: %s", filepath.Base(bin), args, lastLine(out))
	}
	run(filepath.Join(dir, "bin/store_c_smoke"), l.Addr().String())
	calls := filepath.Join(t.TempDir(), "calls")
	cc := exec.Command("gcc", "-O2", "-o", calls, "testdata/calls.c", "-I"+filepath.Join(dir, "include"),
		"-L"+filepath.Join(dir, "lib"), "-lmooncake_store", "-Wl,-rpath,"+filepath.Join(dir, "lib"))
	ccOut, err := cc.CombinedOutput()
	require.NoError(t, err, "build testdata/calls.c:\n%s", ccOut)
	run(calls, l.Addr().String())
	for _, op := range []string{"Put", "Get", "BatchPut", "BatchGet"} {
		run(filepath.Join(dir, "bin/master_bench"), "--master_server="+l.Addr().String(), "--operation="+op, "--duration=1",
			"--num_clients=1", "--batch_size=2", "--num_segments=1")
	}
	callUnsent(ctx, t, l.Addr().String())
	time.Sleep(200 * time.Millisecond)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	var b strings.Builder
	b.WriteString("# coro_rpc frames between the real Mooncake master and client (3b5a594 / yalantinglibs 7801bc9),\n")
	b.WriteString("# written by `make mooncake-golden`: per function id, up to two request/response pairs.\n")
	ids := make([]uint32, 0, len(rec.pairs))
	for id := range rec.pairs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		for _, p := range rec.pairs[id] {
			fmt.Fprintf(&b, "req %08x %s\nresp %08x %s\n", id, hex.EncodeToString(p[0]), id, hex.EncodeToString(p[1]))
		}
	}
	require.NoError(t, os.MkdirAll("testdata", 0o755))
	require.NoError(t, os.WriteFile("testdata/golden.txt", []byte(b.String()), 0o644))
	t.Logf("%d function ids recorded", len(ids))
}

// callUnsent makes, with moonraft's encoder, the calls that no client of
// this build sends (the Upsert family, BatchPutRevoke, BatchRemove,
// GetReplicaListByRegex, GracefulUnmountSegment), each where it succeeds.
// coro_rpc checks the type literal of every request, so the master taking
// them is the check of their encoding; its answers are the golden truth.
func callUnsent(ctx context.Context, t *testing.T, addr string) {
	cl, err := cororpc.Dial(ctx, addr, 0)
	require.NoError(t, err)
	defer cl.Close()
	call := func(name string, args, result any) {
		t.Helper()
		body, err := structpack.Marshal(args)
		require.NoError(t, err, name)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		resp, err := cl.Call(cctx, FunctionID(name), body)
		require.NoError(t, err, name)
		require.Equal(t, cororpc.ErrcOK, resp.Header.Errc, "%s: %s", name, resp.Body)
		require.NoError(t, structpack.Unmarshal(resp.Body, result), name)
	}
	ok := func(name string, errs ...structpack.ErrorCode) {
		t.Helper()
		for i, e := range errs {
			require.Zero(t, e, "%s: answer %d is error %d", name, i, e)
		}
	}
	client := UUID{First: 7, Second: 8}
	seg := Segment{ID: UUID{First: 9, Second: 10}, Name: "127.0.0.1:12999", Base: 1 << 40, Size: 64 << 20,
		TEEndpoint: "127.0.0.1:15999", Protocol: "tcp"}
	one := ReplicateConfig{ReplicaNum: 1}
	const tenant = "default" // what the C API sends
	var void Expected[Void]
	var voids []Expected[Void]
	var reps Expected[[]ReplicaDescriptor]
	var batch []Expected[[]ReplicaDescriptor]

	call("MountSegment", MountArgs{Segment: seg, ClientID: client}, &void)
	ok("MountSegment", void.Err)
	for _, key := range []string{"golden/u", "golden/r"} {
		call("UpsertStart", PutStartArgs{ClientID: client, Key: key, SliceLength: 16, Config: one, TenantID: tenant}, &reps)
		ok("UpsertStart", reps.Err)
	}
	call("UpsertEnd", PutEndArgs{ClientID: client, Meta: ObjectMeta{Key: "golden/u"}, TenantID: tenant}, &void)
	ok("UpsertEnd", void.Err)
	call("UpsertRevoke", PutRevokeArgs{ClientID: client, Key: "golden/r", TenantID: tenant}, &void)
	ok("UpsertRevoke", void.Err)
	call("BatchUpsertStart", BatchPutStartArgs{ClientID: client, Keys: []string{"golden/b1", "golden/b2"}, SliceLengths: []uint64{16, 16}, Config: one, TenantID: tenant}, &batch)
	ok("BatchUpsertStart", batch[0].Err, batch[1].Err)
	call("BatchUpsertEnd", BatchUpsertEndArgs{ClientID: client, Metas: []ObjectMeta{{Key: "golden/b1"}}, TenantID: tenant}, &voids)
	ok("BatchUpsertEnd", voids[0].Err)
	call("BatchUpsertRevoke", BatchUpsertRevokeArgs{ClientID: client, Keys: []string{"golden/b2"}, TenantID: tenant}, &voids)
	ok("BatchUpsertRevoke", voids[0].Err)
	call("BatchPutStart", BatchPutStartArgs{ClientID: client, Keys: []string{"golden/p1", "golden/p2"}, SliceLengths: []uint64{16, 16}, Config: one, TenantID: tenant}, &batch)
	ok("BatchPutStart", batch[0].Err, batch[1].Err)
	call("BatchPutRevoke", BatchPutRevokeArgs{ClientID: client, Keys: []string{"golden/p1", "golden/p2"}, TenantID: tenant}, &voids)
	ok("BatchPutRevoke", voids[0].Err, voids[1].Err)
	var byRegex Expected[map[string][]ReplicaDescriptor]
	call("GetReplicaListByRegex", KeyArgs{Key: "^golden/", TenantID: tenant}, &byRegex)
	ok("GetReplicaListByRegex", byRegex.Err)
	require.ElementsMatch(t, []string{"golden/u", "golden/b1"}, slices.Collect(maps.Keys(byRegex.Value)), "the completed upserts")
	call("BatchRemove", BatchRemoveArgs{Keys: []string{"golden/u", "golden/b1"}, Force: true, TenantID: tenant}, &voids)
	ok("BatchRemove", voids[0].Err, voids[1].Err)
	call("GracefulUnmountSegment", GracefulUnmountArgs{SegmentID: seg.ID, ClientID: client}, &void)
	ok("GracefulUnmountSegment", void.Err)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
