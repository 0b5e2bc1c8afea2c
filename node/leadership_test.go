package node

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is a monotonic clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeQuorum answers leadership rounds: each round waits on gate (when set)
// and returns err.
type fakeQuorum struct {
	clock  *fakeClock
	term   atomic.Uint64
	rounds atomic.Int64
	gate   chan struct{} // nil: rounds return at once
	err    atomic.Pointer[error]
}

func newTestLeadership(dur time.Duration) (*leadership, *fakeQuorum) {
	q := &fakeQuorum{clock: &fakeClock{t: time.Unix(1000, 0)}}
	q.term.Store(7)
	l := &leadership{
		verify: func() error {
			q.rounds.Add(1)
			if q.gate != nil {
				<-q.gate
			}
			if p := q.err.Load(); p != nil {
				return *p
			}
			return nil
		},
		term: q.term.Load,
		now:  q.clock.now,
		dur:  dur,
	}
	return l, q
}

func TestLeaseStartsBeforeTheRound(t *testing.T) {
	const dur = 450 * time.Millisecond
	l, q := newTestLeadership(dur)
	_, ok := l.lease()
	require.False(t, ok, "no lease before any round")

	q.gate = make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- l.confirm(context.Background()) }()
	require.Eventually(t, func() bool { return q.rounds.Load() == 1 }, 5*time.Second, time.Millisecond)
	// The round takes 100 ms: the lease still counts from its start.
	q.clock.advance(100 * time.Millisecond)
	close(q.gate)
	require.NoError(t, <-done)

	_, ok = l.lease()
	require.True(t, ok)
	assert.Equal(t, dur-100*time.Millisecond, l.remaining(), "the lease runs from the time taken before the round")
	q.clock.advance(dur - 100*time.Millisecond - time.Nanosecond)
	_, ok = l.lease()
	assert.True(t, ok, "still held one nanosecond before its end")
	q.clock.advance(time.Nanosecond)
	_, ok = l.lease()
	assert.False(t, ok, "ends at start + duration")
}

func TestLeaseBoundedByHeartbeatTimeout(t *testing.T) {
	tests := []struct {
		name    string
		lease   time.Duration
		unsafe  bool
		wantErr bool
	}{
		{"default: the longest safe lease", 0, false, false},
		{"shorter than the bound", 200 * time.Millisecond, false, false},
		{"exactly the bound", 450 * time.Millisecond, false, false},
		{"beyond the bound", 451 * time.Millisecond, false, true},
		{"three heartbeat timeouts", 1500 * time.Millisecond, false, true},
		{"beyond the bound, unsafe allowed", 1500 * time.Millisecond, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.ID, cfg.DataDir, cfg.RaftAddr = "n0", t.TempDir(), "127.0.0.1:1"
			cfg.HeartbeatTimeout = 500 * time.Millisecond
			cfg.ReadLease, cfg.UnsafeReadLease = tt.lease, tt.unsafe
			err := cfg.validate()
			if tt.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "heartbeat timeout")
				return
			}
			require.NoError(t, err)
			assert.LessOrEqual(t, cfg.readLease(), 450*time.Millisecond+max(0, tt.lease-450*time.Millisecond))
		})
	}
	assert.Equal(t, 450*time.Millisecond, maxReadLease(500*time.Millisecond), "10% of the heartbeat timeout is kept for clock drift")
}

// TestRestartWaitsOutAReadLease: a restarted node starts Raft, and so can
// vote, no sooner than a read lease after its start began, however long
// its stores took to open: until then a leader may serve reads under a
// lease it helped confirm before it stopped.
func TestRestartWaitsOutAReadLease(t *testing.T) {
	c := newCluster(t, 3, time.Hour)
	l := c.leader()
	f := (l + 1) % 3
	c.stop(f)
	start := time.Now()
	c.start(f)
	assert.GreaterOrEqual(t, time.Since(start), c.cfgs[f].readLease())
	assert.True(t, c.nodes[f].HadState())
}

func TestLeaseEndsWithItsTerm(t *testing.T) {
	l, q := newTestLeadership(time.Second)
	require.NoError(t, l.confirm(context.Background()))
	tok, ok := l.lease()
	require.True(t, ok)
	q.term.Add(1)
	assert.False(t, l.holds(tok), "a lease confirmed in an older term proves nothing")
	_, ok = l.lease()
	assert.False(t, ok)
}

func TestFailedRoundGivesNoLease(t *testing.T) {
	l, q := newTestLeadership(time.Second)
	lost := errors.New("leadership lost")
	q.err.Store(&lost)
	assert.ErrorIs(t, l.confirm(context.Background()), lost)
	_, ok := l.lease()
	assert.False(t, ok)
}

func TestQuorumModeHoldsNoLease(t *testing.T) {
	l, q := newTestLeadership(0)
	require.NoError(t, l.confirm(context.Background()))
	tok, ok := l.lease()
	assert.False(t, ok, "quorum mode: every read waits for a round")
	assert.False(t, l.holds(tok))
	assert.Equal(t, int64(1), q.rounds.Load(), "no background rounds in quorum mode")
}

// TestDropOutrunsARoundInFlight: a lease dropped while a round runs is not
// re-established by that round (it may have been answered before the drop
// was needed, by followers that vote freely after it).
func TestDropOutrunsARoundInFlight(t *testing.T) {
	l, q := newTestLeadership(time.Second)
	q.gate = make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- l.confirm(context.Background()) }()
	require.Eventually(t, func() bool { return q.rounds.Load() == 1 }, 5*time.Second, time.Millisecond)
	l.drop()
	close(q.gate)
	require.NoError(t, <-done, "the round itself succeeded")
	_, ok := l.lease()
	assert.False(t, ok, "a round begun before the drop confirms no lease")

	require.NoError(t, l.confirm(context.Background()))
	_, ok = l.lease()
	assert.True(t, ok, "the next round does")
}

func TestSuspendKeepsTheLeaseAway(t *testing.T) {
	l, _ := newTestLeadership(time.Second)
	require.NoError(t, l.confirm(context.Background()))
	tok, ok := l.lease()
	require.True(t, ok)

	resume := l.suspend()
	assert.False(t, l.holds(tok), "suspend drops the lease at once")
	require.NoError(t, l.confirm(context.Background()), "reads still get quorum rounds")
	_, ok = l.lease()
	assert.False(t, ok, "no lease is established while suspended")
	resume()
	resume() // idempotent
	_, ok = l.lease()
	assert.False(t, ok, "resuming does not bring the dropped lease back")
	require.NoError(t, l.confirm(context.Background()))
	tok2, ok := l.lease()
	assert.True(t, ok)
	assert.False(t, l.holds(tok), "a read that began under the dropped lease is not covered by the new one")
	assert.True(t, l.holds(tok2))
}

// TestHoldsIsCheckedAfterTheRead: a read that began under a lease and
// finished after it lapsed (a pause) is not covered.
func TestHoldsIsCheckedAfterTheRead(t *testing.T) {
	l, q := newTestLeadership(time.Second)
	require.NoError(t, l.confirm(context.Background()))
	tok, ok := l.lease()
	require.True(t, ok)
	q.clock.advance(2 * time.Second) // the read paused here
	assert.False(t, l.holds(tok))
}

// TestRenewedOnlyWhileReadsArrive: reads renew a lease past a quarter of
// its life with one background round and never wait for it; without
// reads, no rounds run and the lease lapses.
func TestRenewedOnlyWhileReadsArrive(t *testing.T) {
	l, q := newTestLeadership(time.Second)
	require.NoError(t, l.confirm(context.Background()))
	require.Equal(t, int64(1), q.rounds.Load())

	// A read: its lease check after the read is what renews.
	read := func() {
		tok, ok := l.lease()
		require.True(t, ok, "reads go on under the lease while a round runs")
		require.True(t, l.holds(tok))
	}
	q.clock.advance(200 * time.Millisecond)
	read()
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, int64(1), q.rounds.Load(), "more than three quarters of the lease are left: no round")

	q.clock.advance(200 * time.Millisecond)
	q.gate = make(chan struct{})
	for range 10 {
		read() // many reads, one background round
	}
	require.Eventually(t, func() bool { return q.rounds.Load() == 2 }, 5*time.Second, time.Millisecond)
	close(q.gate)
	require.Eventually(t, func() bool { return l.remaining() == time.Second }, 5*time.Second, time.Millisecond, "renewed from the round's start")

	q.clock.advance(10 * time.Second) // idle: nobody reads
	time.Sleep(20 * time.Millisecond)
	_, ok := l.lease()
	assert.False(t, ok, "an idle leader's lease lapses")
	assert.Equal(t, int64(2), q.rounds.Load(), "no rounds without reads")
}

// TestConcurrentConfirmsShareRounds: callers arriving while a round runs
// share the next one, which begins after they arrived.
func TestConcurrentConfirmsShareRounds(t *testing.T) {
	l, q := newTestLeadership(0)
	q.gate = make(chan struct{})
	first := make(chan error, 1)
	go func() { first <- l.confirm(context.Background()) }()
	require.Eventually(t, func() bool { return q.rounds.Load() == 1 }, 5*time.Second, time.Millisecond)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() { assert.NoError(t, l.confirm(context.Background())) })
	}
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.waiting) == 20
	}, 5*time.Second, time.Millisecond)
	close(q.gate)
	require.NoError(t, <-first)
	wg.Wait()
	assert.Equal(t, int64(2), q.rounds.Load(), "twenty callers, one more round")
}

func TestConfirmHonoursItsContext(t *testing.T) {
	l, q := newTestLeadership(0)
	q.gate = make(chan struct{})
	defer close(q.gate)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, l.confirm(ctx), context.DeadlineExceeded)
}

// TestLeaderLeaseDefault: a leader steps down only after a whole heartbeat
// timeout without a quorum, as its followers would elect another, unless
// the lease is set (finding 27: at half, a busy leader's own stalls cost it
// the lead).
func TestLeaderLeaseDefault(t *testing.T) {
	cfg := DefaultConfig()
	assert.Equal(t, cfg.HeartbeatTimeout, cfg.leaderLease())
	cfg.LeaderLeaseTimeout = 100 * time.Millisecond
	assert.Equal(t, 100*time.Millisecond, cfg.leaderLease())
}
