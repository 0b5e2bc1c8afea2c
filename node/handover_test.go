package node

import (
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	mc "github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/structpack"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWriteDuringAFailedHandover: a Mooncake put that reaches the leader
// while it tries to hand leadership to a node that is down (and behind,
// so Raft tries to bring it up to date until the transfer times out)
// waits for the attempt to fail and is then applied, instead of failing
// as Raft's refusal during a transfer would make it.
func TestWriteDuringAFailedHandover(t *testing.T) {
	c := newCluster(t, 3, time.Hour, withMooncake(t))
	l := c.leader()
	nd := c.nodes[l]
	m := dialMooncake(t, c.cfgs[l].MooncakeAddr)
	client := mountAndPut(t, m, "before")
	target := (l + 1) % 3
	c.stop(target)
	mountAndPut(t, m, "behind")

	transferred := make(chan error, 1)
	go func() { transferred <- nd.TransferLeadership(ctx(t), c.cfgs[target].ID) }()
	// Raft refuses proposals from the transfer's start until it times out
	// (one election timeout, 500 ms here).
	time.Sleep(50 * time.Millisecond)
	start := mcCall[structpack.Expected[[]mc.ReplicaDescriptor]](m, "PutStart",
		mc.PutStartArgs{ClientID: client, Key: "during", SliceLength: 1, Config: mc.ReplicateConfig{ReplicaNum: 1}})
	require.Zero(t, start.Err, "a put during the handover is applied once it failed")
	require.Error(t, <-transferred, "the target is down")
	require.Zero(t, mcCall[structpack.Expected[mc.Void]](m, "PutEnd", mc.PutEndArgs{ClientID: client, Meta: mc.ObjectMeta{Key: "during"}}).Err)
	assert.True(t, nd.IsLeader())
	assert.EqualValues(t, 3, nd.Status().Objects)
}

// TestRaftRefusalsDuringAHandover: Raft answers a proposal it refuses
// during a transfer before logging it, so the write is retryable, and a
// Mooncake call whose writes were all refused so may go to the new leader.
func TestRaftRefusalsDuringAHandover(t *testing.T) {
	c := newCluster(t, 1, time.Hour)
	nd := c.nodes[c.leader()]
	assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(nd.raftErr(raft.ErrLeadershipTransferInProgress, true)),
		"refused before it was logged: not applied")
	assert.Equal(t, errcode.OutcomeUnknown, errcode.Of(nd.raftErr(raft.ErrLeadershipLost, true)),
		"in flight when the leader stepped down: may have committed")

	for _, tc := range []struct {
		err     error
		refused bool
	}{
		{raft.ErrLeadershipTransferInProgress, true},
		{raft.ErrNotLeader, true},
		{nil, false},
		{raft.ErrLeadershipLost, false},
		{errors.New("disk"), false},
	} {
		assert.Equal(t, tc.refused, refusedUnlogged(tc.err), "%v", tc.err)
	}
}
