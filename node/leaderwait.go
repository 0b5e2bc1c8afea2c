package node

import (
	"context"
	"sync"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/service"
)

// leaderSignal wakes requests waiting out an election. It fires whenever a
// Promote is applied here and when this node finishes its own promotion —
// the moments a waiting request's answer changes.
type leaderSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

func newLeaderSignal() *leaderSignal { return &leaderSignal{ch: make(chan struct{})} }

// next returns a channel closed at the next signal.
func (s *leaderSignal) next() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ch
}

func (s *leaderSignal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.ch)
	s.ch = make(chan struct{})
}

// AwaitLeader returns nil when this node is the promoted leader, and
// otherwise the answer notLeader gives. While no live promoted leader is
// known (an election is on) it first waits for one: the client is then sent
// to the new leader the moment it serves, instead of backing off blind and
// arriving late. The wait is bounded by two rounds of failure detection
// and election (room for a split vote) and by half the request's remaining
// time, so a node cut off from the majority answers in time for the client
// to try another. Under service.NoWait it gives up instead.
func (n *Node) AwaitLeader(ctx context.Context) error {
	if n.IsLeader() {
		return nil
	}
	if service.MustNotWait(ctx) {
		return errWouldWait
	}
	bound := 2 * (n.cfg.HeartbeatTimeout + n.cfg.ElectionTimeout)
	if d, ok := ctx.Deadline(); ok {
		bound = min(bound, time.Until(d)/2)
	}
	wait := time.NewTimer(bound)
	defer wait.Stop()
	// A leader that was only slow to heartbeat is heard from again without
	// a signal: look again now and then.
	recheck := time.NewTicker(max(n.cfg.HeartbeatTimeout/10, time.Millisecond))
	defer recheck.Stop()
	for {
		changed := n.leaderSignal.next()
		if n.IsLeader() {
			return nil
		}
		err := n.notLeader()
		if errcode.Of(err) == errcode.NotLeader {
			return err
		}
		select {
		case <-changed:
		case <-recheck.C:
		case <-wait.C:
			return err
		case <-ctx.Done():
			return err
		}
	}
}
