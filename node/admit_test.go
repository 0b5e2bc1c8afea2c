package node

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
)

// TestPendingWritesBounded: past --max-pending-writes a client write is
// refused at once with TOO_MANY_REQUESTS, not applied, and counted; a slot
// given back lets the next one in. Writes of the node's own (ticks) are
// not client writes and go on.
func TestPendingWritesBounded(t *testing.T) {
	c := newCluster(t, 1, time.Hour, func(cfg *Config) { cfg.MaxPendingWrites = 2 })
	nd := c.nodes[c.leader()]
	mount := func(id string) error {
		_, err := nd.Propose(ctx(t), &fsm.MountSegment{NowMs: time.Now().UnixMilli(), ClientID: "c1",
			Segment: fsm.SegmentSpec{ID: id, Name: "host-" + id, Base: 0, Size: 1 << 20}})
		return err
	}
	for range 2 {
		require.NoError(t, nd.admitWrite())
	}
	err := mount("s1")
	assert.Equal(t, errcode.TooManyRequests, errcode.Of(err), "%v", err)
	assert.Contains(t, err.Error(), "--max-pending-writes")
	_, err = nd.ProposeBatch(ctx(t), []fsm.Command{&fsm.PutStart{NowMs: time.Now().UnixMilli(), Key: "k", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c1"}})
	assert.Equal(t, errcode.TooManyRequests, errcode.Of(err), "batches too")
	assert.Equal(t, 2.0, testutil.ToFloat64(nd.metrics.writesRefused))
	_, err = nd.tick(ctx(t), true)
	require.NoError(t, err, "the node's own writes are not bounded")
	assert.Zero(t, nd.Status().Segments, "the refused write was not applied")

	nd.pendingWrites.Add(-1) // one of the two held is applied
	require.NoError(t, mount("s1"))
	assert.EqualValues(t, 1, nd.pendingWrites.Load(), "the write's slot is back once it is applied")
}
