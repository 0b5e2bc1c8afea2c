package client

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moonraft/moonraft/errcode"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// leaderMaster is a master as its clients see it: a dead or stopped one
// takes calls and never answers them; a slow one answers its status but not
// its calls; a live one answers both. Its status says whether it serves as
// the leader.
type leaderMaster struct {
	moonraftpb.UnimplementedMasterServer
	addr          string
	answersStatus bool
	answersCalls  bool
	promoted      bool
	promotedAt    time.Time    // when it wins an election, if not promoted
	statuses      atomic.Int32 // Status calls taken
	calls         atomic.Int32 // other calls taken
}

func (m *leaderMaster) wait(ctx context.Context) error {
	m.calls.Add(1)
	if !m.answersCalls {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (m *leaderMaster) PutStart(ctx context.Context, _ *moonraftpb.PutStartRequest) (*moonraftpb.PutStartResponse, error) {
	if err := m.wait(ctx); err != nil {
		return nil, err
	}
	return &moonraftpb.PutStartResponse{Status: &moonraftpb.Status{}}, nil
}

func (m *leaderMaster) ExistKey(ctx context.Context, _ *moonraftpb.ExistKeyRequest) (*moonraftpb.ExistKeyResponse, error) {
	if err := m.wait(ctx); err != nil {
		return nil, err
	}
	return &moonraftpb.ExistKeyResponse{Status: &moonraftpb.Status{}, Exists: true}, nil
}

func (m *leaderMaster) Status(ctx context.Context, _ *moonraftpb.StatusRequest) (*moonraftpb.StatusResponse, error) {
	m.statuses.Add(1)
	if !m.answersStatus {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	promoted := m.promoted || !m.promotedAt.IsZero() && time.Now().After(m.promotedAt)
	return &moonraftpb.StatusResponse{Status: &moonraftpb.Status{}, Node: &moonraftpb.NodeStatus{Promoted: promoted, GrpcAddr: m.addr}}, nil
}

// serveMaster runs m on a loopback port and sets its address.
func serveMaster(t *testing.T, m *leaderMaster) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	m.addr = lis.Addr().String()
	s := grpc.NewServer()
	moonraftpb.RegisterMasterServer(s, m)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return m.addr
}

// TestLeaderCheck: a call that waits at an endpoint which takes it and
// answers nothing, not even its status, is ended once another endpoint
// serves as the leader, as if its connection had failed after it was sent —
// a write with OUTCOME_UNKNOWN, a read retried at the new leader — and the
// client follows that leader. Not while the endpoint answers its status
// (alive: it will answer the call, whether it leads or not), and not with
// the check off.
func TestLeaderCheck(t *testing.T) {
	const deadline = 2 * time.Second
	for _, tc := range []struct {
		name          string
		stuckStatus   bool // the stuck endpoint answers its status
		stuckPromoted bool // saying it serves as the leader
		checkAfter    time.Duration
		ended         bool // before the deadline
		writeCode     errcode.Code
		readAnswered  bool
	}{
		{"a dead leader", false, false, 600 * time.Millisecond, true, errcode.OutcomeUnknown, true},
		{"a slow leader", true, true, 0, false, errcode.OutcomeUnknown, false},
		{"a follower, or a deposed leader", true, false, 0, false, errcode.OutcomeUnknown, false},
		{"the check off", false, false, -1, false, errcode.OutcomeUnknown, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stuckAddr := serveMaster(t, &leaderMaster{answersStatus: tc.stuckStatus, promoted: tc.stuckPromoted})
			leader := &leaderMaster{answersStatus: true, answersCalls: true, promoted: true}
			leaderAddr := serveMaster(t, leader)
			dialWith := func() *Client {
				c, err := Dial(Config{Endpoints: []string{stuckAddr, leaderAddr}, LeaderCheckAfter: tc.checkAfter})
				require.NoError(t, err)
				t.Cleanup(func() { _ = c.Close() })
				return c
			}

			c := dialWith()
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			start := time.Now()
			_, err := c.PutStart(ctx, "k", []uint64{1}, ReplicateConfig{ReplicaNum: 1}, "c1")
			took := time.Since(start)
			cancel()
			assert.Equal(t, tc.writeCode, errcode.Of(err), "%v", err)
			if tc.ended {
				// Not waiting out the dead endpoint's status (another
				// checkAfter) once the leader has answered its own.
				assert.Less(t, took, 2*tc.checkAfter, "the write waited %v at the endpoint that does not answer", took)
				assert.Contains(t, err.Error(), "serves as the leader")
				assert.Equal(t, leaderAddr, c.pick(), "the client tries the new leader first")
			} else {
				assert.GreaterOrEqual(t, took, deadline-100*time.Millisecond, "the write was ended after %v", took)
			}

			c = dialWith()
			ctx, cancel = context.WithTimeout(context.Background(), deadline)
			exists, _, err := c.ExistKey(ctx, "k")
			cancel()
			if tc.readAnswered {
				require.NoError(t, err)
				assert.True(t, exists, "answered by the new leader")
			} else {
				assert.Error(t, err)
			}
		})
	}
}

// TestLeaderCheckDuringElection: a call waits at a dead leader while the
// election of its successor is still on when the first check asks. That
// check ends once the others have answered and the dead one's grace is
// over, so the next, a quarter later, finds the new leader: the call is
// ended within half a checkAfter of its election, not after the first
// check has waited out the dead one's status too.
func TestLeaderCheckDuringElection(t *testing.T) {
	const checkAfter = time.Second
	dead := serveMaster(t, &leaderMaster{})
	start := time.Now()
	// Elected a tenth of checkAfter after the first check began.
	elected := start.Add(checkAfter + checkAfter/10)
	next := &leaderMaster{answersStatus: true, answersCalls: true, promotedAt: elected}
	nextAddr := serveMaster(t, next)
	c, err := Dial(Config{Endpoints: []string{dead, nextAddr}, LeaderCheckAfter: checkAfter})
	require.NoError(t, err)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*checkAfter)
	defer cancel()
	_, err = c.PutStart(ctx, "k", []uint64{1}, ReplicateConfig{ReplicaNum: 1}, "c1")
	assert.Equal(t, errcode.OutcomeUnknown, errcode.Of(err), "%v", err)
	assert.Contains(t, err.Error(), "serves as the leader")
	// The second check begins a quarter after the first ended, at 1.5
	// checkAfter, and gives the dead one a quarter: 1.75 in all. Waiting
	// out the dead one's status, the first would have ended at 2, the
	// second at 2.5.
	assert.Less(t, time.Since(start), 2*checkAfter, "the call was ended %v after the leader's election", time.Since(elected))
}

// TestLeaderCheckShared: the calls that wait on one endpoint, though they
// began at different moments, ask who leads at most once a quarter of
// LeaderCheckAfter between them, not once each: a loaded leader's slow
// calls must not bring a storm of status requests on every node.
func TestLeaderCheckShared(t *testing.T) {
	// A slow leader: it answers its status at once, so the calls wait to
	// their deadline, checking all along.
	stuck := &leaderMaster{answersStatus: true, promoted: true}
	stuckAddr := serveMaster(t, stuck)
	follower := &leaderMaster{answersStatus: true}
	followerAddr := serveMaster(t, follower)
	const checkAfter, wait, calls, stagger = 100 * time.Millisecond, time.Second, 20, 5 * time.Millisecond
	c, err := Dial(Config{Endpoints: []string{stuckAddr, followerAddr}, LeaderCheckAfter: checkAfter})
	require.NoError(t, err)
	defer c.Close()
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * stagger)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			_, _ = c.PutStart(ctx, "k", []uint64{1}, ReplicateConfig{ReplicaNum: 1}, "c1")
		})
	}
	wg.Wait()
	require.EqualValues(t, calls, stuck.calls.Load(), "every call waited at the stuck endpoint")
	// A round at most every quarter of checkAfter over the calls' span;
	// each call on its own would have asked every quarter from its own
	// start (335 times in a run without the quarter's window).
	rounds := int32((wait+calls*stagger)/(checkAfter/4)) + 1
	assert.Positive(t, follower.statuses.Load())
	assert.LessOrEqual(t, follower.statuses.Load(), rounds, "the follower was asked %d times", follower.statuses.Load())
}
