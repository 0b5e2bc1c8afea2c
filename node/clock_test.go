package node

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/moonraft/moonraft/fsm"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// steppedWall is a wall clock that a test can step, beside the monotonic
// clock.
type steppedWall struct{ offset atomic.Int64 }

func (w *steppedWall) clocks() (wall, mono time.Time) {
	t := time.Now()
	return t.Round(0).Add(time.Duration(w.offset.Load())), t
}

func (w *steppedWall) now() time.Time {
	wall, _ := w.clocks()
	return wall
}

func (w *steppedWall) step(d time.Duration) { w.offset.Add(int64(d)) }

// TestLeaderClock: the leader's clock counts on from the wall clock it read
// last, whatever steps the wall clock takes, until it reads it again.
func TestLeaderClock(t *testing.T) {
	for _, step := range []time.Duration{time.Minute, -time.Minute} {
		t.Run(step.String(), func(t *testing.T) {
			var w steppedWall
			c := newLeaderClock(w.clocks)
			t0, start := c.now(), time.Now()
			w.step(step)
			time.Sleep(20 * time.Millisecond)
			moved := c.now() - t0
			assert.GreaterOrEqual(t, moved, int64(20), "the clock moved on")
			assert.LessOrEqual(t, moved, time.Since(start).Milliseconds()+1, "by the time that passed, not the step")

			c.reset()
			assert.InDelta(t, w.now().UnixMilli(), c.now(), 50, "a reset reads the stepped wall clock")
		})
	}
}

func TestWallStep(t *testing.T) {
	mono := time.Now()
	wall := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name       string
		wall, mono time.Duration // how far each moved
		want       time.Duration
	}{
		{"no step", time.Second, time.Second, 0},
		{"forward", 18 * time.Second, time.Second, 17 * time.Second},
		{"back", 0, time.Second, -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, wallStep(wall, mono, wall.Add(tc.wall), mono.Add(tc.mono)))
		})
	}
	now := time.Now()
	assert.Zero(t, wallStep(now, now, now, now), "a time.Time with a monotonic reading counts as wall too")
}

func TestInstant(t *testing.T) {
	var i instant
	_, ok := i.get()
	assert.False(t, ok, "none at first")
	at := time.Now()
	i.set(at)
	got, ok := i.get()
	require.True(t, ok)
	assert.Equal(t, time.Duration(0), got.Sub(at))
	i.clear()
	_, ok = i.get()
	assert.False(t, ok)
}

// TestWallClockStepExpiresNoSession: a step of the wall clock (NTP, a
// virtual machine set right after a pause) neither expires a client that
// keeps pinging nor moves the state machine's time; the next leader reads
// the stepped wall clock, and its Promote keeps the sessions (RELIABILITY
// finding 34). Before the leader's clock left steps out, the first tick
// after a step of a minute expired every session.
func TestWallClockStepExpiresNoSession(t *testing.T) {
	const ttl = 2 * time.Second
	var w steppedWall
	c := newCluster(t, 3, 50*time.Millisecond, func(cfg *Config) {
		cfg.clocks = w.clocks
		cfg.Params.ClientTTLMs = ttl.Milliseconds()
	})
	l := c.leader()
	nd := c.nodes[l]
	mountSegments(t, nd)
	stateNow := func(nd *Node) (ms int64) {
		nd.sm.read(func(f *fsm.FSM) { ms = f.Stats().NowMs })
		return ms
	}
	before, start := stateNow(nd), time.Now()

	w.step(time.Minute)
	time.Sleep(300 * time.Millisecond) // ticks, and no ping
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		remount, err := nd.Ping(ctx(t), "c1")
		require.NoError(t, err)
		require.False(t, remount, "a client that keeps pinging is told to remount after the wall clock stepped")
	}
	assert.Less(t, stateNow(nd)-before, time.Since(start).Milliseconds()+1000, "the state's time moved by the time that passed, not the step")
	require.Eventually(t, func() bool {
		for _, nd := range c.nodes {
			if testutil.ToFloat64(nd.metrics.clockSteps) != 1 {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "every node counts the step once")

	require.NoError(t, nd.TransferLeadership(ctx(t), ""))
	next := c.leader()
	require.NotEqual(t, l, next)
	remount, err := c.nodes[next].Ping(ctx(t), "c1")
	require.NoError(t, err)
	assert.False(t, remount, "the next leader's Promote keeps the session")
	assert.Greater(t, stateNow(c.nodes[next])-before, time.Minute.Milliseconds(), "the next leader read the stepped wall clock")
}
