package tests

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/transport"
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
	dir := t.TempDir()
	bin, _ := Binaries(t, dir)
	// No periodic tick (time-driven state is not under test here) and long
	// TTLs, so nodes go quiet and their applied indexes can be compared.
	c := StartCluster(t, bin, dir, 3, "--tick", "1h", "--client-ttl", "1h",
		"--heartbeat-timeout", "300ms", "--election-timeout", "300ms")
	cl, err := transport.Dial(transport.ClientConfig{Endpoints: c.Endpoints(), MaxBackoff: 200 * time.Millisecond})
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
			_, err := cl.PutStart(wctx, key, []uint64{4096}, transport.ReplicateConfig{ReplicaNum: 2}, "e2e")
			if err == nil {
				err = cl.PutEnd(wctx, key, "e2e")
			}
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
