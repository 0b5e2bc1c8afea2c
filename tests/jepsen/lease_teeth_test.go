package jepsen

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// failpointStallLog is node/failpoint_on.go's switch: while this file is in
// a node's data dir, its Raft log writes hang.
const failpointStallLog = "failpoint-stall-log"

// TestStaleReadsNeedAnOverlongLease shows what the read lease protects and
// that the checks see it fail: the leader's disk stalls (its Raft loop
// stops, so hashicorp/raft cannot step it down, while its client API goes
// on) and it is cut off from both followers, which elect a new leader; a
// key is removed there; reads keep going to the old leader. A read started
// after the removal was acknowledged that still finds the key is stale.
// With the default lease (90% of the heartbeat timeout) there must be none:
// the lease is over before the followers can elect. With a lease of five
// heartbeat timeouts (--unsafe-read-lease) the same rounds must show them.
func TestStaleReadsNeedAnOverlongLease(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level fault test; run without -short")
	}
	dir := t.TempDir()
	bin, err := buildMoonraft(dir, "failpoints")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		lease     time.Duration
		args      []string
		wantStale bool
	}{
		{"default lease", 270 * time.Millisecond, nil, false},
		{"lease of five heartbeat timeouts", 1500 * time.Millisecond, []string{"--read-lease", "1500ms", "--unsafe-read-lease"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			run := t.TempDir()
			c, err := startCluster(ctx, bin, run, filepath.Join(run, "data"), clusterConfig{nodes: 3, logLevel: "warn", extraArgs: tc.args}, t.Logf)
			if c != nil {
				defer c.close()
			}
			if err != nil {
				t.Fatal(err)
			}
			seg := fsm.SegmentSpec{ID: "teeth-seg", Name: "teeth-host", Base: 1 << 40, Size: 1 << 30}
			if err := retry(ctx, func(ctx context.Context) error { return c.admin.MountSegment(ctx, "teeth", seg) }); err != nil {
				t.Fatal(err)
			}
			const rounds = 8
			var stale, after int
			for r := range rounds {
				s, a, err := staleReadRound(ctx, c, fmt.Sprintf("teeth/%d", r), tc.lease)
				if err != nil {
					t.Fatalf("round %d: %v", r, err)
				}
				t.Logf("round %d: %d of %d reads begun after the removal was acknowledged found the key", r, s, a)
				stale, after = stale+s, after+a
			}
			t.Logf("%s: %d stale reads of %d begun after the removal, in %d rounds", tc.name, stale, after, rounds)
			switch {
			case tc.wantStale && stale == 0:
				t.Errorf("an over-long lease served no stale read: the check would not see one")
			case !tc.wantStale && stale > 0:
				t.Errorf("%d stale reads under the default lease", stale)
			}
		})
	}
}

// freshLease waits until node l holds a read lease renewed a moment ago
// (more than 90% of its length left).
func freshLease(ctx context.Context, c *cluster, l int, lease time.Duration) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.admin.Status(cctx, c.nodes[l].grpcAddr)
		cancel()
		if err == nil && time.Duration(st.GetReadLeaseRemainingMs())*time.Millisecond > lease*9/10 {
			return nil
		}
		if err := sleepCtx(ctx, time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s holds no fresh read lease", c.nodes[l].id)
}

// newLeader waits for a node other than old, the leader when the fault
// began, to serve as leader: it can only be in a later term (old may have
// followed it there already).
func newLeader(ctx context.Context, c *cluster, old int, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		sts := c.statuses(300 * time.Millisecond)
		for i, st := range sts {
			if i != old && st != nil && st.Role == "leader" && st.Promoted {
				return i, nil
			}
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return -1, err
		}
	}
	return -1, fmt.Errorf("no new leader within %v", within)
}

// staleReadRound runs the scenario once on key and returns how many reads
// that began after the removal was acknowledged still found the key, and
// how many were answered (found or not) in all after it.
func staleReadRound(ctx context.Context, c *cluster, key string, lease time.Duration) (stale, after int, err error) {
	if err := retry(ctx, func(ctx context.Context) error {
		if _, err := c.admin.PutStart(ctx, key, []uint64{64}, moonclient.ReplicateConfig{ReplicaNum: 1}, "teeth"); err != nil {
			return err
		}
		return c.admin.PutEnd(ctx, key, "teeth")
	}); err != nil {
		return 0, 0, err
	}
	l, err := c.waitLeader(ctx, 30*time.Second)
	if err != nil {
		return 0, 0, err
	}
	old := c.nodes[l]
	cc, err := grpc.NewClient(old.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, 0, err
	}
	defer cc.Close()
	type read struct {
		start time.Time
		found bool
	}
	var (
		mu    sync.Mutex
		reads []read
		wg    sync.WaitGroup
	)
	rctx, stopReads := context.WithCancel(ctx)
	defer stopReads()
	wg.Go(func() {
		mc := moonraftpb.NewMasterClient(cc)
		for rctx.Err() == nil {
			start := time.Now()
			cctx, cancel := context.WithTimeout(rctx, 300*time.Millisecond)
			resp, err := mc.GetReplicaList(cctx, &moonraftpb.GetReplicaListRequest{Key: key})
			cancel()
			if err != nil {
				continue
			}
			// Only answers count: found, or not found; not a refusal.
			switch errcode.Code(resp.GetStatus().GetCode()) {
			case errcode.OK, errcode.ObjectNotFound:
				mu.Lock()
				reads = append(reads, read{start, resp.GetStatus().GetCode() == int32(errcode.OK)})
				mu.Unlock()
			}
		}
	})
	// The worst case: the lease renewed just before the disk stalls.
	if err := freshLease(ctx, c, l, lease); err != nil {
		return 0, 0, err
	}

	stall := filepath.Join(c.dataDir, old.id, failpointStallLog)
	if err := os.WriteFile(stall, nil, 0o644); err != nil {
		return 0, 0, err
	}
	defer os.Remove(stall)
	time.Sleep(150 * time.Millisecond) // the next tick's log write hangs
	if err := c.isolate(l); err != nil {
		return 0, 0, err
	}

	// The removal goes straight to the new leader once it serves (asked
	// earlier, a follower would send it to the stalled old one).
	nl, err := newLeader(ctx, c, l, 10*time.Second)
	if err != nil {
		return 0, 0, err
	}
	cl, err := moonclient.Dial(moonclient.Config{Endpoints: []string{c.nodes[nl].grpcAddr}})
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	var removed time.Time
	if err := retry(ctx, func(ctx context.Context) error {
		// Not found: an earlier attempt of unknown outcome removed it.
		err := cl.Remove(ctx, key, true)
		if err == nil || errcode.Of(err) == errcode.ObjectNotFound {
			removed = time.Now()
			return nil
		}
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("remove at the new leader: %w", err)
	}
	time.Sleep(time.Second) // reads at the old leader go on
	stopReads()
	wg.Wait()
	mu.Lock()
	for _, r := range reads {
		if r.start.After(removed) {
			after++
			if r.found {
				stale++
			}
		}
	}
	mu.Unlock()

	if err := os.Remove(stall); err != nil {
		return 0, 0, err
	}
	if err := c.healAll(); err != nil {
		return 0, 0, err
	}
	_, err = c.waitLeader(ctx, 30*time.Second)
	return stale, after, err
}
