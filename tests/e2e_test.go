package tests

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/stretchr/testify/require"
)

// TestFailoverLosesNothing: three real processes; 1,000 objects written
// through the client while the leader is SIGKILLed three times in a row
// (restarted each time). Afterwards every acknowledged object is readable,
// no acknowledged removal is undone, and all nodes have the same applied
// index and digest.
func TestFailoverLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level test; run without -short")
	}
	// No periodic tick (time-driven state is not under test here) and long
	// TTLs, so nodes go quiet and their applied indexes can be compared.
	c := StartCluster(t, t.TempDir(), 3, "--tick", "1h", "--client-ttl", "1h")
	cl, err := moonclient.Dial(moonclient.Config{Endpoints: c.Endpoints(), MaxBackoff: 200 * time.Millisecond})
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c.Leader(ctx, cl)
	for i := 0; i < 3; i++ {
		require.NoError(t, cl.MountSegment(ctx, "e2e", fsm.SegmentSpec{ID: fmt.Sprintf("s%d", i), Name: fmt.Sprintf("host%d", i),
			Base: uint64(i) << 40, Size: 1 << 34}))
	}

	var (
		mu           sync.Mutex
		acked        = map[string]bool{} // PutEnd acknowledged
		removed      = map[string]bool{} // Remove acknowledged
		maybeRemoved = map[string]bool{} // Remove's outcome unknown
		unknown      = 0
	)
	const total = 1000
	writes := make(chan struct{})
	go func() {
		defer close(writes)
		for i := 0; i < total; i++ {
			key := fmt.Sprintf("obj/%04d", i)
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			err := putPair(wctx, cl, key, "e2e", 2)
			wcancel()
			mu.Lock()
			switch {
			case err == nil:
				acked[key] = true
			case errcode.Of(err) == errcode.OutcomeUnknown:
				unknown++
			default:
				t.Errorf("put %s: %v", key, err)
			}
			mu.Unlock()
			if err == nil && i%10 == 0 {
				rerr := cl.Remove(ctx, key, true)
				mu.Lock()
				switch {
				case rerr == nil:
					removed[key] = true
				case errcode.Of(rerr) == errcode.OutcomeUnknown:
					maybeRemoved[key] = true
				default:
					t.Errorf("remove %s: %v", key, rerr)
				}
				mu.Unlock()
			}
		}
	}()
	for kill := 0; kill < 3; kill++ {
		time.Sleep(700 * time.Millisecond)
		l := c.Leader(ctx, cl)
		c.Kill(l, syscall.SIGKILL)
		c.Leader(ctx, cl)
		c.Start(l)
	}
	<-writes
	t.Logf("acknowledged %d puts, %d removes; %d puts and %d removes of unknown outcome", len(acked), len(removed), unknown, len(maybeRemoved))
	require.Greater(t, len(acked), total*9/10)

	for key := range acked {
		_, _, err := cl.GetReplicaList(ctx, key)
		switch {
		case maybeRemoved[key]:
			require.True(t, err == nil || errcode.Of(err) == errcode.ObjectNotFound, "%s: %v", key, err)
		case removed[key]:
			require.Equal(t, errcode.ObjectNotFound, errcode.Of(err), "removed %s is back", key)
		default:
			require.NoError(t, err, "acknowledged %s lost", key)
		}
	}
	sts := c.Converged(ctx, cl)
	for _, st := range sts[1:] {
		require.Equal(t, sts[0].Digest, st.Digest, "%s and %s differ at applied index %d", sts[0].Id, st.Id, st.AppliedIndex)
	}
}

// TestHandoversRefuseNoWrite: a client writes one object after another
// while leadership is handed over three times (what SIGTERM on a leader
// and `moonctl leader transfer` do). Raft refuses proposals during a
// transfer; the leader waits for the transfer's outcome and answers as a
// follower, so the client follows it to the new leader instead of getting
// an error. Only a write in flight as the leader stepped down may end
// OUTCOME_UNKNOWN: at most one a handover.
func TestHandoversRefuseNoWrite(t *testing.T) {
	c := StartCluster(t, t.TempDir(), 3)
	ctx, cl, _ := c.Serving(2 * time.Minute)
	require.NoError(t, cl.MountSegment(ctx, "w", fsm.SegmentSpec{ID: "s", Name: "host", Base: 1 << 40, Size: 1 << 34}))

	const handovers = 3
	stop := make(chan struct{})
	type outcome struct {
		acked  []string
		failed []error
	}
	done := make(chan outcome)
	go func() {
		var o outcome
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- o
				return
			default:
			}
			key := fmt.Sprintf("obj/%05d", i)
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			err := putPair(wctx, cl, key, "w", 1)
			wcancel()
			if err != nil {
				o.failed = append(o.failed, fmt.Errorf("%s: %w", key, err))
			} else {
				o.acked = append(o.acked, key)
			}
		}
	}()
	for range handovers {
		time.Sleep(500 * time.Millisecond)
		require.NoError(t, cl.TransferLeadership(ctx, ""))
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	o := <-done
	t.Logf("%d puts acknowledged, %d failed across %d handovers", len(o.acked), len(o.failed), handovers)
	require.NotEmpty(t, o.acked)
	for _, err := range o.failed {
		require.Equal(t, errcode.OutcomeUnknown, errcode.Of(err), "only a write in flight at a step-down may fail: %v", err)
	}
	require.LessOrEqual(t, len(o.failed), handovers, "writes failed across the handovers: %v", o.failed)
	for _, key := range o.acked {
		_, _, err := cl.GetReplicaList(ctx, key)
		require.NoError(t, err, "acknowledged %s lost", key)
	}
}

// putPair writes key (4 KiB in one slice) for client: PutStart, then PutEnd.
func putPair(ctx context.Context, cl *moonclient.Client, key, client string, replicas uint32) error {
	if _, err := cl.PutStart(ctx, key, []uint64{4096}, moonclient.ReplicateConfig{ReplicaNum: replicas}, client); err != nil {
		return err
	}
	return cl.PutEnd(ctx, key, client)
}
