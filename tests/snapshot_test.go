package tests

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startEtcd runs an embedded etcd for a test.
func startEtcd(t *testing.T) string {
	e, err := etcdbridge.StartEmbedded(t.TempDir(), "", "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	return strings.Join(e.Endpoints(), ",")
}

// putMany writes n objects with keys prefix%06d in batches.
func putMany(t *testing.T, ctx context.Context, cl *client.Client, prefix string, n int) {
	const batch = 500
	for lo := 0; lo < n; lo += batch {
		var items []client.PutStartItem
		var keys []string
		for i := lo; i < min(lo+batch, n); i++ {
			key := fmt.Sprintf("%s%06d", prefix, i)
			items = append(items, client.PutStartItem{Key: key, SliceLengths: []uint64{1024}, Config: client.ReplicateConfig{ReplicaNum: 1}, ClientID: "dr"})
			keys = append(keys, key)
		}
		rs, err := cl.BatchPutStart(ctx, items)
		require.NoError(t, err)
		for _, r := range rs {
			require.NoError(t, r.Err)
		}
		errs, err := cl.BatchPutEnd(ctx, "dr", keys)
		require.NoError(t, err)
		for _, e := range errs {
			require.NoError(t, e)
		}
	}
}

// objectSetOf is the object-set digest of a snapshot file, as the nodes
// report it in status.
func objectSetOf(t *testing.T, path string) string {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	s := fsm.New()
	_, err = s.Restore(f)
	require.NoError(t, err)
	d := s.ObjectSetDigest()
	return hex.EncodeToString(d[:])
}

// TestDisasterRecovery: a three-node cluster with 100,000 objects is saved
// with moonctl, written to further, then every data dir is wiped; each node
// is seeded offline from the snapshot plus the OpLog in etcd, and the
// restarted cluster holds exactly the objects acknowledged before the wipe,
// at the same seq.
func TestDisasterRecovery(t *testing.T) {
	dir := t.TempDir()
	etcd := startEtcd(t)
	c := StartCluster(t, dir, 3, "--tick", "1h", "--client-ttl", "1h", "--etcd-endpoints", etcd)
	ctx, cl, _ := c.Serving(5 * time.Minute)
	require.NoError(t, cl.MountSegment(ctx, "dr", fsm.SegmentSpec{ID: "s0", Name: "host0", Size: 1 << 40}))
	putMany(t, ctx, cl, "a/", 100_000)
	snap := filepath.Join(dir, "backup.snap")
	moonctl := func(args ...string) string {
		out, errOut, code := c.Moonctl(args...)
		require.Equal(t, 0, code, "moonctl %v: %s%s", args, out, errOut)
		return out + errOut
	}
	out := moonctl("snapshot", "save", snap)
	assert.Contains(t, out, "objects         100000")
	// After the snapshot: more writes and removals, all in etcd's OpLog.
	putMany(t, ctx, cl, "b/", 2_000)
	for i := 0; i < 100; i++ {
		require.NoError(t, cl.Remove(ctx, fmt.Sprintf("a/%06d", i), true))
	}
	l := c.Leader(ctx, cl)
	var before struct {
		seq       uint64
		objectSet string
	}
	require.Eventually(t, func() bool {
		st, err := cl.Status(ctx, l.GRPCAddr)
		require.NoError(t, err)
		before.seq, before.objectSet = st.AppliedSeq, st.ObjectSetDigest
		return st.ExportedSeq == st.AppliedSeq
	}, time.Minute, 20*time.Millisecond, "export did not catch up")

	c.StopAll()
	var peers []string
	for _, p := range c.Procs {
		peers = append(peers, p.ID+"="+p.RaftAddr)
		require.NoError(t, os.RemoveAll(filepath.Join(dir, p.ID)))
	}
	for i, p := range c.Procs {
		args := []string{"snapshot", "restore", "--offline", "--data-dir", filepath.Join(dir, p.ID), "--id", p.ID,
			"--peers", strings.Join(peers, ","), "--replay-etcd", "--etcd-endpoints", etcd, snap}
		if i > 0 {
			out := moonctl(args...)
			assert.Contains(t, out, fmt.Sprintf("applied seq %d", before.seq), "node %s", p.ID)
			assert.Contains(t, out, "replayed 2100 OpLog entries")
			continue
		}
		// The JSON report (stdout only: the replay's progress is on stderr).
		out, errOut, code := c.Moonctl(append(args, "--json")...)
		require.Equal(t, 0, code, errOut)
		var rep map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &rep), "%s", out)
		for _, k := range []string{"data_dir", "id", "snapshot_seq", "applied_seq", "replayed", "replay_ms", "gap", "skipped",
			"stale_dropped", "digest", "object_set_digest", "raft_index", "raft_term"} {
			assert.Contains(t, rep, k)
		}
		assert.Len(t, rep, 13)
		assert.Equal(t, float64(before.seq), rep["applied_seq"])
		assert.Equal(t, 2100.0, rep["replayed"])
		assert.Equal(t, p.ID, rep["id"])
	}
	for _, p := range c.Procs {
		c.Start(p)
	}
	c.Leader(ctx, cl)
	sts := c.Converged(ctx, cl)
	for _, st := range sts {
		assert.Equal(t, before.seq, st.AppliedSeq, "%s: same seq as before the wipe", st.Id)
		assert.Equal(t, before.objectSet, st.ObjectSetDigest, "%s: same objects as before the wipe", st.Id)
		assert.Equal(t, sts[0].Digest, st.Digest, "nodes agree")
		assert.Equal(t, uint64(101_900), st.Objects)
	}
	_, _, err := cl.GetReplicaList(ctx, "b/001999")
	require.NoError(t, err)
	_, _, err = cl.GetReplicaList(ctx, "a/000001")
	require.Error(t, err, "a removal after the snapshot stays removed")
}

// TestLiveRestore: a live cluster restored from an older snapshot holds the
// snapshot's objects on every node.
func TestLiveRestore(t *testing.T) {
	c := StartCluster(t, t.TempDir(), 3)
	ctx, cl, _ := c.Serving(2 * time.Minute)
	k := cl.KeepAlive(ctx, "dr", []fsm.SegmentSpec{{ID: "s0", Name: "host0", Size: 1 << 40}}, 200*time.Millisecond)
	defer k.Stop()
	require.NoError(t, cl.MountSegment(ctx, "dr", fsm.SegmentSpec{ID: "s0", Name: "host0", Size: 1 << 40}))
	putMany(t, ctx, cl, "old/", 1_000)
	snap := filepath.Join(t.TempDir(), "old.snap")
	out, errOut, code := c.Moonctl("snapshot", "save", snap)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	putMany(t, ctx, cl, "new/", 500)
	_, err := cl.RemoveAll(ctx, true)
	require.NoError(t, err)

	out, errOut, code = c.Moonctl("snapshot", "restore", snap, "--json")
	require.Equal(t, 0, code, errOut)
	assert.JSONEq(t, `{"result": "restored"}`, out)
	want := objectSetOf(t, snap)
	sts := c.Converged(ctx, cl)
	for _, st := range sts {
		assert.Equal(t, want, st.ObjectSetDigest, "%s holds the snapshot's objects", st.Id)
		assert.Equal(t, sts[0].Digest, st.Digest)
		assert.Equal(t, uint64(1_000), st.Objects)
	}
	// The restore re-promoted the leader: sessions were extended, so the
	// objects survive the ticks after it.
	time.Sleep(time.Second)
	_, _, err = cl.GetReplicaList(ctx, "old/000999")
	require.NoError(t, err)
}

// TestSnapshotBadInput: each bad file or target is refused by moonctl with
// the error's name, and nothing changes.
func TestSnapshotBadInput(t *testing.T) {
	dir := t.TempDir()
	c := StartCluster(t, dir, 1)
	ctx, cl, _ := c.Serving(time.Minute)
	require.NoError(t, cl.MountSegment(ctx, "dr", fsm.SegmentSpec{ID: "s0", Name: "host0", Size: 1 << 30}))
	putMany(t, ctx, cl, "k/", 100)
	good := filepath.Join(dir, "good.snap")
	out, errOut, code := c.Moonctl("snapshot", "save", good)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	valid, err := os.ReadFile(good)
	require.NoError(t, err)
	variant := func(name string, mod func([]byte) []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, mod(append([]byte(nil), valid...)), 0o644))
		return p
	}
	truncated := variant("truncated", func(b []byte) []byte { return b[:len(b)/2] })
	flipped := variant("flipped", func(b []byte) []byte { b[len(b)-1] ^= 1; return b })
	magic := variant("magic", func(b []byte) []byte { copy(b, "NOTASNAP"); return b })
	version := variant("version", func(b []byte) []byte { b[11] = 9; return b })

	st, err := cl.Status(ctx, c.Procs[0].GRPCAddr)
	require.NoError(t, err)
	seeded := filepath.Join(dir, "seeded")
	offline := func(extra ...string) []string {
		return append([]string{"snapshot", "restore", "--offline", "--data-dir", seeded, "--id", "n0", "--peers", "n0=127.0.0.1:1"}, extra...)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"inspect truncated", []string{"snapshot", "inspect", truncated}, "FILE_READ_FAIL"},
		{"inspect flipped byte", []string{"snapshot", "inspect", flipped}, "CHECKSUM_MISMATCH"},
		{"inspect wrong magic", []string{"snapshot", "inspect", magic}, "FILE_READ_FAIL"},
		{"inspect wrong version", []string{"snapshot", "inspect", version}, "INVALID_VERSION"},
		{"live restore of a truncated file", []string{"snapshot", "restore", truncated}, "FILE_READ_FAIL"},
		{"live restore of a flipped byte", []string{"snapshot", "restore", flipped}, "CHECKSUM_MISMATCH"},
		{"offline restore of a corrupted file", offline(flipped), "CHECKSUM_MISMATCH"},
		{"offline restore of another cluster", offline("--cluster-id", "other", good), "INVALID_PARAMS"},
	}
	for _, tc := range cases {
		out, errOut, code := c.Moonctl(tc.args...)
		assert.Equal(t, 1, code, "%s: must fail: %s", tc.name, out)
		assert.Contains(t, errOut, tc.want, tc.name)
	}
	_, err = os.Stat(seeded)
	assert.True(t, os.IsNotExist(err), "a refused offline restore creates nothing")
	after, err := cl.Status(ctx, c.Procs[0].GRPCAddr)
	require.NoError(t, err)
	assert.Equal(t, st.ObjectSetDigest, after.ObjectSetDigest, "a refused live restore changes nothing")

	// A data dir holding Raft state is refused unless forced.
	out, errOut, code = c.Moonctl(offline("--cluster-id", "mooncake_cluster", good)...)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	_, errOut, code = c.Moonctl(offline("--cluster-id", "mooncake_cluster", good)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "already holds Raft state")
	out, errOut, code = c.Moonctl(append(offline("--cluster-id", "mooncake_cluster", "--force", good), "--json")...)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	var seededRep struct {
		Digest string `json:"digest"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &seededRep), out)

	// inspect --restore gives the digest of the state the file holds, as
	// the node seeded from it has it; the file's own digest names the file.
	out, errOut, code = c.Moonctl("snapshot", "inspect", "--restore", good, "--json")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	var inspected struct {
		Digest      string `json:"digest"`
		StateDigest string `json:"state_digest"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &inspected), out)
	assert.Equal(t, seededRep.Digest, inspected.StateDigest)
	assert.NotEqual(t, inspected.Digest, inspected.StateDigest)
	c.Kill(c.Procs[0], syscall.SIGTERM)
}
