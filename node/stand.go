package node

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/raft"
)

// hashicorp/raft's follower looks for its leader at random intervals of one
// to two heartbeat timeouts, so it notices a silent leader one to three
// timeouts after the last contact (0.3–0.9 s at the defaults). And the
// follower that notices first is refused by the other while that one still
// has a leader, so a failover waits for the later of the two (BENCHMARKS:
// up to 1.19 s). Waiting past one heartbeat timeout buys nothing: a leader
// without a quorum for that long has stepped down already (the leader
// lease). So a follower whose leader has been silent for a heartbeat
// timeout, plus a jitter of up to half of one, has Raft look now. The
// jitter keeps the followers from standing together and splitting the
// vote; Raft's own timer still runs, and may look first.

// standJitter draws how long past a heartbeat timeout a follower lets its
// leader be silent before it has Raft look.
func standJitter(hb time.Duration) time.Duration { return rand.N(hb/2 + 1) }

// standWhenSilent has Raft's follower loop look for its leader once it
// has been silent for a heartbeat timeout and a jitter, until ctx ends.
func (n *Node) standWhenSilent(ctx context.Context) {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	jitter := standJitter(n.cfg.HeartbeatTimeout)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n.raft.State() != raft.Follower {
			continue
		}
		last := n.raft.LastContact()
		if leader, _ := n.raft.LeaderWithID(); leader == "" || last.IsZero() {
			continue
		}
		// The current timeout, not the configured one: holdElections may
		// have lengthened it.
		silent := time.Since(last)
		if silent < n.raft.ReloadableConfig().HeartbeatTimeout+jitter {
			continue
		}
		n.log.Info("the leader is silent: looking for it now instead of at Raft's next random check",
			"silent", silent.Round(time.Millisecond))
		if err := n.lookForLeader(); err != nil {
			n.log.Error("could not have Raft look for its leader", "error", err)
		}
		jitter = standJitter(n.cfg.HeartbeatTimeout)
	}
}

// lookForLeader has Raft's follower loop check its leader's last contact
// now, and stand for election if that is a heartbeat timeout old. Raft
// fires a follower's timer when a reload shortens its heartbeat timeout, so
// the timeouts are lengthened by a nanosecond and restored.
func (n *Node) lookForLeader() error {
	n.timeoutsMu.Lock()
	defer n.timeoutsMu.Unlock()
	rc := n.raft.ReloadableConfig()
	longer := rc
	longer.HeartbeatTimeout++
	longer.ElectionTimeout++
	if err := n.raft.ReloadConfig(longer); err != nil {
		return err
	}
	return n.raft.ReloadConfig(rc)
}
