package node

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeExport is the export the pacer sees: a backlog, the command clock and
// the wall clock, moved by the test.
type fakeExport struct {
	mu      sync.Mutex
	backlog uint64
	nowMs   int64
	now     time.Time
}

func (e *fakeExport) pacer(soft, hard uint64, age time.Duration) *pacer {
	e.now = time.Unix(1000, 0)
	p := &pacer{softEntries: soft, softAge: age, hard: hard, maxWait: time.Second,
		backlog: func() uint64 { e.mu.Lock(); defer e.mu.Unlock(); return e.backlog },
		nowMs:   func() int64 { e.mu.Lock(); defer e.mu.Unlock(); return e.nowMs },
		now:     func() time.Time { e.mu.Lock(); defer e.mu.Unlock(); return e.now },
	}
	p.start()
	return p
}

func (e *fakeExport) set(backlog uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.backlog = backlog
}

// admitAsync runs admit in the background; its result arrives on the channel.
func admitAsync(p *pacer, ctx context.Context, need uint64) chan error {
	out := make(chan error, 1)
	go func() {
		release, err := p.admit(ctx, need)
		if err == nil {
			release()
		}
		out <- err
	}()
	return out
}

func waiting(p *pacer) int { return p.stats().Waiting }

func TestPacerAdmitsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backlog uint64
		need    uint64
		setup   func(p *pacer)
	}{
		{name: "no entries", backlog: 1000, need: 0},
		{name: "under the soft bound", backlog: 50, need: 10},
		{name: "up to the soft bound", backlog: 90, need: 10},
		{name: "larger than the bound, alone", backlog: 0, need: 500},
		{name: "larger than the bound, backlog at three quarters", backlog: 75, need: 500},
		{name: "etcd unreachable: nothing to pace to", backlog: 150, need: 10,
			setup: func(p *pacer) { p.failed(errors.New("connection refused")) }},
		{name: "not exporting (a follower)", backlog: 150, need: 10, setup: func(p *pacer) { p.stop() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e fakeExport
			p := e.pacer(100, 1000, time.Minute)
			e.set(tc.backlog)
			if tc.setup != nil {
				tc.setup(p)
			}
			release, err := p.admit(context.Background(), tc.need)
			require.NoError(t, err)
			release()
			assert.Zero(t, p.reserved)
		})
	}
}

// Past the soft bound a write waits until etcd takes enough, and goes then.
func TestPacerWaitsForEtcd(t *testing.T) {
	var e fakeExport
	p := e.pacer(100, 1000, time.Minute)
	e.set(95)
	res := admitAsync(p, context.Background(), 10)
	require.Eventually(t, func() bool { return waiting(p) == 1 }, time.Second, time.Millisecond)
	e.set(80)
	p.took(15)
	assert.NoError(t, <-res)
	assert.Equal(t, uint64(1), p.stats().Paced)
}

// The oldest entry's age is a bound as well as the count.
func TestPacerAgeBound(t *testing.T) {
	var e fakeExport
	p := e.pacer(100, 1000, 10*time.Second)
	e.set(5)
	p.setOldest(pendingAt(t, 1_000))
	e.nowMs = 11_000 // the oldest waits for 10 s
	res := admitAsync(p, context.Background(), 1)
	require.Eventually(t, func() bool { return waiting(p) == 1 }, time.Second, time.Millisecond)
	p.setOldest(pendingAt(t, 5_000)) // etcd took the old ones
	assert.NoError(t, <-res)
}

// pendingAt is a one-entry ring whose entry was made at ms.
func pendingAt(t *testing.T, ms int64) fsm.Pending {
	t.Helper()
	f := fsm.New()
	r := f.ApplyCommand(&fsm.MountSegment{NowMs: ms, ClientID: "c", Segment: fsm.SegmentSpec{ID: "s", Name: "h", Size: 1 << 20}})
	require.NoError(t, r.Err)
	require.NoError(t, f.ApplyCommand(&fsm.PutStart{NowMs: ms, Key: "k", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c"}).Err)
	require.NoError(t, f.ApplyCommand(&fsm.PutEnd{NowMs: ms, Key: "k", ClientID: "c"}).Err)
	pend := f.Ring()
	got, ok := pend.OldestMs()
	require.True(t, ok)
	require.Equal(t, ms, got)
	return pend
}

// Writes are let in oldest first: a small write does not pass a large one
// waiting for room.
func TestPacerFirstComeFirstServed(t *testing.T) {
	var e fakeExport
	p := e.pacer(100, 1000, time.Minute)
	e.set(100)
	big := admitAsync(p, context.Background(), 50)
	require.Eventually(t, func() bool { return waiting(p) == 1 }, time.Second, time.Millisecond)
	small := admitAsync(p, context.Background(), 1)
	require.Eventually(t, func() bool { return waiting(p) == 2 }, time.Second, time.Millisecond)
	e.set(90)
	p.took(10) // room for the small one, not for the big one ahead of it
	assert.Equal(t, 2, waiting(p))
	e.set(40)
	p.took(50)
	assert.NoError(t, <-big)
	assert.NoError(t, <-small)
}

// A write that the measured rate says cannot go before its deadline is
// answered at once; one with no measure waits out its deadline less the
// margin, and is answered TOO_MANY_REQUESTS, unapplied, either way.
func TestPacerAnswersEarly(t *testing.T) {
	var e fakeExport
	p := e.pacer(100, 100_000, time.Minute)
	e.set(10_000)

	dctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.admit(dctx, 10)
	assert.Equal(t, errcode.TooManyRequests, errcode.Of(err), "%v", err)
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "with no rate measured it waits")
	assert.Contains(t, err.Error(), "not measured yet")

	// 1,000 entries a second measured over a busy second: 9,910 entries
	// past the bound take ~10 s, far past the deadline.
	e.now = e.now.Add(time.Millisecond)
	p.took(1)
	e.now = e.now.Add(time.Second)
	p.took(999)
	require.InDelta(t, 1000, p.stats().TakeRate, 1)
	dctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start = time.Now()
	_, err = p.admit(dctx, 10)
	assert.Equal(t, errcode.TooManyRequests, errcode.Of(err), "%v", err)
	assert.Less(t, time.Since(start), time.Second, "answered at once, not at the deadline")
	assert.Contains(t, err.Error(), "would wait ~9.91s")
	assert.Zero(t, waiting(p))
	assert.Equal(t, uint64(2), p.stats().Refused)
}

// The hard bound refuses with ETCD_OPERATION_ERROR and says which case it
// is: etcd unreachable (since when, and why) or etcd slower than writes.
func TestPacerHardBound(t *testing.T) {
	var e fakeExport
	p := e.pacer(100, 1000, time.Minute)
	p.failed(errors.New("dial tcp 127.0.0.1:2379: connection refused"))
	e.set(995)
	e.mu.Lock()
	e.now = e.now.Add(42 * time.Second)
	e.mu.Unlock()
	release, err := p.admit(context.Background(), 5)
	require.NoError(t, err, "up to the hard bound while etcd is unreachable")
	_, err = p.admit(context.Background(), 1)
	assert.Equal(t, errcode.EtcdOperationError, errcode.Of(err))
	assert.Contains(t, err.Error(), "etcd has not taken OpLog entries for 42s")
	assert.Contains(t, err.Error(), "connection refused")
	release()

	p.took(1) // etcd answers again, slowly
	e.set(1000)
	_, err = p.admit(context.Background(), 1)
	assert.Equal(t, errcode.EtcdOperationError, errcode.Of(err))
	assert.Contains(t, err.Error(), "takes ~")
}

// When etcd fails, waiting writes go: the ring holds them until the hard
// bound.
func TestPacerReleasesWaitersWhenEtcdFails(t *testing.T) {
	var e fakeExport
	p := e.pacer(100, 1000, time.Minute)
	e.set(100)
	res := admitAsync(p, context.Background(), 10)
	require.Eventually(t, func() bool { return waiting(p) == 1 }, time.Second, time.Millisecond)
	p.failed(errors.New("context deadline exceeded"))
	assert.NoError(t, <-res)
	assert.True(t, p.stats().EtcdDown())
}

// admission is the outcome of an admit run in the background, held until
// the test releases it.
type admission struct {
	release func()
	err     error
}

func admitHeld(admit func(context.Context, uint64) (func(), error), ctx context.Context, need uint64) chan admission {
	out := make(chan admission, 1)
	go func() {
		release, err := admit(ctx, need)
		out <- admission{release, err}
	}()
	return out
}

func backgroundWaiting(p *pacer) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.background)
}

// The leader's bulk REMOVEs go while the backlog stays under a quarter of
// the soft bound, and client writes beside them go at once; once a client
// write must wait, a waiting release takes its turn ahead of it.
func TestPacerBackgroundYields(t *testing.T) {
	var e fakeExport
	p := e.pacer(100, 1000, time.Minute)
	bg := context.Background()

	e.set(15)
	release, err := p.admitBackground(bg, 10)
	require.NoError(t, err, "room under a quarter of the bound")
	release()

	e.set(30)
	rel := admitHeld(p.admitBackground, bg, 10)
	require.Eventually(t, func() bool { return backgroundWaiting(p) == 1 }, time.Second, time.Millisecond)
	release, err = p.admit(bg, 40)
	require.NoError(t, err, "a client write goes at once beside a release that waits")
	release()
	assert.Zero(t, p.stats().Paced)
	e.set(15)
	p.took(15)
	a := <-rel
	require.NoError(t, a.err, "admitted once the backlog is under a quarter of the bound")
	a.release()

	e.set(95)
	rel = admitHeld(p.admitBackground, bg, 10)
	require.Eventually(t, func() bool { return backgroundWaiting(p) == 1 }, time.Second, time.Millisecond)
	write := admitHeld(p.admit, bg, 10)
	require.Eventually(t, func() bool { return waiting(p) == 2 }, time.Second, time.Millisecond, "the release joined the line ahead of the write")
	assert.Zero(t, backgroundWaiting(p))
	e.set(85)
	p.took(10) // room for one of them under the full bound: the release, first in line
	a = <-rel
	require.NoError(t, a.err)
	assert.Equal(t, 1, waiting(p), "the write waits behind it")
	a.release()
	w := <-write
	require.NoError(t, w.err)
	w.release()

	e.set(60)
	dctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	_, err = p.admitBackground(dctx, 10)
	assert.Equal(t, errcode.TooManyRequests, errcode.Of(err), "%v", err)
	assert.Zero(t, backgroundWaiting(p))
	assert.Zero(t, p.reserved)
	assert.Zero(t, p.stats().Refused, "a release is not a refused client write")
}

func TestRateMeter(t *testing.T) {
	t0 := time.Unix(0, 0)
	var r rateMeter
	r.took(100, t0)
	r.took(900, t0.Add(time.Second))
	assert.InDelta(t, 1000, r.perSec, 0.1, "a busy second")
	r.took(1000, t0.Add(1500*time.Millisecond))
	r.took(1000, t0.Add(2*time.Second))
	assert.InDelta(t, 1125, r.perSec, 0.1, "a busy window moves the estimate an eighth of the way: 1000 + (2000 - 1000) / 8")

	r.idle = true // the exporter waited for entries: only a floor
	r.took(100, t0.Add(3*time.Second))
	assert.InDelta(t, 1125, r.perSec, 0.1, "an idle window does not lower the estimate")

	// A dip of three seconds to a fifth of the rate, as the leader's own
	// collections make it, takes the estimate down by about a quarter
	// (half and half took it down by 70 %).
	r = rateMeter{perSec: 10_000}
	at := t0
	for range 3 {
		r.took(0, at)
		at = at.Add(time.Second)
		r.took(2_000, at)
	}
	assert.InDelta(t, 10_000-8_000*(1-0.875*0.875*0.875), r.perSec, 1, "after a 3 s dip to 2,000 a second")
	assert.Greater(t, r.perSec, 6_000.0)
}

func TestEntriesOf(t *testing.T) {
	put := &fsm.PutStart{Key: "a"}
	for _, tc := range []struct {
		cmd  fsm.Command
		want uint64
	}{
		{put, 1},
		{&fsm.PutEnd{Key: "a"}, 0},
		{&fsm.PutRevoke{Key: "a"}, 0},
		{&fsm.Remove{Key: "a"}, 1},
		{&fsm.UpsertStart{PutStart: fsm.PutStart{Key: "a"}}, 2},
		{&fsm.MountSegment{}, 0},
		{&fsm.UnmountSegment{SegmentID: "s"}, 0}, // bulk: deferred past the direct count
		{&fsm.RemoveAll{}, 0},
		{&fsm.Batch{Cmds: []fsm.Command{put, put, &fsm.PutEnd{Key: "a"}}}, 2},
	} {
		assert.Equal(t, tc.want, entriesOf(tc.cmd), "%T", tc.cmd)
	}
}

// With etcd's rate measured, the bound in entries is what etcd takes in
// --export-soft-age when that is fewer: the backlog's age stays near its
// bound, and writes go as room opens, not all at once when the oldest
// entry goes under the age.
func TestPacerBoundFollowsRate(t *testing.T) {
	var e fakeExport
	p := e.pacer(100_000, 1_000_000, 10*time.Second)
	e.now = e.now.Add(time.Millisecond)
	p.took(1)
	e.now = e.now.Add(time.Second)
	p.took(999) // 1,000 entries a second: 10,000 in 10 s
	require.Equal(t, uint64(10_000), p.bound())
	p.setOldest(pendingAt(t, 1_000))
	e.nowMs = 60_000 // the oldest entry is far past the age: the rate's bound rules

	e.set(9_990)
	release, err := p.admit(context.Background(), 10)
	require.NoError(t, err)
	release()
	e.set(9_995)
	res := admitAsync(p, context.Background(), 10)
	require.Eventually(t, func() bool { return waiting(p) == 1 }, time.Second, time.Millisecond)
	e.set(9_000)
	p.took(995)
	assert.NoError(t, <-res)
}
