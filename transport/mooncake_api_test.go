package transport

import (
	"context"
	"testing"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The RPCs issue 13 added, each through the client over gRPC: their
// success paths and their errors (unknown key, wrong client, bad size,
// leased object, draining segment).
func TestMooncakeAPIOfToday(t *testing.T) {
	one := client.ReplicateConfig{ReplicaNum: 1}
	setup := func(t *testing.T) (*testBackend, *client.Client, context.Context) {
		b, addr := startNode(t)
		c := dialT(t, addr)
		ctx := ctxT(t, 10*time.Second)
		require.NoError(t, c.MountSegment(ctx, "c1", seg("s1", 1<<30)))
		require.NoError(t, c.MountSegment(ctx, "c2", seg("s2", 2<<30)))
		_, err := c.PutStart(ctx, "k", []uint64{100}, one, "c1")
		require.NoError(t, err)
		require.NoError(t, c.PutEnd(ctx, "k", "c1"))
		return b, c, ctx
	}
	lease := func(t *testing.T, b *testBackend, key string) {
		_, err := b.Propose(context.Background(), &fsm.Tick{NowMs: b.Now(), Renewals: []lease.Renewal{{Key: key, AtMs: b.Now()}}})
		require.NoError(t, err)
	}
	tests := []struct {
		name string
		run  func(t *testing.T, b *testBackend, c *client.Client, ctx context.Context)
	}{
		{"upsert overwrites in place and ends", func(t *testing.T, b *testBackend, c *client.Client, ctx context.Context) {
			before, _, err := c.GetReplicaList(ctx, "k")
			require.NoError(t, err)
			descs, err := c.UpsertStart(ctx, "k", []uint64{100}, one, "c2")
			require.NoError(t, err)
			assert.Equal(t, before[0].Buffers[0].Address, descs[0].Buffers[0].Address, "same layout: the same buffer")
			assert.Equal(t, oplog.ReplicaProcessing, descs[0].Status)
			_, _, err = c.GetReplicaList(ctx, "k")
			requireCode(t, errcode.ReplicaIsNotReady, err, "never half-written to a reader")
			requireCode(t, errcode.IllegalClient, c.UpsertEnd(ctx, "k", "c1"), "wrong client")
			require.NoError(t, c.UpsertEnd(ctx, "k", "c2"))
			require.NoError(t, c.UpsertEnd(ctx, "k", "c2"), "UpsertEnd is retried freely")
		}},
		{"upsert of an absent key, revoke, unknown key", func(t *testing.T, b *testBackend, c *client.Client, ctx context.Context) {
			_, err := c.UpsertStart(ctx, "new", []uint64{10}, one, "c1")
			require.NoError(t, err)
			require.NoError(t, c.UpsertRevoke(ctx, "new", "c1"))
			ok, _, err := c.ExistKey(ctx, "new")
			require.NoError(t, err)
			assert.False(t, ok)
			requireCode(t, errcode.ObjectNotFound, c.UpsertEnd(ctx, "nope", "c1"))
		}},
		{"upsert: bad size; a leased object is copied", func(t *testing.T, b *testBackend, c *client.Client, ctx context.Context) {
			_, err := c.UpsertStart(ctx, "k", []uint64{0}, one, "c1")
			requireCode(t, errcode.InvalidParams, err)
			before, _, err := c.GetReplicaList(ctx, "k")
			require.NoError(t, err)
			lease(t, b, "k")
			descs, err := c.UpsertStart(ctx, "k", []uint64{100}, one, "c1")
			require.NoError(t, err, "a reader's lease does not refuse an upsert")
			assert.NotEqual(t, before[0].Buffers[0].Address, descs[0].Buffers[0].Address, "fresh buffers: the reader's stay as they are")
		}},
		{"batch upsert", func(t *testing.T, b *testBackend, c *client.Client, ctx context.Context) {
			rs, err := c.BatchUpsertStart(ctx, []client.PutStartItem{{Key: "k", SliceLengths: []uint64{300}, Config: one, ClientID: "c1"}, {Key: "x", SliceLengths: []uint64{0}, Config: one, ClientID: "c1"}})
			require.NoError(t, err)
			require.Len(t, rs, 2)
			require.NoError(t, rs[0].Err)
			requireCode(t, errcode.InvalidParams, rs[1].Err)
			errs, err := c.BatchUpsertEnd(ctx, "c1", []string{"k", "x"})
			require.NoError(t, err)
			require.NoError(t, errs[0])
			requireCode(t, errcode.ObjectNotFound, errs[1])
			got, _, err := c.GetReplicaList(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, uint64(300), got[0].Buffers[0].Size, "resized")
			_, err = c.BatchUpsertStart(ctx, []client.PutStartItem{{Key: "k", SliceLengths: []uint64{300}, Config: one, ClientID: "c1"}})
			require.NoError(t, err)
			errs, err = c.BatchUpsertRevoke(ctx, "c1", []string{"k"})
			require.NoError(t, err)
			require.NoError(t, errs[0])
		}},
		{"batch remove", func(t *testing.T, b *testBackend, c *client.Client, ctx context.Context) {
			_, err := c.PutStart(ctx, "l", []uint64{10}, one, "c1")
			require.NoError(t, err)
			require.NoError(t, c.PutEnd(ctx, "l", "c1"))
			lease(t, b, "l")
			errs, err := c.BatchRemove(ctx, []string{"k", "l", "nope"}, false)
			require.NoError(t, err)
			require.Len(t, errs, 3)
			require.NoError(t, errs[0])
			requireCode(t, errcode.ObjectHasLease, errs[1])
			requireCode(t, errcode.ObjectNotFound, errs[2])
			errs, err = c.BatchRemove(ctx, []string{"l"}, true)
			require.NoError(t, err)
			require.NoError(t, errs[0], "forced")
		}},
		{"graceful unmount and segment status", func(t *testing.T, b *testBackend, c *client.Client, ctx context.Context) {
			st, err := c.QuerySegmentStatus(ctx, "name-s1", false)
			require.NoError(t, err)
			assert.Equal(t, client.SegmentStatus{State: "OK", Segment: seg("s1", 1<<30), ClientID: "c1", UsedBytes: 100, Objects: 1}, st)
			byID, err := c.QuerySegmentStatus(ctx, "s1", true)
			require.NoError(t, err)
			assert.Equal(t, st, byID)
			_, err = c.QuerySegmentStatus(ctx, "nope", false)
			requireCode(t, errcode.SegmentNotFound, err)

			requireCode(t, errcode.IllegalClient, c.GracefulUnmountSegment(ctx, "c2", "s1", time.Minute), "wrong client")
			requireCode(t, errcode.SegmentNotFound, c.GracefulUnmountSegment(ctx, "c1", "nope", time.Minute))
			require.NoError(t, c.GracefulUnmountSegment(ctx, "c1", "s1", time.Minute))
			st, err = c.QuerySegmentStatus(ctx, "s1", true)
			require.NoError(t, err)
			assert.Equal(t, "GRACEFULLY_UNMOUNTING", st.State)
			assert.Positive(t, st.DrainUntilMs)
			descs, err := c.PutStart(ctx, "m", []uint64{10}, client.ReplicateConfig{ReplicaNum: 1, PreferredSegment: "name-s1"}, "c1")
			require.NoError(t, err)
			assert.Equal(t, "name-s2", descs[0].Buffers[0].SegmentName, "a draining segment takes no allocation")
			all, err := c.ListSegments(ctx)
			require.NoError(t, err)
			require.Len(t, all, 2)
			assert.Equal(t, []string{"s1", "s2"}, []string{all[0].Segment.ID, all[1].Segment.ID})
		}},
		{"service ready and the view version", func(t *testing.T, b *testBackend, c *client.Client, ctx context.Context) {
			v, err := c.ServiceReady(ctx)
			require.NoError(t, err)
			assert.NotEmpty(t, v)
			p, err := c.Ping(ctx, "c1")
			require.NoError(t, err)
			assert.Equal(t, uint64(7), p.ViewVersion)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, c, ctx := setup(t)
			tt.run(t, b, c, ctx)
		})
	}
}
