package fsm

import (
	"testing"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// upsert is an UpsertStart as a leader of this release proposes it (Copy).
func (x *h) upsert(key, client string, sizes ...uint64) Result {
	x.t.Helper()
	return x.apply(&UpsertStart{PutStart: PutStart{NowMs: x.now, Key: key, SliceLengths: sizes, ReplicaNum: 1, ClientID: client}, Copy: true})
}

func (x *h) end(key, client string) Result {
	x.t.Helper()
	return x.apply(&PutEnd{NowMs: x.now, Key: key, ClientID: client})
}

// lastOp is the last OpLog entry the state produced.
func (x *h) lastOp() oplog.Entry {
	x.t.Helper()
	require.NotEmpty(x.t, entries(x.f))
	return entries(x.f)[len(entries(x.f))-1]
}

func addresses(rs []oplog.ReplicaDesc) []uint64 {
	var out []uint64
	for _, r := range rs {
		for _, b := range r.Buffers {
			out = append(out, b.Address)
		}
	}
	return out
}

func TestUpsert(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, x *h)
	}{
		{"absent key is a put", func(t *testing.T, x *h) {
			r := x.upsert("k", "c1", 100)
			require.NoError(t, r.Err)
			assert.Equal(t, "PROCESSING", r.Replicas[0].Status)
			require.NoError(t, x.end("k", "c1").Err)
			assert.Equal(t, oplog.OpPutEnd, x.lastOp().OpType)
			assert.Equal(t, uint64(1), x.lastOp().KeySequenceID)
		}},
		{"same layout rewrites in place, unreadable until the end", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			before := x.f.GetReplicaList("k", x.now)
			require.NoError(t, before.Err)
			used := x.f.used
			r := x.upsert("k", "c2", 100)
			require.NoError(t, r.Err)
			assert.Equal(t, addresses(before.Replicas), addresses(r.Replicas), "the same buffers")
			assert.Equal(t, oplog.OpRemove, x.lastOp().OpType, "followers stop trusting the bytes being rewritten")
			assert.Equal(t, oplog.SourceUpsert, x.lastOp().Source)
			assert.Equal(t, used, x.f.used, "nothing allocated")
			assert.Equal(t, errcode.ReplicaIsNotReady, errcode.Of(x.f.GetReplicaList("k", x.now).Err), "readers never see a half-written object")
			assert.Equal(t, errcode.IllegalClient, x.end("k", "c1").Code(), "the upserting client ends it")
			require.NoError(t, x.end("k", "c2").Err)
			assert.Equal(t, oplog.OpPutEnd, x.lastOp().OpType)
			assert.Equal(t, uint64(3), x.lastOp().KeySequenceID, "an overwrite is a PUT_END with a higher sequence")
			require.NoError(t, x.f.GetReplicaList("k", x.now).Err)
		}},
		{"other size gets new buffers, the old ones go at the end", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			seq := x.f.appliedSeq
			r := x.upsert("k", "c1", 300)
			require.NoError(t, r.Err)
			assert.Equal(t, seq, x.f.appliedSeq, "nothing exported: the old bytes stay intact until the end")
			assert.Equal(t, uint64(400), x.f.used, "old and new held while the upsert runs")
			require.NoError(t, x.end("k", "c1").Err)
			assert.Equal(t, uint64(300), x.f.used)
			o, _ := x.f.getObject("k")
			assert.Equal(t, uint64(300), o.size)
		}},
		{"a leased object is copied, its buffers held until the lease ends", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			read := x.f.GetReplicaList("k", x.now)
			require.NoError(t, read.Err)
			x.tick(lease.Renewal{Key: "k", AtMs: x.now})
			seq := x.f.appliedSeq
			r := x.upsert("k", "c2", 100)
			require.NoError(t, r.Err, "a reader's lease does not refuse an upsert")
			assert.NotEqual(t, addresses(read.Replicas), addresses(r.Replicas), "fresh buffers, not the ones the reader holds")
			assert.Equal(t, seq, x.f.appliedSeq, "nothing exported: followers keep the old object until the PUT_END")
			assert.Equal(t, uint64(200), x.f.used)
			require.NoError(t, x.end("k", "c2").Err)
			assert.Equal(t, oplog.OpPutEnd, x.lastOp().OpType)
			assert.Equal(t, uint64(200), x.f.used, "the reader's buffers stay allocated past the end")
			x.now += x.f.params.LeaseTTLMs - 1
			x.keepAlive("c2")
			assert.Equal(t, uint64(200), x.f.used, "still inside the lease")
			x.now++
			x.keepAlive("c2")
			assert.Equal(t, uint64(100), x.f.used, "a tick frees them once the lease ends")
		}},
		{"an older leader's upsert of a leased object is busy", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			x.tick(lease.Renewal{Key: "k", AtMs: x.now})
			before := x.f.Digest()
			x.code(errcode.ObjectReplicaBusy, &UpsertStart{PutStart: PutStart{NowMs: x.now, Key: "k", SliceLengths: []uint64{100}, ReplicaNum: 1, ClientID: "c1"}})
			assert.Equal(t, before, x.f.Digest(), "nothing changed")
			x.now += x.f.params.LeaseTTLMs
			require.NoError(t, x.upsert("k", "c1", 100).Err, "after the lease")
		}},
		{"the promotion's lease floor copies too", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			x.ok(&Promote{NowMs: x.now, LeaderID: "n2", Term: 2, Params: x.f.params})
			before := x.f.GetReplicaList("k", x.now)
			require.NoError(t, before.Err)
			r := x.upsert("k", "c1", 100)
			require.NoError(t, r.Err)
			assert.NotEqual(t, addresses(before.Replicas), addresses(r.Replicas))
			require.NoError(t, x.end("k", "c1").Err)
			assert.Equal(t, uint64(200), x.f.used, "held for readers the old leader may have had")
			x.now = x.f.leaseFloorMs
			x.keepAlive("c1")
			assert.Equal(t, uint64(100), x.f.used)
		}},
		{"revoking a copy frees the new buffers and holds the old", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			x.tick(lease.Renewal{Key: "k", AtMs: x.now})
			require.NoError(t, x.upsert("k", "c1", 100).Err)
			require.NoError(t, x.apply(&PutRevoke{NowMs: x.now, Key: "k", ClientID: "c1"}).Err)
			assert.False(t, x.exists("k"))
			assert.Equal(t, uint64(100), x.f.used, "the leased buffers are still held")
			x.now += x.f.params.LeaseTTLMs
			x.keepAlive("c1")
			assert.Zero(t, x.f.used)
		}},
		{"no room for the copy fails as a put would", func(t *testing.T, x *h) {
			x.put("k", "c1", 900)
			x.put("filler", "c1", 900) // the other segment
			x.tick(lease.Renewal{Key: "k", AtMs: x.now})
			assert.Equal(t, errcode.NoAvailableHandle, x.upsert("k", "c1", 900).Code())
			o, _ := x.f.getObject("k")
			assert.True(t, o.complete(), "the object is untouched")
			x.now += x.f.params.LeaseTTLMs
			x.keepAlive("c1")
			require.NoError(t, x.upsert("k", "c1", 900).Err, "unleased, it is rewritten in place")
		}},
		{"a write in progress is taken over, its buffers held", func(t *testing.T, x *h) {
			require.NoError(t, x.putStart("k", "c1", 100).Err)
			require.NoError(t, x.upsert("k", "c2", 100).Err)
			assert.Equal(t, uint64(200), x.f.used, "the preempted write's buffers are still held")
			assert.Equal(t, errcode.IllegalClient, x.end("k", "c1").Code(), "the preempted writer cannot end it")
			require.NoError(t, x.end("k", "c2").Err)
			x.now += x.f.params.PutStartReleaseMs
			x.keepAlive("c1")
			x.keepAlive("c2")
			assert.Equal(t, uint64(100), x.f.used, "released after PutStartReleaseMs")
		}},
		{"taking over a resizing upsert tells followers the old value is gone", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			require.NoError(t, x.upsert("k", "c1", 300).Err)
			require.NoError(t, x.upsert("k", "c2", 100).Err)
			assert.Equal(t, oplog.OpRemove, x.lastOp().OpType, "its old buffers are freed at once")
			assert.Equal(t, oplog.SourceUpsert, x.lastOp().Source)
			assert.Equal(t, uint64(400), x.f.used, "the taken-over 300 held, the old 100 freed, the new 100 taken")
		}},
		{"a put taking over a stale resizing upsert tells followers too", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			require.NoError(t, x.upsert("k", "c1", 300).Err)
			x.now += x.f.params.PutStartDiscardMs
			x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c1", AtMs: x.now}, {ClientID: "c2", AtMs: x.now}}})
			require.NoError(t, x.putStart("k", "c2", 50).Err)
			assert.Equal(t, oplog.OpRemove, x.lastOp().OpType, "the old value's buffers are freed")
			assert.Equal(t, oplog.SourceUpsert, x.lastOp().Source)
			assert.Equal(t, uint64(50), x.f.used, "nothing held: the stale writer is taken for gone")
		}},
		{"revoking an in-place upsert removes the object", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			require.NoError(t, x.upsert("k", "c1", 100).Err)
			require.NoError(t, x.apply(&PutRevoke{NowMs: x.now, Key: "k", ClientID: "c1"}).Err)
			assert.False(t, x.exists("k"))
			assert.Equal(t, oplog.OpPutRevoke, x.lastOp().OpType)
			assert.Zero(t, x.f.used)
		}},
		{"revoking a resizing upsert frees old and new", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			require.NoError(t, x.upsert("k", "c1", 200).Err)
			require.NoError(t, x.apply(&PutRevoke{NowMs: x.now, Key: "k", ClientID: "c1"}).Err)
			assert.False(t, x.exists("k"))
			assert.Zero(t, x.f.used)
		}},
		{"bad size", func(t *testing.T, x *h) {
			assert.Equal(t, errcode.InvalidParams, x.upsert("k", "c1", 0).Code())
		}},
		{"end of an unknown key", func(t *testing.T, x *h) {
			assert.Equal(t, errcode.ObjectNotFound, x.end("nope", "c1").Code())
		}},
		{"no room for the new size", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			assert.Equal(t, errcode.NoAvailableHandle, x.upsert("k", "c1", 5000).Code())
			require.NoError(t, x.f.GetReplicaList("k", x.now).Err, "the old value stays readable")
		}},
		{"a buffer on a draining segment is not rewritten", func(t *testing.T, x *h) {
			x.put("k", "c1", 100)
			o, _ := x.f.getObject("k")
			seg := o.replicas[0].buffers[0].seg
			x.ok(&GracefulUnmount{NowMs: x.now, ClientID: seg.clientID, SegmentID: seg.id, GraceMs: 60_000})
			r := x.upsert("k", "c1", 100)
			require.NoError(t, r.Err)
			n, _ := x.f.getObject("k")
			assert.NotSame(t, seg, n.replicas[0].buffers[0].seg, "moved off the draining segment")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newH(t)
			x.mount("c1", "s1", 0, 1000)
			x.mount("c2", "s2", 1<<20, 1000)
			tt.run(t, x)
			g := roundTrip(t, x.f)
			assert.Equal(t, x.f.Digest(), g.Digest(), "the state survives a snapshot")
		})
	}
}

func TestBatchRemove(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	x.put("a", "c1", 10)
	x.put("b", "c1", 10)
	x.tick(lease.Renewal{Key: "b", AtMs: x.now})
	r := x.ok(&Batch{Cmds: []Command{
		&Remove{NowMs: x.now, Key: "a"},
		&Remove{NowMs: x.now, Key: "b"},
		&Remove{NowMs: x.now, Key: "missing"},
	}})
	require.Len(t, r.Batch, 3)
	assert.Equal(t, errcode.OK, r.Batch[0].Code())
	assert.Equal(t, errcode.ObjectHasLease, r.Batch[1].Code())
	assert.Equal(t, errcode.ObjectNotFound, r.Batch[2].Code())
	r = x.ok(&Batch{Cmds: []Command{&Remove{NowMs: x.now, Key: "b", Force: true}}})
	assert.Equal(t, errcode.OK, r.Batch[0].Code(), "force overrides the lease")
	assert.False(t, x.exists("b"))
}

func TestGracefulUnmount(t *testing.T) {
	setup := func(t *testing.T) *h {
		x := newH(t)
		x.mount("c1", "s1", 0, 1000)
		x.mount("c2", "s2", 1<<20, 1000)
		x.apply(&PutStart{NowMs: x.now, Key: "k", SliceLengths: []uint64{100}, ReplicaNum: 1, PreferredSegment: "name-s1", ClientID: "c1"})
		x.end("k", "c1")
		x.ok(&GracefulUnmount{NowMs: x.now, ClientID: "c1", SegmentID: "s1", GraceMs: 10_000})
		return x
	}
	t.Run("errors", func(t *testing.T) {
		x := setup(t)
		x.code(errcode.SegmentNotFound, &GracefulUnmount{NowMs: x.now, ClientID: "c1", SegmentID: "nope", GraceMs: 1})
		x.code(errcode.IllegalClient, &GracefulUnmount{NowMs: x.now, ClientID: "c2", SegmentID: "s1", GraceMs: 1})
		x.code(errcode.InvalidParams, &GracefulUnmount{NowMs: x.now, ClientID: "c2", SegmentID: "s2", GraceMs: -1})
		_, err := x.f.SegmentStatus("nope", true)
		assert.Equal(t, errcode.SegmentNotFound, errcode.Of(err))
	})
	t.Run("no new allocation, reads go on, status says so", func(t *testing.T) {
		x := setup(t)
		r := x.apply(&PutStart{NowMs: x.now, Key: "new", SliceLengths: []uint64{100}, ReplicaNum: 1, PreferredSegment: "name-s1", ClientID: "c1"})
		require.NoError(t, r.Err)
		assert.Equal(t, "name-s2", r.Replicas[0].Buffers[0].SegmentName, "the preferred segment drains")
		require.NoError(t, x.f.GetReplicaList("k", x.now).Err)
		st, err := x.f.SegmentStatus("name-s1", true)
		require.NoError(t, err)
		assert.Equal(t, SegmentGracefullyUnmounting, st.State)
		assert.Equal(t, 1, st.Objects)
		assert.Equal(t, uint64(100), st.Used)
		assert.Equal(t, x.now+10_000, st.DrainUntilMs)
		byID, err := x.f.SegmentStatus("s1", false)
		require.NoError(t, err)
		assert.Equal(t, st, byID)
		x.ok(&GracefulUnmount{NowMs: x.now + 5, ClientID: "c1", SegmentID: "s1", GraceMs: 1})
		st, _ = x.f.SegmentStatus("s1", false)
		assert.Equal(t, x.now+10_000, st.DrainUntilMs, "asking again keeps the first deadline")
	})
	t.Run("unmounted once idle", func(t *testing.T) {
		x := setup(t)
		x.ok(&DrainSegments{NowMs: x.now})
		_, err := x.f.SegmentStatus("s1", false)
		assert.Equal(t, errcode.SegmentNotFound, errcode.Of(err), "no lease, no writer: unmounted")
		assert.False(t, x.exists("k"), "its only replica went with it")
		assert.Equal(t, oplog.SourceUnmountSegment, x.lastOp().Source)
	})
	t.Run("a lease holds it until the lease ends or the deadline", func(t *testing.T) {
		x := setup(t)
		x.tick(lease.Renewal{Key: "k", AtMs: x.now})
		x.ok(&DrainSegments{NowMs: x.now})
		_, err := x.f.SegmentStatus("s1", false)
		require.NoError(t, err, "leased: still mounted")
		x.now += x.f.params.LeaseTTLMs
		x.keepAlive("c1")
		x.ok(&DrainSegments{NowMs: x.now})
		_, err = x.f.SegmentStatus("s1", false)
		assert.Equal(t, errcode.SegmentNotFound, errcode.Of(err), "lease over")
	})
	t.Run("a writer holds it until the deadline", func(t *testing.T) {
		x := newH(t)
		x.mount("c1", "s1", 0, 1000)
		require.NoError(t, x.putStart("w", "c1", 100).Err)
		x.ok(&GracefulUnmount{NowMs: x.now, ClientID: "c1", SegmentID: "s1", GraceMs: 3_000})
		x.ok(&DrainSegments{NowMs: x.now})
		_, err := x.f.SegmentStatus("s1", false)
		require.NoError(t, err, "being written: still mounted")
		g := roundTrip(t, x.f)
		assert.Equal(t, x.f.Digest(), g.Digest(), "a draining segment survives a snapshot")
		x.now += 3_000
		x.keepAlive("c1")
		x.ok(&DrainSegments{NowMs: x.now})
		_, err = x.f.SegmentStatus("s1", false)
		assert.Equal(t, errcode.SegmentNotFound, errcode.Of(err), "deadline passed")
		assert.False(t, x.exists("w"))
	})
}
