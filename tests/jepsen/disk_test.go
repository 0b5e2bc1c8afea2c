package jepsen

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/transport"
)

// failpointCluster starts three nodes built with failpoints and returns
// the cluster and its leader; the cluster is closed when the test ends.
func failpointCluster(t *testing.T) (*cluster, int) {
	if testing.Short() {
		t.Skip("process-level fault test; run without -short")
	}
	ctx := context.Background()
	dir := t.TempDir()
	bin, err := buildMoonraft(dir, "failpoints")
	if err != nil {
		t.Fatal(err)
	}
	c, err := startCluster(ctx, bin, dir, filepath.Join(dir, "data"), clusterConfig{nodes: 3, logLevel: "warn"}, t.Logf)
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

// putStart starts a put of key for client "slow", retried until answered.
func putStart(t *testing.T, c *cluster, key string) {
	if err := retry(context.Background(), func(ctx context.Context) error {
		_, err := c.admin.PutStart(ctx, key, []uint64{64}, transport.ReplicateConfig{ReplicaNum: 1}, "slow")
		return err
	}); err != nil {
		t.Fatalf("PutStart %s: %v", key, err)
	}
}

// TestSlowFollowerDisk gives one follower a disk on which every log write
// takes a second. A commit needs the leader and one follower, so writes go
// on at the other follower's pace: twenty writes one after the other take
// well under the twenty seconds they would if commits waited for the slow
// disk. Once the disk is fast again the follower holds every object.
func TestSlowFollowerDisk(t *testing.T) {
	c, l := failpointCluster(t)
	ctx := context.Background()
	mountSlowSegment(t, c)
	f := (l + 1) % 3
	slow := filepath.Join(c.dataDir, c.nodes[f].id, failpointSlowLog)
	if err := os.WriteFile(slow, []byte("1s"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the follower's writes in flight are slow ones now

	const writes = 20
	start := time.Now()
	for i := range writes {
		key := fmt.Sprint("slow/", i)
		putStart(t, c, key)
		if err := retry(ctx, func(ctx context.Context) error { return c.admin.PutEnd(ctx, key, "slow") }); err != nil {
			t.Fatalf("PutEnd %s: %v", key, err)
		}
	}
	took := time.Since(start)
	t.Logf("%d puts (two commits each) with one follower's log writes taking 1 s: %v", writes, took)
	if took > writes*time.Second/2 {
		t.Errorf("%d puts took %v: commits waited for the slow follower", writes, took)
	}
	if sts := c.statuses(time.Second); sts[f] == nil || sts[l] == nil || sts[f].Objects >= writes {
		t.Fatalf("the slow follower is not behind (the failpoint did not take): %v", sts[f])
	}

	if err := os.Remove(slow); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sts := c.statuses(time.Second)
		if st := sts[f]; st != nil && st.Objects == writes && sts[l] != nil && st.ObjectSetDigest == sts[l].ObjectSetDigest {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower did not catch up in 30 s once its disk was fast again: %v", sts[f])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSlowLeaderDiskReplaced gives the leader a disk on which every log
// write takes three seconds. It cannot commit at that pace, so it must not
// stay leader: another node is elected, takes writes, and once the disk is
// fast again the old leader follows and holds every object.
func TestSlowLeaderDiskReplaced(t *testing.T) {
	c, l := failpointCluster(t)
	ctx := context.Background()
	slow := filepath.Join(c.dataDir, c.nodes[l].id, failpointSlowLog)
	if err := os.WriteFile(slow, []byte("3s"), 0o644); err != nil {
		t.Fatal(err)
	}
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
	if err := os.Remove(slow); err != nil {
		t.Fatal(err)
	}
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
