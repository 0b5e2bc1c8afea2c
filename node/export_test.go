package node

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/etcdfollower"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	etcdOnce sync.Once
	etcdSrv  *etcdbridge.Embedded
	etcdDir  string
	etcdErr  error
	// prefixSeq is only touched by tests, which do not run in parallel.
	prefixSeq int
)

// TestMain stops the shared embedded etcd, if a test started one, and
// removes its data dir (~60 MB a run otherwise left in the temp dir).
func TestMain(m *testing.M) {
	code := m.Run()
	if etcdSrv != nil {
		_ = etcdSrv.Close()
	}
	if etcdDir != "" {
		_ = os.RemoveAll(etcdDir)
	}
	os.Exit(code)
}

// testEtcd returns an etcd config on a shared embedded etcd with a prefix
// of the test's own.
func testEtcd(t testing.TB) etcdbridge.Config {
	etcdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "moonraft-node-etcd-")
		if err != nil {
			etcdErr = err
			return
		}
		etcdDir = dir
		etcdSrv, etcdErr = etcdbridge.StartEmbedded(dir, "", "")
	})
	require.NoError(t, etcdErr)
	prefixSeq++ // -count=N reruns a test: each run gets a clean keyspace
	return etcdbridge.Config{Endpoints: etcdSrv.Endpoints(), Prefix: fmt.Sprintf("test/%s/%d", t.Name(), prefixSeq), ClusterID: "c"}
}

func withEtcd(e etcdbridge.Config) func(*Config) {
	return func(c *Config) { c.Etcd = e }
}

// eachCommand calls fn with every command in a stopped node's Raft log,
// which must be complete (no snapshot compaction in the test).
func eachCommand(t *testing.T, dataDir string, fn func(data []byte)) {
	store, _, err := raftstore.Open(dataDir, "", hclog.NewNullLogger(), 0, 0)
	require.NoError(t, err)
	defer store.Close()
	first, err := store.FirstIndex()
	require.NoError(t, err)
	last, err := store.LastIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(1), first, "the log must be complete (no snapshot compaction in this test)")
	for i := first; i <= last; i++ {
		var l raft.Log
		require.NoError(t, store.GetLog(i, &l))
		if l.Type == raft.LogCommand {
			fn(l.Data)
		}
	}
}

// replayEntries reads a stopped node's Raft log and applies it to a fresh
// state machine, collecting every OpLog entry it produces: what the FSM
// exported, to compare byte for byte with etcd.
func replayEntries(t *testing.T, dataDir string) []oplog.Entry {
	f := fsm.New()
	var out []oplog.Entry
	eachCommand(t, dataDir, func(data []byte) {
		seq := f.Stats().AppliedSeq
		f.Apply(data)
		out = append(out, f.RingAfter(seq, 1<<30).Entries()...)
	})
	return out
}

// readAll reads every entry in etcd from seq 1.
func readAll(t *testing.T, s *etcdbridge.Store) []oplog.Record {
	var out []oplog.Record
	var after uint64
	for {
		recs, _, err := s.ReadOpLogSince(context.Background(), after, 1000)
		require.NoError(t, err)
		if len(recs) == 0 {
			return out
		}
		out = append(out, recs...)
		after = recs[len(recs)-1].Seq
	}
}

// TestExportContiguousAcrossLeaderLoss: 64 concurrent writers, the leader
// stopped in the middle of the export; afterwards etcd holds 1..latest with
// no gap or duplicate, every checksum holds, and every entry is byte-equal
// to the one the state machine produced.
func TestExportContiguousAcrossLeaderLoss(t *testing.T) {
	e := testEtcd(t)
	c := newCluster(t, 3, time.Hour, withEtcd(e), func(c *Config) { c.ExportRenewals = false })
	l := c.leader()
	mountSegments(t, c.nodes[l])
	var wg sync.WaitGroup
	writer := func(w, from, to int) {
		defer wg.Done()
		for i := from; i < to; i++ {
			for {
				nd := c.nodes[c.leader()]
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				key := fmt.Sprintf("w%d/k%d", w, i)
				_, err := nd.Propose(ctx, &fsm.PutStart{NowMs: time.Now().UnixMilli(), Key: key, SliceLengths: []uint64{64}, ReplicaNum: 1, ClientID: "c1"})
				if err == nil {
					_, err = nd.Propose(ctx, &fsm.PutEnd{NowMs: time.Now().UnixMilli(), Key: key, ClientID: "c1"})
				}
				cancel()
				if err == nil {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go writer(w, 0, 10)
	}
	wg.Wait()
	c.stop(l) // the export of these entries may still be in flight
	nl := c.leader()
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go writer(w, 10, 15)
	}
	wg.Wait()

	store := etcdbridge.New(c.nodes[nl].etcd.Client(), e)
	want := c.nodes[nl].Status().AppliedSeq
	require.Eventually(t, func() bool {
		latest, err := store.Latest(context.Background())
		return err == nil && latest == want
	}, 20*time.Second, 20*time.Millisecond, "etcd latest never reached the applied seq %d", want)
	recs := readAll(t, store)
	require.Len(t, recs, int(want))
	for i, r := range recs {
		require.Equal(t, uint64(i+1), r.Seq, "gap or duplicate at %d", i)
		e, err := oplog.Decode(r.Value)
		require.NoError(t, err)
		require.NoError(t, e.Verify())
	}
	for i := range c.nodes {
		if c.nodes[i] != nil {
			c.stop(i)
		}
	}
	produced := replayEntries(t, c.cfgs[nl].DataDir)
	require.Len(t, produced, len(recs))
	for i, e := range produced {
		require.True(t, bytes.Equal(e.Encode(), recs[i].Value), "entry %d differs from what the FSM produced", i+1)
	}
}

// TestExportCleanupAfterSnapshot: after a snapshot covering seq S, etcd
// records it and keeps exactly the entries from S − retain on.
func TestExportCleanupAfterSnapshot(t *testing.T) {
	e := testEtcd(t)
	c := newCluster(t, 3, time.Hour, withEtcd(e), func(c *Config) { c.OplogRetain = 5 })
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	for i := 0; i < 20; i++ {
		put(t, nd, fmt.Sprintf("k%d", i))
	}
	store := etcdbridge.New(nd.etcd.Client(), e)
	s := nd.Status().AppliedSeq
	require.Eventually(t, func() bool { l, _ := store.Latest(context.Background()); return l == s }, 10*time.Second, 10*time.Millisecond)
	fut := nd.raft.Snapshot()
	require.NoError(t, fut.Error())
	meta, _, err := fut.Open()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		min, err := store.GetMinSequenceId(context.Background())
		return err == nil && min == s-5
	}, 10*time.Second, 10*time.Millisecond, "cleanup did not leave exactly the retained tail")
	recorded, ok, err := store.SnapshotSequenceId(context.Background(), meta.ID)
	require.NoError(t, err)
	require.True(t, ok, "snapshot %s recorded", meta.ID)
	assert.Equal(t, s, recorded)
	assert.Len(t, readAll(t, store), 6, "seqs S-5..S")
}

// TestExportCleanupInChunks: a snapshot covering several chunks' worth of
// entries has them deleted a chunk per etcd call, not in one transaction
// that would hold etcd for as long as millions take.
func TestExportCleanupInChunks(t *testing.T) {
	e := testEtcd(t)
	c := newCluster(t, 3, time.Hour, withEtcd(e), func(c *Config) { c.OplogRetain = 5 })
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	const batch = 512
	now := time.Now().UnixMilli()
	for i := 0; i < 3*cleanupChunk; i += batch {
		starts, ends := make([]fsm.Command, batch), make([]fsm.Command, batch)
		for j := range batch {
			key := fmt.Sprintf("k%06d", i+j)
			starts[j] = &fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{1024}, ReplicaNum: 1, ClientID: "c1"}
			ends[j] = &fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"}
		}
		mustPropose(t, nd, &fsm.Batch{Cmds: starts})
		mustPropose(t, nd, &fsm.Batch{Cmds: ends})
	}
	store := etcdbridge.New(nd.etcd.Client(), e)
	s := nd.Status().AppliedSeq
	require.GreaterOrEqual(t, s, uint64(3*cleanupChunk))
	require.Eventually(t, func() bool { l, _ := store.Latest(context.Background()); return l == s }, 30*time.Second, 10*time.Millisecond)
	cleanupCalls := func() float64 {
		const name = `moonraft_etcd_txn_duration_seconds_count{op="cleanup"}`
		if body := scrape(t, nd); strings.Contains(body, name) {
			return metricValue(t, body, name)
		}
		return 0
	}
	before := cleanupCalls()
	require.NoError(t, nd.raft.Snapshot().Error())
	require.Eventually(t, func() bool {
		min, err := store.GetMinSequenceId(context.Background())
		return err == nil && min == s-5
	}, 30*time.Second, 10*time.Millisecond, "cleanup did not leave exactly the retained tail")
	calls := cleanupCalls() - before
	chunks := (s - 5 - 1 + cleanupChunk - 1) / cleanupChunk
	assert.GreaterOrEqual(t, calls, float64(chunks), "%d entries deleted in %v calls", s-6, calls)
}

// TestMasterViewAndFollower: the leader publishes master_view with its
// term, and an etcd follower reaches the leader's object-set digest.
func TestMasterViewAndFollower(t *testing.T) {
	e := testEtcd(t)
	c := newCluster(t, 3, time.Hour, withEtcd(e))
	l := c.leader()
	nd := c.nodes[l]
	store := etcdbridge.New(nd.etcd.Client(), e)
	require.Eventually(t, func() bool {
		v, ok, err := store.MasterView(context.Background())
		return err == nil && ok && v.LeaderID == c.cfgs[l].ID && v.GRPCAddr == c.cfgs[l].GRPCAddr
	}, 10*time.Second, 10*time.Millisecond)

	mountSegments(t, nd)
	for i := 0; i < 30; i++ {
		put(t, nd, fmt.Sprintf("k%d", i))
	}
	mustPropose(t, nd, &fsm.Remove{NowMs: time.Now().UnixMilli(), Key: "k3", Force: true})
	ef, err := etcdfollower.Start(etcdfollower.Config{ID: "obs", GRPCAddr: freeAddr(t), Etcd: e})
	require.NoError(t, err)
	defer ef.Close()
	st := nd.Status()
	require.NoError(t, ef.Follower().WaitFor(ctx(t), st.AppliedSeq))
	assert.Equal(t, st.ObjectSetDigest, ef.Status().ObjectSetDigest)
	assert.Equal(t, uint64(29), ef.Status().Objects)
	_, _, err = ef.GetReplicaList(ctx(t), "k1")
	assert.NoError(t, err)
}

// TestFollowerFromSnapshot: a follower seeded from a snapshot file resumes
// from the snapshot's seq, even when etcd no longer holds the entries
// before it, and reaches the leader's object set.
func TestFollowerFromSnapshot(t *testing.T) {
	e := testEtcd(t)
	c := newCluster(t, 3, time.Hour, withEtcd(e))
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	for i := 0; i < 20; i++ {
		put(t, nd, fmt.Sprintf("k%d", i))
	}
	path := filepath.Join(t.TempDir(), "snap")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, nd.SnapshotSave(ctx(t), f))
	require.NoError(t, f.Close())
	s := nd.Status().AppliedSeq
	store := etcdbridge.New(nd.etcd.Client(), e)
	require.Eventually(t, func() bool { l, _ := store.Latest(context.Background()); return l == s }, 10*time.Second, 10*time.Millisecond)
	_, err = store.CleanupOpLogBefore(context.Background(), s+1) // etcd keeps nothing the snapshot covers
	require.NoError(t, err)
	for i := 20; i < 30; i++ {
		put(t, nd, fmt.Sprintf("k%d", i))
	}
	ef, err := etcdfollower.Start(etcdfollower.Config{ID: "obs", GRPCAddr: freeAddr(t), Etcd: e, Snapshot: path})
	require.NoError(t, err)
	defer ef.Close()
	st := nd.Status()
	require.NoError(t, ef.Follower().WaitFor(ctx(t), st.AppliedSeq))
	assert.Equal(t, st.ObjectSetDigest, ef.Status().ObjectSetDigest)
	assert.Equal(t, uint64(30), ef.Status().Objects)

	_, err = etcdfollower.Start(etcdfollower.Config{ID: "bad", GRPCAddr: freeAddr(t), Etcd: e, Snapshot: filepath.Join(t.TempDir(), "missing")})
	assert.Equal(t, errcode.FileNotFound, errcode.Of(err))
}

// TestEtcdFollowerSeesOverwrites: upserts reach an etcd follower through
// the real export as the OpLog rules say — an overwrite is a PUT_END with a
// higher key_sequence_id, a key rewritten in place is gone until its end,
// and a resizing upsert keeps the old value visible until its end.
func TestEtcdFollowerSeesOverwrites(t *testing.T) {
	e := testEtcd(t)
	c := newCluster(t, 3, 50*time.Millisecond, withEtcd(e), func(cfg *Config) { cfg.Params.LeaseTTLMs = 300 })
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	for _, k := range []string{"done", "inplace", "resized"} {
		put(t, nd, k)
	}
	time.Sleep(400 * time.Millisecond) // past the promotion's lease on every object
	upsert := func(key string, size uint64) {
		mustPropose(t, nd, &fsm.UpsertStart{PutStart: fsm.PutStart{NowMs: time.Now().UnixMilli(), Key: key, SliceLengths: []uint64{size}, ReplicaNum: 2, ClientID: "c1"}})
	}
	end := func(key string) {
		mustPropose(t, nd, &fsm.PutEnd{NowMs: time.Now().UnixMilli(), Key: key, ClientID: "c1"})
	}
	upsert("done", 2048)
	end("done")
	upsert("inplace", 1024)
	upsert("resized", 4096)

	ef, err := etcdfollower.Start(etcdfollower.Config{ID: "obs", GRPCAddr: freeAddr(t), Etcd: e})
	require.NoError(t, err)
	defer ef.Close()
	caughtUp := func() {
		st := nd.Status()
		require.NoError(t, ef.Follower().WaitFor(ctx(t), st.AppliedSeq))
		assert.Equal(t, st.ObjectSetDigest, ef.Status().ObjectSetDigest)
	}
	caughtUp()
	o, ok := ef.Follower().Get("done")
	require.True(t, ok)
	assert.Equal(t, uint64(2048), o.Size, "the overwrite")
	assert.Equal(t, uint64(2), o.KeySeq)
	_, ok = ef.Follower().Get("inplace")
	assert.False(t, ok, "bytes being rewritten are not offered")
	o, ok = ef.Follower().Get("resized")
	require.True(t, ok)
	assert.Equal(t, uint64(1024), o.Size, "the old value, intact, until the end")

	end("inplace")
	end("resized")
	caughtUp()
	o, _ = ef.Follower().Get("resized")
	assert.Equal(t, uint64(4096), o.Size)
	o, ok = ef.Follower().Get("inplace")
	require.True(t, ok)
	assert.Equal(t, uint64(3), o.KeySeq, "PUT_END 1, REMOVE 2, PUT_END 3")
}

// TestExportLinger: an OpLog entry after a quiet spell goes to etcd at
// once; one right behind an export waits, up to the linger, for a fuller
// transaction, and goes as soon as the transaction is full; with no linger
// nothing waits.
func TestExportLinger(t *testing.T) {
	for _, tc := range []struct {
		name   string
		linger time.Duration
	}{
		{"an hour", time.Hour},
		{"none", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := testEtcd(t)
			e.MaxTxnOps = 8
			c := newCluster(t, 1, time.Hour, withEtcd(e), func(c *Config) { c.ExportLinger = tc.linger })
			nd := c.nodes[c.leader()]
			mountSegments(t, nd)
			exported := func() bool { return nd.exportedSeq.Load() == nd.Status().AppliedSeq }

			put(t, nd, "first")
			require.Eventually(t, exported, 10*time.Second, 5*time.Millisecond, "an entry after a quiet spell goes at once")
			put(t, nd, "second")
			if tc.linger == 0 {
				require.Eventually(t, exported, 10*time.Second, 5*time.Millisecond, "with no linger nothing waits")
				return
			}
			require.Never(t, exported, time.Second, 10*time.Millisecond, "right behind an export, an entry waits for a fuller transaction")
			for i := 1; i < nd.etcd.MaxBatch(); i++ {
				put(t, nd, fmt.Sprintf("more%d", i))
			}
			require.Eventually(t, exported, 10*time.Second, 5*time.Millisecond, "a full transaction goes at once")
		})
	}
}

// TestExportedOnceCaughtUp: a burst of OpLog entries goes to etcd in many
// transactions, but the rings are trimmed by a few Exported entries, not
// one per transaction (each is a Raft entry on every node's disk); once the
// export has caught up every node's ring is empty.
func TestExportedOnceCaughtUp(t *testing.T) {
	e := testEtcd(t)
	e.MaxTxnOps = 8 // 7 entries a transaction
	// No ticks: the only Raft entries after the burst are Exported.
	c := newCluster(t, 3, time.Hour, withEtcd(e), func(c *Config) { c.ExportRenewals = false })
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	now := time.Now().UnixMilli()
	var starts, ends fsm.Batch
	for i := range 100 {
		k := fmt.Sprintf("burst%03d", i)
		starts.Cmds = append(starts.Cmds, &fsm.PutStart{NowMs: now, Key: k, SliceLengths: []uint64{1024}, ReplicaNum: 1, ClientID: "c1"})
		ends.Cmds = append(ends.Cmds, &fsm.PutEnd{NowMs: now, Key: k, ClientID: "c1"})
	}
	txns := nd.etcd.Stats().OplogTxns
	mustPropose(t, nd, &starts)
	mustPropose(t, nd, &ends)

	require.Eventually(t, func() bool {
		for _, x := range c.nodes {
			if x.Status().ExportRingLen != 0 || x.Status().AppliedIndex < nd.raft.LastIndex() {
				return false
			}
		}
		return nd.exportedSeq.Load() == nd.Status().AppliedSeq
	}, 20*time.Second, 10*time.Millisecond, "every ring empty once the export caught up")
	written := nd.etcd.Stats().OplogTxns - txns
	for i := range c.nodes {
		c.stop(i)
	}
	exported := 0
	eachCommand(t, c.cfgs[0].DataDir, func(data []byte) {
		if fsm.CmdType(data[0])&^fsm.IgnoreUnknownFlag == fsm.CmdExported {
			exported++
		}
	})
	assert.GreaterOrEqual(t, written, uint64(15), "100 entries at 7 a transaction")
	assert.LessOrEqual(t, exported, 3, "Exported entries for %d transactions", written)
}
