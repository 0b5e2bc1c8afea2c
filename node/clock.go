package node

import (
	"sync/atomic"
	"time"
)

// leaderClock is the time a leader writes into its commands and stamps its
// clients' pings and reads with (Config.Now by default): the wall clock as
// it read it when it last became leader, counted on with the monotonic
// clock. A step of the wall clock — NTP or chrony stepping it, a virtual
// machine set right after a pause — does not move it: the state
// machine's time would jump with it, and every session, read lease and
// soft pin would end that many seconds early, while their clients were
// still pinging and reading (docs/RELIABILITY.md, finding 34). The
// monotonic clock follows NTP's slewing, so only steps are left out; a new
// term reads the wall clock again, and its Promote, which extends every
// session and lease from its own time, covers whatever step that brings.
type leaderClock struct {
	clocks func() (wall, mono time.Time)
	anchor atomic.Pointer[clockAnchor]
}

type clockAnchor struct {
	wallMs int64
	mono   time.Time
}

// readClocks reads the wall clock and the monotonic clock at one moment
// (Config.clocks): a time.Time from time.Now holds both.
func readClocks() (wall, mono time.Time) {
	t := time.Now()
	return t, t
}

func newLeaderClock(clocks func() (wall, mono time.Time)) *leaderClock {
	c := &leaderClock{clocks: clocks}
	c.reset()
	return c
}

// reset reads the wall clock again.
func (c *leaderClock) reset() {
	wall, mono := c.clocks()
	c.anchor.Store(&clockAnchor{wallMs: wall.UnixMilli(), mono: mono})
}

// now is the time in Unix milliseconds.
func (c *leaderClock) now() int64 {
	a := c.anchor.Load()
	return a.wallMs + time.Since(a.mono).Milliseconds()
}

// wallStep is how far the wall clock moved beyond the monotonic one from
// (wall0, mono0) to (wall1, mono1): a step, if it is large (stepMin).
func wallStep(wall0, mono0, wall1, mono1 time.Time) time.Duration {
	return wall1.Round(0).Sub(wall0.Round(0)) - mono1.Sub(mono0)
}

// stepMin is the least wall-clock step a node reports: NTP slews by at
// most 0.5 ms a second, and steps by 128 ms or more (chrony by a second).
const stepMin = 100 * time.Millisecond

// epoch is this process's start on the monotonic clock: instants kept in
// atomics count from it, not from the wall clock.
var epoch = time.Now()

// instant is a moment kept in an atomic, or none; measured from the
// monotonic clock, so a wall-clock step cannot lengthen or shorten the time
// since it.
type instant struct{ ns atomic.Int64 } // since epoch, plus one; 0: none

func (i *instant) set(t time.Time) { i.ns.Store(int64(t.Sub(epoch)) + 1) }

func (i *instant) clear() { i.ns.Store(0) }

// get returns the moment, and whether there is one.
func (i *instant) get() (time.Time, bool) {
	ns := i.ns.Load()
	return epoch.Add(time.Duration(ns - 1)), ns != 0
}
