package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func requireCode(t *testing.T, want errcode.Code, err error, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, want, errcode.Of(err), append([]any{"error: %v", err}, msgAndArgs...)...)
}

func TestRoundTrip(t *testing.T) {
	b, addr := startNode(t)
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)

	require.NoError(t, c.MountSegment(ctx, "c1", seg("s1", 1<<30)))
	require.NoError(t, c.MountSegment(ctx, "c1", seg("s1", 1<<30)), "mounting again is a no-op")
	require.NoError(t, c.MountSegment(ctx, "c1", seg("s2", 2<<30)))

	descs, err := c.PutStart(ctx, "a/1", []uint64{1024, 2048}, client.ReplicateConfig{ReplicaNum: 2}, "c1")
	require.NoError(t, err)
	require.Len(t, descs, 2)
	for _, d := range descs {
		assert.Equal(t, oplog.ReplicaProcessing, d.Status)
		require.Len(t, d.Buffers, 2)
		assert.Equal(t, []uint64{1024, 2048}, []uint64{d.Buffers[0].Size, d.Buffers[1].Size})
	}
	_, _, err = c.GetReplicaList(ctx, "a/1")
	requireCode(t, errcode.ReplicaIsNotReady, err)
	_, err = c.PutStart(ctx, "a/1", []uint64{1}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	requireCode(t, errcode.ObjectAlreadyExists, err)
	require.NoError(t, c.PutEnd(ctx, "a/1", "c1"))
	require.NoError(t, c.PutEnd(ctx, "a/1", "c1"), "PutEnd of a complete object is OK")

	got, lease, err := c.GetReplicaList(ctx, "a/1")
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, oplog.ReplicaComplete, got[0].Status)
	assert.Equal(t, descs[0].Buffers[0].Address, got[0].Buffers[0].Address)
	assert.Greater(t, lease, b.Now()-1000)

	ok, lease, err := c.ExistKey(ctx, "a/1")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Positive(t, lease)
	ok, _, err = c.ExistKey(ctx, "a/missing")
	require.NoError(t, err)
	assert.False(t, ok)

	// Batches: starts, ends, revokes, reads, each with per-item answers.
	res, err := c.BatchPutStart(ctx, []client.PutStartItem{
		{Key: "b/1", SliceLengths: []uint64{100}, Config: client.ReplicateConfig{ReplicaNum: 1, SoftPin: true}, ClientID: "c1"},
		{Key: "b/2", SliceLengths: []uint64{100}, Config: client.ReplicateConfig{ReplicaNum: 1, PreferredSegment: "name-s2"}, ClientID: "c1"},
		{Key: "b/3", SliceLengths: []uint64{100}, Config: client.ReplicateConfig{ReplicaNum: 1}, ClientID: "c1"},
		{Key: "a/1", SliceLengths: []uint64{100}, Config: client.ReplicateConfig{ReplicaNum: 1}, ClientID: "c1"},
		{Key: "b/4", SliceLengths: []uint64{100}, ClientID: "c1"}, // no config: replica_num 0
	})
	require.NoError(t, err)
	require.Len(t, res, 5)
	for i := range 3 {
		require.NoError(t, res[i].Err)
		require.Len(t, res[i].Replicas, 1)
	}
	assert.Equal(t, "name-s2", res[1].Replicas[0].Buffers[0].SegmentName)
	requireCode(t, errcode.ObjectAlreadyExists, res[3].Err)
	requireCode(t, errcode.InvalidParams, res[4].Err)

	errs, err := c.BatchPutEnd(ctx, "c1", []string{"b/1", "b/2", "b/missing"})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	requireCode(t, errcode.ObjectNotFound, errs[2])
	errs, err = c.BatchPutRevoke(ctx, "c1", []string{"b/3"})
	require.NoError(t, err)
	require.NoError(t, errs[0])

	ex, err := c.BatchExistKey(ctx, []string{"a/1", "b/1", "b/3", ""})
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, false, false}, []bool{ex[0].Exists, ex[1].Exists, ex[2].Exists, ex[3].Exists})
	requireCode(t, errcode.InvalidKey, ex[3].Err)
	rl, err := c.BatchGetReplicaList(ctx, []string{"b/2", "b/3"})
	require.NoError(t, err)
	require.NoError(t, rl[0].Err)
	assert.Len(t, rl[0].Replicas, 1)
	requireCode(t, errcode.ObjectNotFound, rl[1].Err)

	kr, err := c.GetReplicaListByRegex(ctx, "^b/")
	require.NoError(t, err)
	require.Len(t, kr, 2)
	assert.Equal(t, []string{"b/1", "b/2"}, []string{kr[0].Key, kr[1].Key})
	assert.Positive(t, kr[0].LeaseUntilMs)

	// The FSM's validation comes back as codes a caller can act on.
	_, err = c.PutStart(ctx, "", []uint64{1}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	requireCode(t, errcode.InvalidKey, err)
	_, err = c.PutStart(ctx, "k", []uint64{1}, client.ReplicateConfig{ReplicaNum: 9}, "c1")
	requireCode(t, errcode.InvalidParams, err)
	_, err = c.PutStart(ctx, "k", []uint64{0}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	requireCode(t, errcode.InvalidParams, err)
	_, err = c.PutStart(ctx, strings.Repeat("k", fsm.MaxKeyLen+1), []uint64{1}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	requireCode(t, errcode.InvalidKey, err)
	_, err = c.GetReplicaListByRegex(ctx, "(")
	requireCode(t, errcode.InvalidParams, err)
	assert.Contains(t, err.Error(), "does not compile")
	_, err = c.PutStart(ctx, "k\xff", []uint64{1}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	requireCode(t, errcode.InvalidParams, err, "invalid UTF-8 cannot be encoded, and is known not to be sent")
	requireCode(t, errcode.InvalidParams, c.MountSegment(ctx, "c1", fsm.SegmentSpec{ID: "s3", Name: "n3"}), "size 0")

	require.NoError(t, c.Remove(ctx, "a/1", true))
	requireCode(t, errcode.ObjectNotFound, c.Remove(ctx, "a/1", true))
	n, err := c.RemoveByRegex(ctx, "^b/1$", true)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	n, err = c.RemoveAll(ctx, true)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)

	p, err := c.Ping(ctx, "c1")
	require.NoError(t, err)
	assert.Equal(t, client.PingResult{TTLMs: fsm.DefaultParams().ClientTTLMs, ViewVersion: 7}, p, "the view version is the backend's")
	p, err = c.Ping(ctx, "stranger")
	require.NoError(t, err)
	assert.True(t, p.NeedRemount)

	require.NoError(t, c.UnmountSegment(ctx, "c1", "s2"))
	requireCode(t, errcode.SegmentNotFound, c.UnmountSegment(ctx, "c1", "s2"))
	require.NoError(t, c.ReMountSegment(ctx, "c1", []fsm.SegmentSpec{seg("s1", 1<<30), seg("s2", 2<<30)}))

	st, err := c.Status(ctx, addr)
	require.NoError(t, err)
	assert.Equal(t, addr, st.GetGrpcAddr())
	sts, serrs := c.StatusAll(ctx)
	require.Len(t, sts, 1)
	require.NoError(t, serrs[0])
	ms, err := c.Members(ctx)
	require.NoError(t, err)
	require.Len(t, ms, 1)
	require.NoError(t, c.AddVoter(ctx, "n2", "127.0.0.1:1", ""))
	require.NoError(t, c.RemoveServer(ctx, "n2"))
	require.NoError(t, c.TransferLeadership(ctx, ""))
}

func TestNotLeaderRedirect(t *testing.T) {
	leader, leaderAddr := startNode(t)
	follower, followerAddr := startNode(t)
	follower.notLeader.Store(&leaderAddr)
	c := dialT(t, followerAddr)
	ctx := ctxT(t, 10*time.Second)

	// A follower's NOT_LEADER means "not applied": even PutStart follows it.
	require.NoError(t, c.MountSegment(ctx, "c1", seg("s1", 0)))
	_, err := c.PutStart(ctx, "k", []uint64{10}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	require.NoError(t, err)
	assert.EqualValues(t, 2, leader.proposes.Load())
	assert.EqualValues(t, 1, follower.refused.Load(), "the leader, once learnt, is asked first")
	assert.Equal(t, []string{followerAddr, leaderAddr}, c.Endpoints())

	// A batch the follower refuses as a whole is redirected as a whole.
	c2 := dialT(t, followerAddr)
	ex, err := c2.BatchExistKey(ctx, []string{"k", "x"})
	require.NoError(t, err)
	require.Len(t, ex, 2)
	assert.False(t, ex[0].Exists, "k is still PROCESSING")

	// Status asks one node, whatever its role.
	st, err := c.Status(ctx, followerAddr)
	require.NoError(t, err)
	assert.Equal(t, followerAddr, st.GetGrpcAddr())
}

func TestUnavailableRetriedUntilDeadline(t *testing.T) {
	b, addr := startNode(t)
	b.unavailable.Store(true)
	c := dialT(t, addr)

	_, _, err := c.ExistKey(ctxT(t, 300*time.Millisecond), "k")
	requireCode(t, errcode.UnavailableInCurrentStatus, err, "the last error comes back at the deadline")
	assert.Contains(t, err.Error(), "no promoted leader yet")
	assert.Greater(t, b.refused.Load(), int64(1), "it was retried")

	// A retry that the deadline cuts short does not hide the answer before it.
	refused := b.refused.Load()
	go func() {
		time.Sleep(100 * time.Millisecond)
		b.hung.Store(true)
	}()
	_, _, err = c.ExistKey(ctxT(t, 600*time.Millisecond), "k")
	requireCode(t, errcode.UnavailableInCurrentStatus, err, "the last answer comes back when the deadline cuts a retry short")
	assert.Contains(t, err.Error(), "no promoted leader yet")
	assert.Greater(t, b.refused.Load(), refused+1, "refused, then held past the deadline")
	b.hung.Store(false)

	// A leader that becomes ready while the client retries is found.
	go func() {
		time.Sleep(100 * time.Millisecond)
		b.unavailable.Store(false)
	}()
	require.NoError(t, c.MountSegment(ctxT(t, 10*time.Second), "c1", seg("s1", 0)))
}

func TestPausedEndpointLeftAfterTimeout(t *testing.T) {
	paused, pausedAddr := startNode(t)
	_, addr := startNode(t)
	paused.paused.Store(true)
	c := dialT(t, pausedAddr, addr)

	_, _, err := c.ExistKey(ctxT(t, 200*time.Millisecond), "k")
	require.Error(t, err, "the paused node never answers")
	// A node that took a call and never answered is not asked first again:
	// a paused leader must not hold every later call until its deadline.
	_, _, err = c.ExistKey(ctxT(t, 5*time.Second), "k")
	require.NoError(t, err)
	assert.EqualValues(t, 1, paused.refused.Load(), "the paused node got one call")
}

func TestUnreachableEndpointSkipped(t *testing.T) {
	b, addr := startNode(t)
	c := dialT(t, deadAddr(t), addr)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, c.MountSegment(ctx, "c1", seg("s1", 0)))
	// Not sent to the dead node, so a non-idempotent call is safe to retry.
	_, err := c.PutStart(ctx, "k", []uint64{10}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	require.NoError(t, err)
	assert.EqualValues(t, 2, b.proposes.Load())

	only := dialT(t, deadAddr(t))
	_, err = only.PutStart(ctxT(t, 300*time.Millisecond), "k", []uint64{10}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	requireCode(t, errcode.UnavailableInCurrentStatus, err)
	assert.Contains(t, err.Error(), "cannot reach")
}

// TestOutcomeUnknownNotRetried: a write that is not idempotent is sent
// once; a lost answer is OUTCOME_UNKNOWN, because it was in fact applied.
func TestOutcomeUnknownNotRetried(t *testing.T) {
	one := client.ReplicateConfig{ReplicaNum: 1}
	tests := []struct {
		name    string
		write   func(ctx context.Context, c *client.Client) error
		applied func(ctx context.Context, t *testing.T, c *client.Client)
	}{
		{"PutStart", func(ctx context.Context, c *client.Client) error {
			_, err := c.PutStart(ctx, "k", []uint64{10}, one, "c1")
			return err
		}, func(ctx context.Context, t *testing.T, c *client.Client) {
			_, _, err := c.GetReplicaList(ctx, "k")
			requireCode(t, errcode.ReplicaIsNotReady, err)
		}},
		{"UpsertStart", func(ctx context.Context, c *client.Client) error {
			_, err := c.UpsertStart(ctx, "done", []uint64{10}, one, "c1")
			return err
		}, func(ctx context.Context, t *testing.T, c *client.Client) {
			_, _, err := c.GetReplicaList(ctx, "done")
			requireCode(t, errcode.ReplicaIsNotReady, err, "the overwrite started")
		}},
		{"BatchRemove", func(ctx context.Context, c *client.Client) error {
			_, err := c.BatchRemove(ctx, []string{"done"}, false)
			return err
		}, func(ctx context.Context, t *testing.T, c *client.Client) {
			ok, _, err := c.ExistKey(ctx, "done")
			require.NoError(t, err)
			assert.False(t, ok)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, addr := startNode(t)
			c := dialT(t, addr)
			ctx := ctxT(t, 10*time.Second)
			require.NoError(t, c.MountSegment(ctx, "c1", seg("s1", 0)))
			_, err := c.PutStart(ctx, "done", []uint64{10}, one, "c1")
			require.NoError(t, err)
			require.NoError(t, c.PutEnd(ctx, "done", "c1"))
			before := b.proposes.Load()

			b.dropNext.Store(true)
			err = tt.write(ctx, c)
			requireCode(t, errcode.OutcomeUnknown, err)
			assert.Contains(t, err.Error(), "check with GetReplicaList/ExistKey")
			assert.EqualValues(t, 1, b.proposes.Load()-before, "sent exactly once")
			tt.applied(ctx, t, c)
		})
	}
}

func TestPutEndRetriedAfterLostAnswer(t *testing.T) {
	b, addr := startNode(t)
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, c.MountSegment(ctx, "c1", seg("s1", 0)))
	_, err := c.PutStart(ctx, "k", []uint64{10}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	require.NoError(t, err)
	before := b.proposes.Load()

	b.dropNext.Store(true)
	require.NoError(t, c.PutEnd(ctx, "k", "c1"))
	assert.EqualValues(t, 2, b.proposes.Load()-before, "resent once after the lost answer")
	ok, _, err := c.ExistKey(ctx, "k")
	require.NoError(t, err)
	assert.True(t, ok)
}

func TestServerOutcomeUnknownPassedThrough(t *testing.T) {
	b, addr := startNode(t)
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, c.MountSegment(ctx, "c1", seg("s1", 0)))
	before := b.proposes.Load()

	b.loseNext.Store(true)
	err := c.MountSegment(ctx, "c1", seg("s2", 1<<30))
	requireCode(t, errcode.OutcomeUnknown, err, "not retried, even for an idempotent call")
	assert.EqualValues(t, 1, b.proposes.Load()-before)
}

func TestStatusMapping(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		write     bool
		code      errcode.Code
		retryable bool
		leader    string
	}{
		{"ok", nil, false, errcode.OK, false, ""},
		{"not leader", errcode.New(errcode.NotLeader, "10.0.0.2:7000"), false, errcode.NotLeader, true, "10.0.0.2:7000"},
		{"no leader", errcode.New(errcode.UnavailableInCurrentStatus, "electing"), false, errcode.UnavailableInCurrentStatus, true, ""},
		{"outcome unknown", errcode.New(errcode.OutcomeUnknown, "leadership lost"), true, errcode.OutcomeUnknown, false, ""},
		{"etcd fail-closed", errcode.New(errcode.EtcdOperationError, "ring full"), true, errcode.EtcdOperationError, false, ""},
		{"not found", errcode.New(errcode.ObjectNotFound, "key"), false, errcode.ObjectNotFound, false, ""},
		{"wrapped", fmt.Errorf("ctx: %w", errcode.New(errcode.InvalidKey, "empty")), false, errcode.InvalidKey, false, ""},
		{"plain error", errors.New("boom"), false, errcode.InternalError, false, ""},
		{"read deadline", context.DeadlineExceeded, false, errcode.UnavailableInCurrentStatus, true, ""},
		{"write deadline", context.DeadlineExceeded, true, errcode.OutcomeUnknown, false, ""},
		{"write refused", errcode.New(errcode.NotLeader, "h:1"), true, errcode.NotLeader, true, "h:1"},
		{"no admin token", errcode.New(errcode.PermissionDenied, "admin"), false, errcode.PermissionDenied, false, ""},
		{"in-flight cap", errcode.New(errcode.TooManyRequests, "busy"), true, errcode.TooManyRequests, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := statusOf(tt.err)
			if tt.write {
				st = writeStatusOf(tt.err)
			}
			assert.Equal(t, int32(tt.code), st.GetCode())
			assert.Equal(t, tt.code.String(), st.GetName())
			assert.Equal(t, tt.retryable, st.GetRetryable())
			assert.Equal(t, tt.leader, st.GetLeaderGrpcAddr())
			back := moonraftpb.ErrorOf(st)
			assert.Equal(t, tt.code, errcode.Of(back))
			if tt.leader != "" {
				assert.Equal(t, tt.leader, back.(*errcode.Error).Msg, "NOT_LEADER's message is the address")
			}
		})
	}
}

func TestOversizedMessageRefused(t *testing.T) {
	b, addr := startNode(t)
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)
	huge := strings.Repeat("k", 17<<20)

	_, err := c.PutStart(ctx, huge, []uint64{1}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	requireCode(t, errcode.InvalidParams, err)
	assert.Contains(t, err.Error(), "message limit")
	assert.Zero(t, b.proposes.Load())

	// A client without the cap is refused by the server's own.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	_, err = moonraftpb.NewMasterClient(cc).ExistKey(ctx, &moonraftpb.ExistKeyRequest{Key: huge})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
}

func TestBatchOverLimit(t *testing.T) {
	b, addr := startNode(t)
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)
	keys := make([]string, MaxBatch+1)
	for i := range keys {
		keys[i] = "k"
	}
	_, err := c.BatchExistKey(ctx, keys)
	requireCode(t, errcode.InvalidParams, err)
	_, err = c.BatchPutEnd(ctx, "c1", keys)
	requireCode(t, errcode.InvalidParams, err)
	assert.Contains(t, err.Error(), "limit is 10000")
	assert.Zero(t, b.proposes.Load())
}

func TestKeepAliveRemounts(t *testing.T) {
	b, addr := startNode(t)
	c := dialT(t, addr)
	ctx := ctxT(t, 20*time.Second)
	segs := []fsm.SegmentSpec{seg("s1", 0), seg("s2", 1<<30)}
	for _, s := range segs {
		require.NoError(t, c.MountSegment(ctx, "c1", s))
	}

	k := c.KeepAlive(ctx, "c1", segs, 10*time.Millisecond)
	require.Eventually(t, func() bool { return b.pings.Load() >= 3 }, 10*time.Second, 5*time.Millisecond)
	assert.Zero(t, k.Remounts(), "the session is alive")
	require.NoError(t, k.Err())

	b.expireSessions(t)
	require.False(t, b.hasSession("c1"))
	require.Eventually(t, func() bool { return k.Remounts() == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.True(t, b.hasSession("c1"))

	k.Stop()
	n := b.pings.Load()
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, n, b.pings.Load(), "no ping after Stop")
	assert.Equal(t, 1, k.Remounts())
	k.Stop() // idempotent
}

// TestKeepAlivePingsOncePerRound: a Keeper's ping asks each endpoint once,
// following a redirect, and a round without an answer waits for the next
// one instead of backing off and retrying: 10,000 clients pinging through
// an election would otherwise all reach the new leader at once. Only
// TOO_MANY_REQUESTS is retried within the round.
func TestKeepAlivePingsOncePerRound(t *testing.T) {
	leader, leaderAddr := startNode(t)
	follower, followerAddr := startNode(t)
	ctx := ctxT(t, 20*time.Second)

	// No leader anywhere (an election): one refusal from each live node,
	// then nothing until the next round, an hour away.
	leader.unavailable.Store(true)
	follower.unavailable.Store(true)
	c := dialT(t, followerAddr, deadAddr(t), leaderAddr)
	k := c.KeepAlive(ctx, "c1", nil, time.Hour)
	require.Eventually(t, func() bool { return k.Err() != nil }, 5*time.Second, 5*time.Millisecond, "the round ends after one pass")
	requireCode(t, errcode.UnavailableInCurrentStatus, k.Err())
	time.Sleep(300 * time.Millisecond)
	assert.EqualValues(t, 1, follower.refused.Load())
	assert.EqualValues(t, 1, leader.refused.Load())
	k.Stop()

	// A refusal for the client's own calls in flight is no election: it is
	// retried within the round.
	leader.unavailable.Store(false)
	leader.busyPings.Store(2)
	k = dialT(t, leaderAddr).KeepAlive(ctx, "c1", nil, time.Hour)
	require.Eventually(t, func() bool { return leader.pings.Load() == 1 }, 5*time.Second, 5*time.Millisecond, "pinged once the refusals passed")
	require.NoError(t, k.Err())
	k.Stop()
	leader.pings.Store(0)

	// A follower naming the leader is followed within the round.
	follower.unavailable.Store(false)
	follower.notLeader.Store(&leaderAddr)
	k = dialT(t, followerAddr).KeepAlive(ctx, "c1", nil, time.Hour)
	require.Eventually(t, func() bool { return leader.pings.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, k.Err())
	k.Stop()
}

func TestSnapshotStreaming(t *testing.T) {
	src, srcAddr := startNode(t)
	srcFollower, srcFollowerAddr := startNode(t)
	srcFollower.notLeader.Store(&srcAddr)

	// A few MB of state: 8,000 objects with long keys that differ early
	// (a file writes only what a key adds to the one before it).
	now := src.Now()
	src.apply(t, &fsm.MountSegment{NowMs: now, ClientID: "c1", Segment: fsm.SegmentSpec{ID: "s1", Name: "n1", Size: 1 << 40}})
	suffix := strings.Repeat("p", 150)
	for i := range 8000 {
		key := fmt.Sprintf("%06d/%s", i, suffix)
		src.apply(t, &fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{4096}, ReplicaNum: 1, ClientID: "c1"})
		src.apply(t, &fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"})
	}

	ctx := ctxT(t, 30*time.Second)
	var buf bytes.Buffer
	require.NoError(t, dialT(t, srcFollowerAddr).SnapshotSave(ctx, &buf), "redirected from the follower")
	require.Greater(t, buf.Len(), 3<<20)
	t.Logf("snapshot: %d bytes", buf.Len())

	// The server streams it in chunks of at most moonraftpb.SnapshotChunkBytes.
	cc, err := grpc.NewClient(srcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	stream, err := moonraftpb.NewMasterClient(cc).SnapshotSave(ctx, &moonraftpb.SnapshotSaveRequest{})
	require.NoError(t, err)
	chunks, total := 0, 0
	for {
		ch, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.LessOrEqual(t, len(ch.GetData()), moonraftpb.SnapshotChunkBytes)
		chunks, total = chunks+1, total+len(ch.GetData())
	}
	assert.Greater(t, chunks, 1)
	assert.Equal(t, buf.Len(), total)

	// Restore into an empty cluster, through its follower: the reader is
	// rewound for the leader.
	dst, dstAddr := startNode(t)
	dstFollower, dstFollowerAddr := startNode(t)
	dstFollower.notLeader.Store(&dstAddr)
	c := dialT(t, dstFollowerAddr)
	require.NoError(t, c.SnapshotRestore(ctx, bytes.NewReader(buf.Bytes())))
	assert.Equal(t, src.digest(), dst.digest())

	// A reader that cannot be rewound is not resent.
	c2 := dialT(t, dstFollowerAddr)
	err = c2.SnapshotRestore(ctx, io.MultiReader(bytes.NewReader(buf.Bytes())))
	requireCode(t, errcode.InvalidParams, err)
	assert.Contains(t, err.Error(), "io.ReadSeeker")

	// A corrupted snapshot is refused by the backend, answered with its error.
	bad := bytes.Clone(buf.Bytes())
	bad[len(bad)/2] ^= 0xff
	err = c.SnapshotRestore(ctx, bytes.NewReader(bad))
	require.Error(t, err)
	assert.NotEqual(t, errcode.OK, errcode.Of(err))
	assert.Equal(t, src.digest(), dst.digest(), "state unchanged")

	// A failing save carries its Status in the gRPC error's details.
	src.unavailable.Store(true)
	err = dialT(t, srcAddr).SnapshotSave(ctxT(t, 200*time.Millisecond), io.Discard)
	requireCode(t, errcode.UnavailableInCurrentStatus, err)
}
