package client

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/moonraft/moonraft/errcode"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// scriptedMaster answers pings as its script says: the retry rules are the
// client's alone, and a script reaches the orders of answers they are for
// (a follower naming a dead leader, then a new one) without an election.
type scriptedMaster struct {
	moonraftpb.UnimplementedMasterServer
	answer func(n int) *moonraftpb.Status // for the nth ping, from 1
	mu     sync.Mutex
	at     []time.Time // when each ping was answered
}

func (m *scriptedMaster) Ping(context.Context, *moonraftpb.PingRequest) (*moonraftpb.PingResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.at = append(m.at, time.Now())
	return &moonraftpb.PingResponse{Status: m.answer(len(m.at))}, nil
}

func (m *scriptedMaster) answered() []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Time(nil), m.at...)
}

// serve runs m on a loopback port and returns its address.
func serve(t *testing.T, m *scriptedMaster) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := grpc.NewServer()
	moonraftpb.RegisterMasterServer(s, m)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

func notLeader(addr string) *moonraftpb.Status {
	return &moonraftpb.Status{Code: int32(errcode.NotLeader), Name: "NOT_LEADER", LeaderGrpcAddr: addr, Retryable: true}
}

func ok(int) *moonraftpb.Status { return &moonraftpb.Status{} }

func dial(t *testing.T, endpoints ...string) *Client {
	c, err := Dial(Config{Endpoints: endpoints})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRedirectToANewLeaderAtOnce: a follower that first names its dead
// leader and then the new one sends the call to the new one at once,
// though the call was redirected once already.
func TestRedirectToANewLeaderAtOnce(t *testing.T) {
	const namedDead = 6
	dead := deadAddr(t)
	leader := &scriptedMaster{answer: ok}
	leaderAddr := serve(t, leader)
	follower := &scriptedMaster{answer: func(n int) *moonraftpb.Status {
		if n <= namedDead {
			return notLeader(dead)
		}
		return notLeader(leaderAddr)
	}}
	c := dial(t, serve(t, follower), dead)

	_, err := c.Ping(context.Background(), "c1")
	require.NoError(t, err)
	f, l := follower.answered(), leader.answered()
	require.Len(t, f, namedDead+1)
	require.Len(t, l, 1)
	// After six backoffs (20 ms doubling) the next would be at least half of
	// the default cap (1 s): at once is under half of that, with room for two
	// cores busy with -race (69 ms seen in CI).
	assert.Less(t, l[0].Sub(f[namedDead]), defaultMaxBackoff/4, "the new leader was tried %v after it was named", l[0].Sub(f[namedDead]))
}

// TestFailedConnectionsNotFollowed: an endpoint whose connection has
// failed is neither followed when named nor moved on to, while another is
// left.
func TestFailedConnectionsNotFollowed(t *testing.T) {
	dead := deadAddr(t)
	a, b := serve(t, &scriptedMaster{answer: ok}), serve(t, &scriptedMaster{answer: ok})
	c := dial(t, a, dead, b)
	failed(t, c, dead)

	assert.False(t, c.follow(dead), "a redirect to a failed connection is not followed")
	assert.Equal(t, a, c.pick())
	c.skip(a)
	assert.Equal(t, b, c.pick(), "the failed endpoint is passed over")
	c.skip(b)
	assert.Equal(t, a, c.pick())

	assert.True(t, c.follow(b))
	assert.Equal(t, b, c.pick())
}

// TestSkipWhenAllOthersFailed: with every other endpoint's connection
// failed, skip stays; with every one's, it goes round.
func TestSkipWhenAllOthersFailed(t *testing.T) {
	dead, dead2 := deadAddr(t), deadAddr(t)
	a := serve(t, &scriptedMaster{answer: ok})
	c := dial(t, a, dead)
	failed(t, c, dead)
	c.skip(a)
	assert.Equal(t, a, c.pick(), "a follower naming a dead leader is asked again")

	c = dial(t, dead, dead2)
	failed(t, c, dead)
	failed(t, c, dead2)
	c.skip(dead)
	assert.Equal(t, dead2, c.pick())
}

// failed waits until c's connection to ep has failed.
func failed(t *testing.T, c *Client, ep string) {
	cc, err := c.conn(ep)
	require.NoError(t, err)
	cc.Connect()
	require.Eventually(t, func() bool { return cc.GetState() == connectivity.TransientFailure }, 5*time.Second, 5*time.Millisecond)
}
