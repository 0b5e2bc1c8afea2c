package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
)

// A leader that died, or stopped, answers nothing: a call sent to it waits
// for its connection to fail, which a killed process's kernel does only
// once it has freed the process's memory (0.6–1.6 s for a master of 6
// million objects; docs/BENCHMARKS.md, "The failover at 6M"), a crashed
// host's never does, and a stopped process's waits until it resumes. So a
// call that has waited Config.LeaderCheckAfter has the client ask every
// endpoint for its status, and again every quarter of that while it waits;
// once the endpoint it waits at does not answer and another serves as the
// leader, the call is ended there as if its connection had failed after it
// was sent.

// defaultLeaderCheckAfter is well above a loaded leader's write p99 (161 ms
// at 6 million objects and 10,000 clients) and above the heartbeat timeout
// that must pass before a follower may stand (300 ms at the defaults).
const defaultLeaderCheckAfter = 400 * time.Millisecond

// errLeaderMoved is the cause with which a call to an endpoint that no
// longer answers is ended once another node leads.
var errLeaderMoved = errors.New("another node leads")

// leaderCheck is one round of asking the endpoints who leads, shared by
// every call that waits on the same endpoint meanwhile or within a quarter
// of checkAfter after it.
type leaderCheck struct {
	done   chan struct{}
	leader string    // "" when none of them serves as the leader
	at     time.Time // when the answer came
}

// watched runs attempt at ep and ends it with errLeaderMoved (its
// context's cause) once it has waited checkAfter, ep does not answer its
// status and another endpoint serves as the leader; the client then
// follows that leader.
func (c *Client) watched(ctx context.Context, ep string, mc moonraftpb.MasterClient, sent grpc.CallOption, attempt attemptFunc) (*moonraftpb.Status, error) {
	if c.checkAfter <= 0 {
		return attempt(ctx, mc, sent)
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := time.AfterFunc(c.checkAfter, func() {
		for {
			if addr := c.leaderElsewhere(actx, ep); addr != "" && c.follow(addr) {
				cancel(fmt.Errorf("%w: %s answered neither the call nor its status within %v, and %s serves as the leader", errLeaderMoved, ep, c.checkAfter, addr))
				return
			}
			select {
			case <-actx.Done():
				return
			case <-time.After(c.checkAfter / 4):
			}
		}
	})
	defer t.Stop()
	st, err := attempt(actx, mc, sent)
	if cause := context.Cause(actx); err != nil && ctx.Err() == nil && errors.Is(cause, errLeaderMoved) {
		return nil, cause
	}
	return st, err
}

// leaderElsewhere asks every endpoint for its status, once for all the
// calls that wait on ep meanwhile or within a quarter of checkAfter after
// the answer, and returns the address of another that
// serves as the leader, if ep does not answer ("" otherwise, or if ctx
// ended first). An ep that answers is alive, and will answer the calls it
// holds: a follower holding them through an election redirects them, a
// deposed leader fails them, and a slow leader (which may be known under
// another address too) answers them.
func (c *Client) leaderElsewhere(ctx context.Context, ep string) string {
	c.mu.Lock()
	chk, ok := c.checks[ep]
	// Calls wait on ep from different moments, each looking every quarter
	// of checkAfter: an answer that recent serves them all.
	fresh := ok && (chk.at.IsZero() || time.Since(chk.at) < c.checkAfter/4)
	if !fresh {
		chk = &leaderCheck{done: make(chan struct{})}
		c.checks[ep] = chk
	}
	endpoints := slices.Clone(c.endpoints)
	c.mu.Unlock()
	if !fresh {
		// Not bound to this call's context: others wait for the answer.
		leader := c.askLeader(ep, endpoints)
		c.mu.Lock()
		chk.leader, chk.at = leader, time.Now()
		c.mu.Unlock()
		close(chk.done)
	}
	select {
	case <-chk.done:
		return chk.leader
	case <-ctx.Done():
		return ""
	}
}

// askLeader asks each endpoint, at once and for at most checkAfter, for its
// status (see leaderElsewhere). It does not wait out ep's: ep has a
// quarter of checkAfter from the start of the round to answer (a live node
// answers its status in milliseconds; a dead one's would only time out).
// After that, the round ends once another endpoint serves as the leader,
// or once all the others have answered and none does: during an election
// the next round, a quarter later, may find the winner.
func (c *Client) askLeader(ep string, endpoints []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), c.checkAfter)
	defer cancel()
	type answer struct {
		endpoint string
		st       *moonraftpb.NodeStatus
	}
	answers := make(chan answer, len(endpoints))
	for _, e := range endpoints {
		go func() {
			st, _ := c.Progress(ctx, e)
			answers <- answer{e, st}
		}()
	}
	grace := time.NewTimer(c.checkAfter / 4)
	defer grace.Stop()
	// epSilent: ep failed to answer, or its grace is over; others: the
	// other endpoints that have not answered.
	leader, epSilent := "", false
	others := len(endpoints)
	if slices.Contains(endpoints, ep) {
		others--
	}
	for pending := len(endpoints); pending > 0; {
		select {
		case a := <-answers:
			pending--
			if a.endpoint != ep {
				others--
			}
			switch st := a.st; {
			case a.endpoint == ep && st != nil:
				return ""
			case a.endpoint == ep:
				epSilent = true
			case st.GetPromoted() && st.GetGrpcAddr() != "" && st.GetGrpcAddr() != ep:
				leader = st.GetGrpcAddr()
			}
		case <-grace.C:
			epSilent = true
		}
		if epSilent && (leader != "" || others == 0) {
			return leader
		}
	}
	return leader
}
