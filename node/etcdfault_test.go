package node

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/etcdfollower"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdProxy starts an in-process toxiproxy between the nodes and the
// embedded etcd: a TCP proxy on a free loopback port forwarding to
// upstream (an etcd client URL). Stop cuts etcd off (the listener closes and
// every open connection is reset); Start brings it back on the same port.
func etcdProxy(t *testing.T, upstream string) *toxiproxy.Proxy {
	t.Helper()
	u, err := url.Parse(upstream)
	require.NoError(t, err)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "etcd", "127.0.0.1:0", u.Host)
	require.NoError(t, p.Start())
	t.Cleanup(p.Stop)
	return p
}

// waitExported waits until etcd's latest is the leader's applied seq and
// the leader's ring is empty (its Exported applied): nothing is in flight.
func waitExported(t *testing.T, nd *Node, store *etcdbridge.Store, within time.Duration) uint64 {
	t.Helper()
	var seq uint64
	require.Eventually(t, func() bool {
		st := nd.Status()
		latest, err := store.Latest(context.Background())
		seq = st.AppliedSeq
		return err == nil && latest == seq && st.ExportRingLen == 0
	}, within, 20*time.Millisecond, "the export did not catch up with the applied seq")
	return seq
}

// checkOpLog reads the OpLog from seq 1 and checks it is 1..want with no
// gap or duplicate and every entry verifying; it returns the entries.
func checkOpLog(t *testing.T, store *etcdbridge.Store, want uint64) []oplog.Entry {
	t.Helper()
	recs := readAll(t, store)
	require.Len(t, recs, int(want))
	out := make([]oplog.Entry, 0, len(recs))
	for i, r := range recs {
		require.Equal(t, uint64(i+1), r.Seq, "gap or duplicate at %d", i)
		e, err := oplog.Decode(r.Value)
		require.NoError(t, err)
		require.Equal(t, r.Seq, e.SequenceID)
		require.NoError(t, e.Verify())
		out = append(out, e)
	}
	return out
}

// TestEtcdOutageThroughToxiproxy: etcd cut off behind a toxiproxy. Reads,
// ticks (session extension and expiry) and eviction go on; the ring grows
// to its bound and client writes then fail with ETCD_OPERATION_ERROR; once
// etcd is back the export resumes with no gap and no duplicate, byte-equal
// to what the state machine produced.
func TestEtcdOutageThroughToxiproxy(t *testing.T) {
	const (
		ringCap = 40
		pre     = 10       // objects exported before the outage
		objSize = 16 << 20 // 50 objects: 800 MiB on the 1 GiB segment
	)
	e := testEtcd(t)
	proxy := etcdProxy(t, e.Endpoints[0])
	viaProxy := e
	viaProxy.Endpoints = []string{"http://" + proxy.Listen}
	viaProxy.DialTimeout = 2 * time.Second
	c := newCluster(t, 3, 50*time.Millisecond, withEtcd(viaProxy), func(c *Config) {
		c.ExportRenewals = false
		c.Params.ExportRingCap = ringCap
		c.ExportSoftEntries = ringCap / 2
		c.Params.ClientTTLMs = 3000 // 30 pings of margin
		c.Params.LeaseTTLMs = 100
		c.Params.HighWatermarkPPM = 500_000 // only reached when c2's spare segment goes
	})
	l := c.leader()
	nd := c.nodes[l]
	direct, err := etcdbridge.Open(e) // the test's own view of etcd, around the proxy
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })

	// c1 holds the objects on host0 (1 GiB); c2 adds a spare 16 GiB that
	// keeps usage under the watermark until its session expires.
	mustPropose(t, nd, &fsm.MountSegment{NowMs: time.Now().UnixMilli(), ClientID: "c1",
		Segment: fsm.SegmentSpec{ID: "s0", Name: "host0", Base: 0, Size: 1 << 30}})
	mustPropose(t, nd, &fsm.MountSegment{NowMs: time.Now().UnixMilli(), ClientID: "c2",
		Segment: fsm.SegmentSpec{ID: "s9", Name: "spare", Base: 1 << 40, Size: 16 << 30}})

	// Clients ping as real ones do; only ticks turn pings into extensions.
	var (
		mu     sync.Mutex
		pingC2 = true
		stop   = make(chan struct{})
		done   = make(chan struct{})
	)
	go func() {
		defer close(done)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			pctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = nd.Ping(pctx, "c1")
			mu.Lock()
			p2 := pingC2
			mu.Unlock()
			if p2 {
				_, _ = nd.Ping(pctx, "c2")
			}
			cancel()
		}
	}()
	stopPings := sync.OnceFunc(func() { close(stop); <-done })
	defer stopPings()

	putObj := func(key string) errcode.Code {
		t.Helper()
		now := time.Now().UnixMilli()
		if code := proposeCode(nd, &fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{objSize},
			ReplicaNum: 1, PreferredSegment: "host0", ClientID: "c1"}); code != errcode.OK {
			return code
		}
		mustPropose(t, nd, &fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"})
		return errcode.OK
	}

	for i := 0; i < pre; i++ {
		require.Equal(t, errcode.OK, putObj(fmt.Sprintf("pre%d", i)))
	}
	before := waitExported(t, nd, direct, 10*time.Second)
	require.Equal(t, uint64(pre), before)

	// Cut etcd: nothing is in flight, so exactly ringCap writes fit.
	proxy.Stop()
	var ok int
	for i := 0; i < 10*ringCap; i++ {
		code := putObj(fmt.Sprintf("out%d", i))
		if code != errcode.OK {
			require.Equal(t, errcode.EtcdOperationError, code, "a write past the ring bound")
			break
		}
		ok++
	}
	require.Equal(t, ringCap, ok, "writes accepted while etcd is unreachable: the ring bound")
	st := nd.Status()
	assert.Equal(t, uint64(ringCap), st.ExportRingLen)
	assert.Equal(t, uint64(pre+ringCap), st.AppliedSeq)
	assert.Equal(t, errcode.EtcdOperationError, proposeCode(nd, &fsm.Remove{NowMs: time.Now().UnixMilli(), Key: "pre0", Force: true}),
		"removes are refused too")
	latest, err := direct.Latest(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, before, latest, "nothing reached etcd during the outage")

	// Linearizable reads go on.
	descs, _, err := nd.GetReplicaList(ctx(t), "out0")
	require.NoError(t, err)
	assert.Len(t, descs, 1)
	found, _, err := nd.ExistKey(ctx(t), "pre3")
	require.NoError(t, err)
	assert.True(t, found)

	// Ticks go on: applied index grows, c1's pings keep its session while
	// c2's session, no longer pinged, expires and its spare segment goes.
	idx := nd.Status().AppliedIndex
	require.Eventually(t, func() bool { return nd.Status().AppliedIndex >= idx+5 }, 10*time.Second, 20*time.Millisecond,
		"ticks stopped while etcd is unreachable")
	mu.Lock()
	pingC2 = false
	mu.Unlock()
	// (Pinging c2 here would keep it alive: look at the status instead.)
	require.Eventually(t, func() bool {
		st := nd.Status()
		return st.Sessions == 1 && st.Segments == 1
	}, 10*time.Second, 20*time.Millisecond, "c2's session did not expire")
	remount, err := nd.Ping(ctx(t), "c2")
	require.NoError(t, err)
	assert.True(t, remount, "c2 must remount")
	remount, err = nd.Ping(ctx(t), "c1")
	require.NoError(t, err)
	assert.False(t, remount, "c1's session was kept by ticks applying its pings")

	// Eviction goes on: 800 MiB on the remaining 1 GiB is over the 50%
	// watermark, and its REMOVEs go into the ring past the bound.
	require.Eventually(t, func() bool {
		st := nd.Status()
		return st.CapacityBytes == 1<<30 && 2*st.UsedBytes <= st.CapacityBytes
	}, 10*time.Second, 20*time.Millisecond, "eviction did not run while etcd is unreachable")
	st = nd.Status()
	evicted := pre + ringCap - int(st.Objects)
	assert.Positive(t, evicted)
	assert.Equal(t, uint64(ringCap+evicted), st.ExportRingLen, "evictions are exported past the bound")
	assert.Equal(t, errcode.EtcdOperationError, putObj("refused"), "still full")
	latest, err = direct.Latest(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, before, latest)

	// etcd comes back: the ring drains to etcd, and writes are accepted again.
	require.NoError(t, proxy.Start())
	restored := time.Now()
	waitExported(t, nd, direct, 30*time.Second)
	t.Logf("outage: %d writes accepted, %d objects evicted, ring %d; export drained %v after etcd came back",
		ok, evicted, st.ExportRingLen, time.Since(restored).Round(time.Millisecond))
	require.Equal(t, errcode.OK, putObj("after"))
	final := waitExported(t, nd, direct, 10*time.Second)
	assert.Equal(t, uint64(pre+ringCap+evicted+1), final)

	entries := checkOpLog(t, direct, final)
	puts := map[string]int{}
	var evicts int
	for _, e := range entries {
		switch {
		case e.OpType == oplog.OpPutEnd:
			puts[e.Key]++
		case e.OpType == oplog.OpRemove && e.Source == oplog.SourceEvict:
			evicts++
		}
	}
	assert.Len(t, puts, pre+ringCap+1)
	for k, n := range puts {
		assert.Equal(t, 1, n, "PUT_END of %s exported %d times", k, n)
	}
	assert.Equal(t, evicted, evicts)

	stopPings()
	for i := range c.nodes {
		if c.nodes[i] != nil {
			c.stop(i)
		}
	}
	produced := replayEntries(t, c.cfgs[l].DataDir)
	recs := readAll(t, direct)
	require.Len(t, produced, len(recs))
	for i, e := range produced {
		require.Equal(t, string(e.Encode()), string(recs[i].Value), "entry %d differs from what the FSM produced", i+1)
	}
}

func putEndPayload(size uint64) string {
	return oplog.EncodePutEndPayload(oplog.PutEndPayload{Size: size, Replicas: []oplog.ReplicaDesc{{
		Status:  oplog.ReplicaComplete,
		Buffers: []oplog.BufferDesc{{SegmentID: "s0", SegmentName: "host0", Address: 4096, Size: size}},
	}}})
}

// TestFollowerOverRealEtcd: entries written by hand into etcd in the order
// 1,2,4,3,3,5,7 and, after a gap re-read found 6 missing, 6: the follower
// reorders, drops the duplicate, re-reads the gap and ends at 7 with the
// expected object set. A follower started afterwards reads the same.
func TestFollowerOverRealEtcd(t *testing.T) {
	e := testEtcd(t)
	store, err := etcdbridge.Open(e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	ts := time.Now().UnixMilli()
	entries := map[uint64]oplog.Entry{
		1: oplog.NewEntry(1, ts, oplog.OpPutEnd, "dir/a", putEndPayload(100), 1, oplog.SourceNone),
		2: oplog.NewEntry(2, ts, oplog.OpPutEnd, "dir/b", putEndPayload(200), 1, oplog.SourceNone),
		3: oplog.NewEntry(3, ts, oplog.OpPutEnd, "dir/c", putEndPayload(300), 1, oplog.SourceNone),
		4: oplog.NewEntry(4, ts+1, oplog.OpRemove, "dir/a", "", 2, oplog.SourceRemove),
		5: oplog.NewEntry(5, ts+1, oplog.OpPutEnd, "d", putEndPayload(400), 1, oplog.SourceNone),
		6: oplog.NewEntry(6, ts+2, oplog.OpPutEnd, "dir/a", putEndPayload(500), 3, oplog.SourceNone),
		7: oplog.NewEntry(7, ts+2, oplog.OpRemove, "dir/b", "", 2, oplog.SourceEvict),
	}
	write := func(seq uint64) {
		t.Helper()
		_, err := store.Client().Put(ctx(t), store.EntryKey(seq), string(entries[seq].Encode()))
		require.NoError(t, err)
	}

	f := oplog.NewFollower(oplog.FollowerConfig{Feed: store, GapTimeout: 200 * time.Millisecond})
	rctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- f.Run(rctx) }()
	defer func() {
		cancel()
		assert.NoError(t, <-runErr)
	}()
	write(1)
	require.NoError(t, f.WaitFor(ctx(t), 1))
	// Everything from here is past the catch-up read: it comes through the
	// watch, in the order written.
	for _, seq := range []uint64{2, 4, 3, 3, 5, 7} {
		write(seq)
	}
	require.NoError(t, f.WaitFor(ctx(t), 5))
	// The gap timer fires, the re-read finds no 6 in etcd either, and the
	// follower says so (not fatal) while 7 waits.
	require.Eventually(t, func() bool { return strings.Contains(f.Stats().LastError, "entry 6 is missing") },
		10*time.Second, 10*time.Millisecond, "the gap before 7 was not re-read")
	st := f.Stats()
	assert.Positive(t, st.GapRereads)
	assert.Equal(t, uint64(5), st.AppliedSeq, "7 waits for 6")
	assert.Equal(t, 1, st.Buffered)
	assert.Equal(t, uint64(6), st.WaitingFor)
	_, ok := f.Get("dir/b")
	assert.True(t, ok, "7 (the REMOVE of dir/b) is not applied before 6")
	write(6)
	require.NoError(t, f.WaitFor(ctx(t), 7))

	st = f.Stats()
	assert.Equal(t, uint64(7), st.AppliedSeq)
	assert.Equal(t, 0, st.Buffered)
	assert.GreaterOrEqual(t, st.Duplicates, uint64(1), "the second 3")
	assert.GreaterOrEqual(t, st.Reordered, uint64(2), "4 and 7 came early")
	want := map[string]oplog.ObjectState{
		"dir/a": {Size: 500, KeySeq: 3},
		"dir/c": {Size: 300, KeySeq: 1},
		"d":     {Size: 400, KeySeq: 1},
	}
	assert.Equal(t, len(want), f.Len())
	h := oplog.NewObjectSetHasher()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		o, ok := f.Get(k)
		if assert.True(t, ok, k) {
			assert.Equal(t, want[k].Size, o.Size, k)
			assert.Equal(t, want[k].KeySeq, o.KeySeq, k)
			assert.Equal(t, want[k].Size, o.Payload.Size, k)
		}
		h.Add(k, want[k].Size, want[k].KeySeq)
	}
	_, ok = f.Get("dir/b")
	assert.False(t, ok, "dir/b was removed at 7")
	digest := h.Sum()
	assert.Equal(t, digest, f.ObjectSetDigest())

	// A follower started now reads the same history in one catch-up.
	ef, err := etcdfollower.Start(etcdfollower.Config{ID: "obs", GRPCAddr: freeAddr(t), Etcd: e})
	require.NoError(t, err)
	defer ef.Close()
	require.NoError(t, ef.Follower().WaitFor(ctx(t), 7))
	assert.Equal(t, hex.EncodeToString(digest[:]), ef.Status().ObjectSetDigest)
	assert.NoError(t, ef.Err())

	// It is read-only: writes and admin calls are refused, naming the mode.
	_, err = ef.Propose(ctx(t), &fsm.RemoveAll{NowMs: ts, Force: true})
	assert.Equal(t, errcode.UnavailableInCurrentMode, errcode.Of(err), "%v", err)
	assert.Contains(t, err.Error(), "read-only etcd follower")
	cl, err := client.Dial(client.Config{Endpoints: []string{ef.Status().GRPCAddr}})
	require.NoError(t, err)
	defer cl.Close()
	for _, err := range []error{cl.AddVoter(ctx(t), "x", "127.0.0.1:1", ""), cl.TransferLeadership(ctx(t), ""), cl.SnapshotSave(ctx(t), io.Discard)} {
		assert.Equal(t, errcode.UnavailableInCurrentMode, errcode.Of(err), "%v", err)
		assert.Contains(t, err.Error(), "(etcd-follower) has no Raft group")
	}
}

// TestFollowerRefusesBadChecksum: a follower of a real cluster's export
// stops with CHECKSUM_MISMATCH naming the seq when the next entry in etcd
// carries a wrong checksum, and applies neither it nor anything after it; a
// follower started later stops at an entry edited by hand in the history.
func TestFollowerRefusesBadChecksum(t *testing.T) {
	e := testEtcd(t)
	c := newCluster(t, 3, time.Hour, withEtcd(e), func(c *Config) { c.ExportRenewals = false })
	nd := c.nodes[c.leader()]
	store, err := etcdbridge.Open(e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	mountSegments(t, nd)
	for i := 0; i < 5; i++ {
		put(t, nd, fmt.Sprintf("k%d", i))
	}
	seq := waitExported(t, nd, store, 10*time.Second)
	require.Equal(t, uint64(5), seq)

	ef, err := etcdfollower.Start(etcdfollower.Config{ID: "obs", GRPCAddr: freeAddr(t), Etcd: e})
	require.NoError(t, err)
	defer ef.Close()
	require.NoError(t, ef.Follower().WaitFor(ctx(t), seq))

	// A rogue writer gets seq+1 into etcd before the leader, with a wrong
	// checksum; the leader's fenced write then skips past it.
	bad := oplog.NewEntry(seq+1, time.Now().UnixMilli(), oplog.OpPutEnd, "rogue", putEndPayload(64), 1, oplog.SourceNone)
	bad.Checksum ^= 0x5a5a5a5a
	require.Error(t, bad.Verify())
	require.NoError(t, store.WriteOpLog(ctx(t), bad))
	put(t, nd, "k5") // seq+1 in the cluster: fenced, etcd already has it
	put(t, nd, "k6") // seq+2: exported after the rogue entry
	require.Eventually(t, func() bool {
		l, err := store.Latest(context.Background())
		return err == nil && l == seq+2
	}, 10*time.Second, 10*time.Millisecond)

	require.Eventually(t, func() bool { return ef.Err() != nil }, 10*time.Second, 10*time.Millisecond,
		"the follower did not stop at the bad entry")
	err = ef.Err()
	assert.Equal(t, errcode.ChecksumMismatch, errcode.Of(err), "%v", err)
	assert.Contains(t, err.Error(), fmt.Sprintf("entry %d is bad", seq+1))
	assert.Equal(t, seq, ef.Follower().AppliedSeq(), "the bad entry and those after it are not applied")
	_, ok := ef.Follower().Get("rogue")
	assert.False(t, ok)
	_, ok = ef.Follower().Get("k6")
	assert.False(t, ok)
	assert.Equal(t, err.Error(), ef.Follower().Stats().LastError)
	assert.Equal(t, seq, ef.Status().AppliedSeq)

	// An entry of the history edited by hand: a fresh follower stops there.
	const edited = 3
	recs, _, err := store.ReadOpLogSince(ctx(t), edited-1, 1)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	ent, err := oplog.Decode(recs[0].Value)
	require.NoError(t, err)
	ent.Checksum++
	_, err = store.Client().Put(ctx(t), store.EntryKey(edited), string(ent.Encode()))
	require.NoError(t, err)
	ef2, err := etcdfollower.Start(etcdfollower.Config{ID: "obs2", GRPCAddr: freeAddr(t), Etcd: e})
	require.NoError(t, err)
	defer ef2.Close()
	require.Eventually(t, func() bool { return ef2.Err() != nil }, 10*time.Second, 10*time.Millisecond,
		"the fresh follower did not stop at the edited entry")
	err = ef2.Err()
	assert.Equal(t, errcode.ChecksumMismatch, errcode.Of(err), "%v", err)
	assert.Contains(t, err.Error(), fmt.Sprintf("entry %d is bad", edited))
	assert.Equal(t, uint64(edited-1), ef2.Follower().AppliedSeq())
	_, ok = ef2.Follower().Get(ent.Key)
	assert.False(t, ok, "the edited entry's key")
}

// TestEtcdBlackholeThroughToxiproxy: etcd goes silent rather than away (a
// toxiproxy "timeout" toxic with no timeout drops every byte and keeps the
// connections open, as a partition does). The export call hangs, the ring
// fills, writes are refused; when the toxic goes (and with it the dead
// connections) the export resumes with no gap and no duplicate.
func TestEtcdBlackholeThroughToxiproxy(t *testing.T) {
	const ringCap = 10
	e := testEtcd(t)
	proxy := etcdProxy(t, e.Endpoints[0])
	viaProxy := e
	viaProxy.Endpoints = []string{"http://" + proxy.Listen}
	c := newCluster(t, 3, time.Hour, withEtcd(viaProxy), func(c *Config) {
		c.ExportRenewals = false
		c.Params.ExportRingCap = ringCap
		c.ExportSoftEntries = ringCap / 2
	})
	nd := c.nodes[c.leader()]
	direct, err := etcdbridge.Open(e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })
	mountSegments(t, nd)
	put(t, nd, "before")
	before := waitExported(t, nd, direct, 10*time.Second)

	_, err = proxy.Toxics.AddToxicJson(strings.NewReader(
		`{"name":"blackhole","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`))
	require.NoError(t, err)
	var ok int
	for i := 0; i < 10*ringCap; i++ {
		now := time.Now().UnixMilli()
		key := fmt.Sprintf("k%d", i)
		if code := proposeCode(nd, &fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{1024}, ReplicaNum: 2, ClientID: "c1"}); code != errcode.OK {
			require.Equal(t, errcode.EtcdOperationError, code)
			break
		}
		mustPropose(t, nd, &fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"})
		ok++
	}
	require.Equal(t, ringCap, ok)
	_, _, err = nd.GetReplicaList(ctx(t), "k0")
	require.NoError(t, err, "reads go on")
	latest, err := direct.Latest(ctx(t))
	require.NoError(t, err)
	require.Equal(t, before, latest)

	require.NoError(t, proxy.Toxics.RemoveToxic(context.Background(), "blackhole"))
	restored := time.Now()
	waitExported(t, nd, direct, 30*time.Second)
	t.Logf("export drained %v after the blackhole went", time.Since(restored).Round(time.Millisecond))
	put(t, nd, "after")
	final := waitExported(t, nd, direct, 10*time.Second)
	require.Equal(t, before+ringCap+1, final)
	checkOpLog(t, direct, final)
}

// TestRestartDuringEtcdOutage: nodes with Raft state start, elect, promote
// and serve writes while etcd is down (the state is in Raft; master_view and
// the OpLog catch up when etcd is back), while a new node, with nothing
// to recover, still refuses an etcd that does not answer.
func TestRestartDuringEtcdOutage(t *testing.T) {
	e := testEtcd(t)
	proxy := etcdProxy(t, e.Endpoints[0])
	viaProxy := e
	viaProxy.Endpoints = []string{"http://" + proxy.Listen}
	viaProxy.DialTimeout = time.Second
	c := newCluster(t, 3, 50*time.Millisecond, withEtcd(viaProxy))
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	put(t, nd, "before")
	direct, err := etcdbridge.Open(e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })
	waitExported(t, nd, direct, 10*time.Second)

	proxy.Stop()
	for i := range c.nodes {
		c.stop(i)
	}
	// As for members from before the registry: the nodes must register
	// once etcd answers, not only at a start when it does.
	registry := direct.Config().Prefix + "/" + direct.Config().ClusterID + "/nodes/"
	_, err = direct.Client().Delete(ctx(t), registry, clientv3.WithPrefix())
	require.NoError(t, err)
	for i := range c.nodes {
		c.start(i)
	}
	nd = c.nodes[c.leader()]
	put(t, nd, "during")
	view, ok, err := direct.MasterView(ctx(t))
	require.NoError(t, err)
	require.True(t, ok)
	assert.NotEqual(t, nd.raft.CurrentTerm(), view.Term, "etcd is cut off: the new term is not published yet")

	require.NoError(t, proxy.Start())
	seq := waitExported(t, nd, direct, 20*time.Second)
	checkOpLog(t, direct, seq)
	require.Eventually(t, func() bool {
		view, _, err = direct.MasterView(ctx(t))
		return err == nil && view.Term == nd.raft.CurrentTerm() && view.LeaderID == nd.cfg.ID
	}, 10*time.Second, 20*time.Millisecond, "master_view published once etcd is back")
	for _, cfg := range c.cfgs {
		require.Eventually(t, func() bool {
			ok, err := direct.NodeRegistered(ctx(t), cfg.ID)
			return err == nil && ok
		}, 10*time.Second, 50*time.Millisecond, "%s registered in etcd once it answers", cfg.ID)
	}

	proxy.Stop()
	fresh := c.cfgs[0]
	fresh.DataDir = t.TempDir()
	_, err = Start(context.Background(), fresh)
	require.Error(t, err, "a new node checks its etcd first")
	assert.Equal(t, errcode.EtcdOperationError, errcode.Of(err), "%v", err)
}

// TestExportedSeqAfterLeaderChange: a new leader that cannot reach etcd
// reports as exported what its ring says surely is (every entry before the
// ring's first), not 0 or another term's figure, so the backlog a status
// shows (applied_seq − exported_seq, `moonctl status`'s EXPORT LAG) is the
// ring's, not the whole OpLog.
func TestExportedSeqAfterLeaderChange(t *testing.T) {
	e := testEtcd(t)
	proxy := etcdProxy(t, e.Endpoints[0])
	viaProxy := e
	viaProxy.Endpoints = []string{"http://" + proxy.Listen}
	viaProxy.DialTimeout = 2 * time.Second
	c := newCluster(t, 3, 50*time.Millisecond, withEtcd(viaProxy), func(c *Config) { c.ExportRenewals = false })
	l := c.leader()
	direct, err := etcdbridge.Open(e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })
	mountSegments(t, c.nodes[l])
	for i := range 5 {
		put(t, c.nodes[l], fmt.Sprintf("k%d", i))
	}
	exported := waitExported(t, c.nodes[l], direct, 10*time.Second)

	proxy.Stop() // the next leader cannot read etcd's latest
	for i := range 3 {
		put(t, c.nodes[l], fmt.Sprintf("after-%d", i))
	}
	c.stop(l) // the new leader holds every acknowledged put

	nl := c.leader()
	st := c.nodes[nl].Status()
	require.True(t, st.Promoted)
	assert.Equal(t, exported+3, st.AppliedSeq, "three PUT_ENDs since the export")
	assert.EqualValues(t, 3, st.ExportRingLen)
	assert.Equal(t, exported, st.ExportedSeq, "what the ring says is exported, not what this node never wrote")

	// The backlog's age: the oldest of the three waits since its put.
	nd := c.nodes[nl]
	age := nd.backlogAge(st.ExportedSeq)
	assert.Greater(t, age, time.Duration(0))
	assert.Less(t, age, time.Minute)
	assert.Zero(t, nd.backlogAge(st.AppliedSeq), "nothing waits after the last entry")
	assert.Contains(t, scrape(t, nd), "moonraft_export_backlog_seconds ")
}

// proposeCode proposes cmd and returns its error code, whether the node
// refused it (the export's bound) or the state machine did.
func proposeCode(nd *Node, cmd fsm.Command) errcode.Code {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := nd.Propose(c, cmd)
	if err != nil {
		return errcode.Of(err)
	}
	return r.Code()
}

// scrape is what nd's /metrics serves.
func scrape(t *testing.T, nd *Node) string {
	t.Helper()
	rec := httptest.NewRecorder()
	nd.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, 200, rec.Code)
	return rec.Body.String()
}
