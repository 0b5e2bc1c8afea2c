package jepsen

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// failpointCluster starts three nodes built with failpoints and returns
// the cluster and its leader; the cluster is closed when the test ends.
func failpointCluster(t *testing.T) (*cluster, int) {
	return testCluster(t, clusterConfig{nodes: 3, logLevel: "warn"}, "failpoints")
}

// testCluster starts the nodes of cfg built with the build tags and
// returns the cluster and its leader; the cluster is closed when the test
// ends.
func testCluster(t *testing.T, cfg clusterConfig, tags ...string) (*cluster, int) {
	if testing.Short() {
		t.Skip("process-level fault test; run without -short")
	}
	ctx := context.Background()
	dir := t.TempDir()
	bin, err := buildMoonraft(dir, tags...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := startCluster(ctx, bin, dir, filepath.Join(dir, "data"), cfg, t.Logf)
	if c != nil {
		t.Cleanup(c.close)
	}
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.waitLeader(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c, l
}

// mountSlowSegment mounts the segment the disk tests' writes go to, for
// client "slow".
func mountSlowSegment(t *testing.T, c *cluster) {
	seg := fsm.SegmentSpec{ID: "slow-seg", Name: "slow-host", Base: 1 << 40, Size: 1 << 30}
	if err := retry(context.Background(), func(ctx context.Context) error { return c.admin.MountSegment(ctx, "slow", seg) }); err != nil {
		t.Fatal(err)
	}
}

// putStart starts a put of key for client "slow", retried until answered,
// for at most a minute. OBJECT_ALREADY_EXISTS on a retry is an earlier
// attempt of ours that went through after all (its outcome was unknown).
func putStart(t *testing.T, c *cluster, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tried := false
	if err := retry(ctx, func(ctx context.Context) error {
		_, err := c.admin.PutStart(ctx, key, []uint64{64}, moonclient.ReplicateConfig{ReplicaNum: 1}, "slow")
		if tried && errcode.Of(err) == errcode.ObjectAlreadyExists {
			return nil
		}
		tried = true
		return err
	}); err != nil {
		t.Fatalf("PutStart %s: %v", key, err)
	}
}

// putPair puts key (both halves) for client "slow"; PutEnd is idempotent,
// so it is retried as it is.
func putPair(t *testing.T, c *cluster, key string) {
	putStart(t, c, key)
	if err := retry(context.Background(), func(ctx context.Context) error { return c.admin.PutEnd(ctx, key, "slow") }); err != nil {
		t.Fatalf("PutEnd %s: %v", key, err)
	}
}

// setFailpoint switches failpoint name on for node i (holding value) and
// returns what switches it off.
func setFailpoint(t *testing.T, c *cluster, i int, name, value string) (off func()) {
	path := filepath.Join(c.nodeDir(i), name)
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
}

// caughtUp waits until node i holds objects objects, the same set as the
// leader's, and says no disk error.
func caughtUp(t *testing.T, c *cluster, i, objects int, within time.Duration) {
	deadline := time.Now().Add(within)
	for {
		sts := c.statuses(time.Second)
		var leader *moonraftpb.NodeStatus
		for _, st := range sts {
			if st != nil && st.Role == "leader" && st.Promoted {
				leader = st
			}
		}
		st := sts[i]
		if st != nil && leader != nil && st.Objects == uint64(objects) && st.ObjectSetDigest == leader.ObjectSetDigest && st.DiskError == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not catch up (%d objects, the leader's set, no disk error) within %v once its disk worked again: %v", c.nodes[i].id, objects, within, st)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSlowFollowerDisk gives one follower a disk on which every log write
// takes a second. A commit needs the leader and one follower, so writes go
// on at the other follower's pace: twenty writes one after the other take
// well under the twenty seconds they would if commits waited for the slow
// disk. Once the disk is fast again the follower holds every object.
func TestSlowFollowerDisk(t *testing.T) {
	c, l := failpointCluster(t)
	mountSlowSegment(t, c)
	f := (l + 1) % 3
	fast := setFailpoint(t, c, f, failpointSlowLog, "1s")
	time.Sleep(2 * time.Second) // the follower's writes in flight are slow ones now

	const writes = 20
	start := time.Now()
	for i := range writes {
		putPair(t, c, fmt.Sprint("slow/", i))
	}
	took := time.Since(start)
	t.Logf("%d puts (two commits each) with one follower's log writes taking 1 s: %v", writes, took)
	if took > writes*time.Second/2 {
		t.Errorf("%d puts took %v: commits waited for the slow follower", writes, took)
	}
	if sts := c.statuses(time.Second); sts[f] == nil || sts[l] == nil || sts[f].Objects >= writes {
		t.Fatalf("the slow follower is not behind (the failpoint did not take): %v", sts[f])
	}

	fast()
	caughtUp(t, c, f, writes, 30*time.Second)
}

// TestSlowLeaderDiskReplaced gives the leader a disk on which every log
// write takes three seconds. It cannot commit at that pace, so it must not
// stay leader: another node is elected, takes writes, and once the disk is
// fast again the old leader follows and holds every object.
func TestSlowLeaderDiskReplaced(t *testing.T) {
	c, l := failpointCluster(t)
	ctx := context.Background()
	fast := setFailpoint(t, c, l, failpointSlowLog, "3s")
	start := time.Now()
	nl, err := newLeader(ctx, c, l, 15*time.Second)
	if err != nil {
		t.Fatalf("the leader with a slow disk was not replaced: %v", err)
	}
	t.Logf("%s replaced by %s %v after its log writes began to take 3 s", c.nodes[l].id, c.nodes[nl].id, time.Since(start).Round(time.Millisecond))
	mountSlowSegment(t, c)
	const writes = 5
	for i := range writes {
		key := fmt.Sprint("slow/", i)
		putStart(t, c, key)
	}
	fast()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sts := c.statuses(time.Second)
		if old, cur := sts[l], sts[nl]; old != nil && cur != nil && old.Role == "follower" && old.Objects == writes && old.ObjectSetDigest == cur.ObjectSetDigest {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old leader did not follow and catch up in 30 s once its disk was fast again: %v", sts[l])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFailingFollowerDisk: every Raft log write of one follower fails with
// EIO. The other two commit every write; the follower says what is wrong
// in its Status; once its disk works again it catches up by itself.
func TestFailingFollowerDisk(t *testing.T) {
	c, l := failpointCluster(t)
	mountSlowSegment(t, c)
	f := (l + 1) % 3
	works := setFailpoint(t, c, f, failpointFailLog, "")
	const writes = 20
	for i := range writes {
		putPair(t, c, fmt.Sprint("eio/", i))
	}
	st := c.statuses(time.Second)[f]
	if st == nil || !strings.Contains(st.DiskError, "input/output error") {
		t.Fatalf("the follower whose log writes fail does not say so in its Status: %v", st)
	}
	if st.Objects >= writes {
		t.Fatalf("the follower whose log writes fail applied every write: %v", st)
	}
	works()
	putPair(t, c, "eio/after") // a good write clears the disk error
	caughtUp(t, c, f, writes+1, 30*time.Second)
}

// TestFailingLeaderDisk: every Raft log write of the leader fails with EIO.
// It steps down at the first write it cannot log (answered UNAVAILABLE, not
// applied: TestLeaderLogWriteFailure), writes go on through another leader,
// and, its disk working again, it follows and holds every object.
func TestFailingLeaderDisk(t *testing.T) {
	c, l := failpointCluster(t)
	ctx := context.Background()
	mountSlowSegment(t, c)
	works := setFailpoint(t, c, l, failpointFailLog, "")
	const writes = 5
	for i := range writes {
		putPair(t, c, fmt.Sprint("eio/", i))
	}
	nl, err := newLeader(ctx, c, l, 15*time.Second)
	if err != nil {
		t.Fatalf("the leader whose log writes fail was not replaced: %v", err)
	}
	t.Logf("%s replaced by %s", c.nodes[l].id, c.nodes[nl].id)
	works()
	putPair(t, c, "eio/after")
	caughtUp(t, c, l, writes+1, 30*time.Second)
}

// TestKeepNodeData keeps a running cluster's data dirs as a failed run
// does: each node's Raft log and snapshot directories are copied, a
// nemesis's filler is not.
func TestKeepNodeData(t *testing.T) {
	c, _ := testCluster(t, clusterConfig{nodes: 3, logLevel: "warn"})
	mountSlowSegment(t, c)
	filler := filepath.Join(c.nodeDir(1), fillerName)
	if err := os.WriteFile(filler, []byte("taken"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "data")
	if err := c.keepNodeData(dst); err != nil {
		t.Fatal(err)
	}
	for _, p := range c.nodes {
		for _, name := range []string{"raft-wal", "snapshots"} {
			if fi, err := os.Stat(filepath.Join(dst, p.id, name)); err != nil || !fi.IsDir() {
				t.Errorf("%s's %s was not kept: %v", p.id, name, err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dst, c.nodes[1].id, fillerName)); !os.IsNotExist(err) {
		t.Errorf("the nemesis's filler was kept (%v)", err)
	}
}
