package node

import (
	"context"
	"time"
)

// A node restarted on its data dir, or joining with a snapshot, loads the
// snapshot (hashicorp/raft logs that) and then applies the log committed
// since, which at millions of objects takes seconds to minutes: issue 41
// asks for progress in the log through both. catchUp watches how far the
// applied index trails Raft's commit index and says so while it does.

const (
	// catchUpMin is how many committed entries the state must trail by
	// for it to be catching up; a busy node trails by less all the time.
	catchUpMin = 1024
	// catchUpAfter is how long it must trail before the first line, and
	// catchUpEvery the time between lines after it.
	catchUpAfter = time.Second
	catchUpEvery = 5 * time.Second
)

// catchUp is the progress of one episode of trailing the commit index.
type catchUp struct {
	started time.Time // the node's start, for the lines' since_start
	since   time.Time // when the state began to trail; zero: it does not
	from    uint64    // the applied index then
	at      time.Time // the episode's last line, or since before the first
	last    uint64    // the applied index at at
	logged  bool      // a line of this episode was logged
}

// observe takes the applied and commit indexes at now and returns the line
// to log, if any: "catching up with the log" once the state has trailed by
// catchUpMin entries for catchUpAfter and every catchUpEvery after, and
// "caught up with the log" when an episode that was logged ends.
func (c *catchUp) observe(now time.Time, applied, commit uint64) (msg string, args []any) {
	behind := commit - min(applied, commit)
	if behind < catchUpMin {
		if c.logged {
			msg, args = "caught up with the log", []any{
				"applied", applied, "entries", applied - c.from, "took", now.Sub(c.since).Round(time.Millisecond),
				"since_start", now.Sub(c.started).Round(time.Millisecond)}
		}
		c.since, c.logged = time.Time{}, false
		return msg, args
	}
	if c.since.IsZero() {
		c.since, c.from, c.at, c.last = now, applied, now, applied
		return "", nil
	}
	wait := catchUpEvery
	if !c.logged {
		wait = catchUpAfter
	}
	if now.Sub(c.at) < wait {
		return "", nil
	}
	rate := float64(applied-min(c.last, applied)) / now.Sub(c.at).Seconds()
	args = []any{"applied", applied, "committed", commit, "behind", behind, "entries_per_sec", int64(rate)}
	if rate > 0 {
		args = append(args, "eta", time.Duration(float64(behind)/rate*float64(time.Second)).Round(time.Second))
	}
	c.at, c.last, c.logged = now, applied, true
	return "catching up with the log", args
}

// catchUpLoop logs the state's progress whenever it trails the committed
// log (catchUp), checking every second until ctx ends, and lets the log
// store forget the entries it kept for the state machine once applied.
func (n *Node) catchUpLoop(ctx context.Context, started time.Time) {
	c := &catchUp{started: started}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			// The state machine's own applied index: Raft's runs ahead,
			// counting entries handed to the state machine, not applied.
			applied := n.sm.appliedIndex.Load()
			n.store.Forget(applied)
			if msg, args := c.observe(now, applied, n.raft.CommitIndex()); msg != "" {
				n.log.Info(msg, args...)
			}
		}
	}
}
