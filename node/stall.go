package node

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// The kinds of stall a node reports (Config.OnStall, the stalls_total
// metric): the moments after which a flight recorder's trace of the seconds
// before says most (RELIABILITY findings 10 and 27).
const (
	// stallSched: this node's goroutines waited to run for longer than a
	// quarter of the heartbeat timeout: its process was short of CPU (a
	// burst of runnable goroutines, the collector, a busy host), stopped
	// by the kernel (page faults), or stopped outright.
	stallSched = "sched"
	// stallLease: it lost a leadership it was not handing over: no
	// quorum answered it within the leader lease, or a leader of a newer
	// term took over.
	stallLease = "leadership-lost"
	// stallSilent: it stood for election after hearing nothing from the
	// leader it had for a heartbeat timeout.
	stallSilent = "leader-silent"
)

// stallTick is how often the stall watcher looks at the clock. It does
// nothing else, so a tick that comes late says how long a goroutine of
// this process waited to run: Raft's heartbeats and lease checks wait as
// long (Go's run queues are first come, first served).
const stallTick = 10 * time.Millisecond

// watchStalls reports this node's stalls until ctx ends.
func (n *Node) watchStalls(ctx context.Context) {
	changes := make(chan raft.Observation, 4)
	obs := raft.NewObserver(changes, false, n.unplannedChange())
	n.raft.RegisterObserver(obs)
	defer n.raft.DeregisterObserver(obs)
	threshold := n.cfg.HeartbeatTimeout / 4
	t := time.NewTicker(stallTick)
	defer t.Stop()
	lastWall, last := n.cfg.clocks()
	for {
		var changed any // the Raft state a change left, if one woke the watcher
		select {
		case <-ctx.Done():
			return
		case o := <-changes:
			changed = o.Data
		case <-t.C:
		}
		// Whatever woke the watcher, a wake this late follows a stall; it
		// goes first, since a change it caused comes at the same moment.
		wall, now := n.cfg.clocks()
		if late := now.Sub(last) - stallTick; late >= threshold {
			n.log.Warn("this node's goroutines waited to run: its process is short of CPU (a burst of requests, the collector) or was stopped",
				"waited", late.Round(time.Millisecond))
			n.stalled(stallSched)
		}
		if step := wallStep(lastWall, last, wall, now); step >= stepMin || step <= -stepMin {
			n.log.Warn("the wall clock stepped: this node's leader clock leaves the step out until it next becomes leader",
				"step", step.Round(time.Millisecond))
			n.metrics.clockSteps.Inc()
		}
		switch changed {
		case nil:
		case raft.Follower:
			n.log.Warn("lost the leadership without handing it over: no quorum answered within the leader lease, or a newer term's leader took over",
				"leader_lease", n.cfg.leaderLease())
			n.stalled(stallLease)
		default:
			n.stalled(stallSilent)
		}
		// The watcher's own work is not a stall.
		lastWall, last = n.cfg.clocks()
	}
}

// stalled counts a stall of kind and hands it to Config.OnStall.
func (n *Node) stalled(kind string) {
	n.metrics.stalls.WithLabelValues(kind).Inc()
	if n.cfg.OnStall != nil {
		n.cfg.OnStall(kind)
	}
}

// unplannedChange passes the Raft state changes that are stalls: a leader
// that becomes a follower while it hands over no leadership, and a
// candidate that had a leader and heard nothing from it for a heartbeat
// timeout (not one standing at a handover's request, nor at start). Raft
// calls it on its main loop as the state changes, so a handover's end
// cannot race it.
func (n *Node) unplannedChange() raft.FilterFn {
	var prev atomic.Uint32
	return func(o *raft.Observation) bool {
		s, ok := o.Data.(raft.RaftState)
		if !ok {
			return false
		}
		was := raft.RaftState(prev.Swap(uint32(s)))
		switch s {
		case raft.Follower:
			return was == raft.Leader && !n.handover.running()
		case raft.Candidate:
			last := n.raft.LastContact()
			return !last.IsZero() && time.Since(last) >= n.cfg.HeartbeatTimeout
		}
		return false
	}
}
