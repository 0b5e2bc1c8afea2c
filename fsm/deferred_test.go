package fsm

import (
	"fmt"
	"testing"

	"github.com/moonraft/moonraft/oplog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fill mounts c1's segment s1 and puts n objects on it.
func fill(x *h, n int) {
	x.mount("c1", "s1", 0x1000_0000, 1<<20)
	for i := range n {
		x.put(fmt.Sprintf("k%02d", i), "c1", 1024)
	}
}

func removesOf(es []oplog.Entry) map[string]int {
	out := map[string]int{}
	for _, e := range es {
		if e.OpType == oplog.OpRemove {
			out[e.Key]++
		}
	}
	return out
}

// Until a ReleaseRemovals turns deferral on, a bulk removal exports every
// REMOVE at once: a cluster of the earlier release keeps its rule.
func TestBulkRemovalsNotDeferredUntilTurnedOn(t *testing.T) {
	x := newH(t)
	fill(x, 10)
	before := len(entries(x.f))
	r := x.ok(&UnmountSegment{NowMs: x.now, ClientID: "c1", SegmentID: "s1"})
	assert.Equal(t, uint64(10), r.Removed)
	assert.Len(t, entries(x.f), before+10)
	n, _, waiting := x.f.DeferredRemovals()
	assert.Zero(t, n)
	assert.False(t, waiting)
}

// With deferral on, a bulk removal exports Direct REMOVEs at once and
// queues the rest; releases move them into the ring in order; each key
// gets exactly one REMOVE.
func TestBulkRemovalsDeferred(t *testing.T) {
	for _, tc := range []struct {
		name string
		bulk func(x *h) Result
	}{
		{"unmount", func(x *h) Result { return x.ok(&UnmountSegment{NowMs: x.now, ClientID: "c1", SegmentID: "s1"}) }},
		{"RemoveAll", func(x *h) Result { return x.ok(&RemoveAll{NowMs: x.now, Force: true}) }},
		{"RemoveByRegex", func(x *h) Result { return x.ok(&RemoveByRegex{NowMs: x.now, Regex: "^k", Force: true}) }},
		{"session expiry", func(x *h) Result {
			x.now += DefaultParams().ClientTTLMs + 1
			return x.tick()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newH(t)
			fill(x, 10)
			x.ok(&ReleaseRemovals{NowMs: x.now, Direct: 3})
			before := len(entries(x.f))
			r := tc.bulk(x)
			assert.Equal(t, uint64(10), r.Removed)
			assert.Len(t, entries(x.f), before+3, "Direct REMOVEs at once")
			n, oldest, ok := x.f.DeferredRemovals()
			require.True(t, ok)
			assert.Equal(t, 7, n)
			assert.Equal(t, x.now, oldest)
			assert.Zero(t, x.f.Stats().Objects, "the state lost them at once")

			assert.Equal(t, uint64(4), x.ok(&ReleaseRemovals{NowMs: x.now + 5, Max: 4, Direct: 3}).Released)
			assert.Len(t, entries(x.f), before+7)
			assert.Equal(t, uint64(3), x.ok(&ReleaseRemovals{NowMs: x.now + 5, Max: 100, Direct: 3}).Released)
			_, _, ok = x.f.DeferredRemovals()
			assert.False(t, ok)
			es := entries(x.f)[before:]
			assert.Len(t, removesOf(es), 10)
			for k, c := range removesOf(es) {
				assert.Equal(t, 1, c, "%s", k)
			}
			seq := es[0].SequenceID
			for _, e := range es {
				assert.Equal(t, seq, e.SequenceID, "gapless")
				seq++
			}
		})
	}
}

// A key written again while its REMOVE waits has the REMOVE exported
// first, so its key_sequence_ids stay in order in the OpLog.
func TestDeferredRemoveGoesBeforeTheKeysNextEntry(t *testing.T) {
	x := newH(t)
	fill(x, 6)
	x.ok(&ReleaseRemovals{NowMs: x.now, Direct: 1})
	x.ok(&RemoveAll{NowMs: x.now, Force: true})
	n, _, _ := x.f.DeferredRemovals()
	require.Equal(t, 5, n)
	before := len(entries(x.f))
	x.put("k04", "c1", 1024) // k00 went at once; k04 waits
	es := entries(x.f)[before:]
	require.Len(t, es, 2)
	assert.Equal(t, oplog.OpRemove, es[0].OpType)
	assert.Equal(t, "k04", es[0].Key)
	assert.Equal(t, oplog.OpPutEnd, es[1].OpType)
	assert.Greater(t, es[1].KeySequenceID, es[0].KeySequenceID)
	n, _, _ = x.f.DeferredRemovals()
	assert.Equal(t, 4, n)

	x.ok(&ReleaseRemovals{NowMs: x.now, Max: 100, Direct: 1})
	assert.NotContains(t, removesOf(entries(x.f)[before+2:]), "k04", "exported once")
}

// A release never takes the ring past its bound.
func TestReleaseBoundedByTheRing(t *testing.T) {
	x := newH(t)
	p := DefaultParams()
	p.ExportRingCap = 14
	x.ok(&Promote{NowMs: x.now, LeaderID: "n1", Term: 1, Params: p})
	fill(x, 10) // 10 PUT_ENDs in the ring
	x.ok(&ReleaseRemovals{NowMs: x.now, Direct: 1})
	x.ok(&RemoveAll{NowMs: x.now, Force: true}) // 1 at once: 11
	assert.Equal(t, uint64(3), x.ok(&ReleaseRemovals{NowMs: x.now, Max: 100, Direct: 1}).Released)
	assert.Len(t, x.f.Ring().Entries(), 14)
	x.ok(&Exported{Seq: x.f.AppliedSeq()})
	assert.Equal(t, uint64(6), x.ok(&ReleaseRemovals{NowMs: x.now, Max: 100, Direct: 1}).Released)
}

// A removed key's sequence is kept while its REMOVE waits, however long,
// and for KeySeqRetainMs after it is exported, as an etcd watcher keeps it.
func TestTombstoneKeptWhileRemoveWaits(t *testing.T) {
	x := newH(t)
	p := DefaultParams()
	p.KeySeqRetainMs = 1000
	x.ok(&Promote{NowMs: x.now, LeaderID: "n1", Term: 1, Params: p})
	fill(x, 3)
	x.ok(&ReleaseRemovals{NowMs: x.now, Direct: 1})
	x.ok(&RemoveAll{NowMs: x.now, Force: true})
	x.now += 5000
	x.keepAlive("c1")
	_, ok := x.f.tombstones.Get(tombstone{key: "k02"})
	require.True(t, ok, "its REMOVE waits")
	_, ok = x.f.tombstones.Get(tombstone{key: "k00"})
	require.False(t, ok, "exported at once, forgotten after KeySeqRetainMs")

	x.ok(&ReleaseRemovals{NowMs: x.now, Max: 100, Direct: 1})
	x.now += 500
	x.keepAlive("c1")
	_, ok = x.f.tombstones.Get(tombstone{key: "k02"})
	require.True(t, ok, "KeySeqRetainMs from its export")
	x.now += 600
	x.keepAlive("c1")
	_, ok = x.f.tombstones.Get(tombstone{key: "k02"})
	require.False(t, ok)
}

// The queue is in the snapshot: a state restored mid-deferral has the
// same digest and goes on the same way.
func TestDeferredRemovalsSnapshot(t *testing.T) {
	x := newH(t)
	fill(x, 8)
	x.ok(&ReleaseRemovals{NowMs: x.now, Direct: 2})
	x.ok(&RemoveAll{NowMs: x.now, Force: true})
	x.put("k05", "c1", 1024) // one flushed ahead of its turn
	y := roundTrip(t, x.f)
	require.NoError(t, y.CheckInvariants())
	require.Equal(t, x.f.Digest(), y.Digest())
	for _, c := range []Command{
		&ReleaseRemovals{NowMs: x.now, Max: 2, Direct: 2},
		&PutStart{NowMs: x.now, Key: "k07", SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1"},
		&PutEnd{NowMs: x.now, Key: "k07", ClientID: "c1"},
		&ReleaseRemovals{NowMs: x.now, Max: 10, Direct: 2},
	} {
		a, b := x.f.ApplyCommand(c), y.ApplyCommand(c)
		require.Equal(t, a.Err, b.Err)
		require.Equal(t, x.f.Digest(), y.Digest(), "after %T", c)
	}
	assert.Equal(t, entries(x.f), entries(y))
}

// A rebuild from a snapshot taken mid-deferral plus the OpLog after it
// ends where the source does once every deferred REMOVE is exported: the
// REMOVEs it finds already applied in the snapshot only leave its queue.
func TestReplayDeferredRemovals(t *testing.T) {
	x := newH(t)
	fill(x, 12)
	x.ok(&ReleaseRemovals{NowMs: x.now, Direct: 2})
	x.ok(&RemoveAll{NowMs: x.now, Force: true})
	x.ok(&Exported{Seq: x.f.AppliedSeq()}) // etcd holds everything so far
	exported := x.f.AppliedSeq()
	b := roundTrip(t, x.f)

	x.put("k07", "c1", 1024) // its REMOVE goes first
	x.ok(&ReleaseRemovals{NowMs: x.now, Max: 3, Direct: 2})
	x.put("k20", "c1", 2048)
	x.ok(&ReleaseRemovals{NowMs: x.now, Max: 100, Direct: 2})
	_, _, waiting := x.f.DeferredRemovals()
	require.False(t, waiting)

	n, _, err := b.ReplayEntries(x.f.RingAfter(exported, 1<<30).Entries())
	require.NoError(t, err)
	assert.Positive(t, n)
	require.NoError(t, b.CheckInvariants())
	assert.Equal(t, x.f.AppliedSeq(), b.AppliedSeq())
	assert.Equal(t, completeObjects(x.f), completeObjects(b))
	assert.Equal(t, x.f.ObjectSetDigest(), b.ObjectSetDigest())
	_, _, waiting = b.DeferredRemovals()
	assert.False(t, waiting, "every deferred REMOVE was replayed off the queue")
}
