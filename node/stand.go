package node

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/raft"
)

// hashicorp/raft's follower looks for its leader at random intervals of one
// to two heartbeat timeouts, so it notices a silent leader one to three
// timeouts after the last contact (0.3–0.9 s at the defaults; BENCHMARKS:
// failovers of up to 1.19 s). Waiting past one heartbeat timeout buys
// nothing: a leader
// without a quorum for that long has stepped down already (the leader
// lease). So a follower whose leader has been silent for a heartbeat
// timeout, plus a jitter of up to half of one, has Raft look now. The
// jitter keeps the followers from standing together and splitting the
// vote; Raft's own timer still runs, and may look first. The follower that
// stands first used to be refused by the other while that one still knew
// the dead leader; dropSilentLeader and raftnet's pre-vote hooks let it
// win (raftnet/elections.go).

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
		hb := n.raft.ReloadableConfig().HeartbeatTimeout
		silent, wait := time.Since(last), hb+jitter
		if asked, ok := n.candidateAsked.get(); ok && time.Since(asked) < hb {
			// A candidate stands already: this node joins the election
			// the moment it may, so that the candidate is not refused
			// twice (raftnet/elections.go).
			wait = hb
		}
		if silent < wait {
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

// dropLeaderWait bounds how long a pre-vote request waits for Raft to drop
// a silent leader: Raft's main loop does it at once unless it is in a log
// write, and the request goes on regardless.
const dropLeaderWait = 50 * time.Millisecond

// dropSilentLeader runs before a pre-vote request reaches Raft (raftnet's
// BeforePreVote). A follower whose leader has been silent for a heartbeat
// timeout has Raft look for it now, not after its jitter: Raft then drops
// the leader and stands, and the request is not refused for a leader that
// is gone. A leader heard from within the timeout is kept, as Raft's own
// timer would keep it, but standWhenSilent looks for it as soon as the
// timeout is up.
func (n *Node) dropSilentLeader() {
	if n.raft.State() != raft.Follower {
		return
	}
	last := n.raft.LastContact()
	silent := time.Since(last)
	if leader, _ := n.raft.LeaderWithID(); leader == "" || last.IsZero() {
		return
	}
	if silent < n.raft.ReloadableConfig().HeartbeatTimeout {
		n.candidateAsked.set(time.Now())
		return
	}
	n.log.Info("asked for a pre-vote while the leader is silent: looking for it now, so that a leader that is gone does not refuse the candidate",
		"silent", silent.Round(time.Millisecond))
	if err := n.lookForLeader(); err != nil {
		n.log.Error("could not have Raft look for its leader", "error", err)
		return
	}
	for deadline := time.Now().Add(dropLeaderWait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if leader, _ := n.raft.LeaderWithID(); leader == "" {
			return
		}
	}
}
