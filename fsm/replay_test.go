package fsm

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// replayStream is the command generator restricted to what the OpLog can
// express, so that a snapshot plus the entries after it determine the
// object set. gen's stream goes beyond it in three ways, each of which
// creates or frees buffers without an entry (TestReplayLimits shows each):
//   - a replica of a live object lost with a segment: its slices on other,
//     surviving segments are freed silently and reused (a replica may span
//     segments). Here every put, from the start, has one replica, so losing
//     it removes the object, which is exported.
//   - a segment mounted after the snapshot: replay has no such segment.
//     Here every mount after the snapshot brings back a segment of the
//     snapshot, with its owner and spec; the objects that were on it went
//     with exported REMOVEs when it was unmounted.
//   - a PROCESSING put of the snapshot, abandoned and replaced by a new
//     PutStart: its buffers are freed silently. Such PutStarts are redrawn
//     (gen's few keys in progress at the snapshot rarely meet it, but the
//     property must not rest on that).
type replayStream struct {
	g        *gen
	snapSegs []*segment       // segments at the snapshot, by id; nil before it
	snapProc map[string]int64 // PROCESSING keys at the snapshot → putStartMs
	redrawn  int
}

func (s *replayStream) next(f *FSM) Command {
	for {
		if c := s.adapt(f, s.g.next(f)); c != nil {
			return c
		}
		s.redrawn++
	}
}

// snapshotTaken records what replay will start from.
func (s *replayStream) snapshotTaken(f *FSM) {
	s.snapSegs = append([]*segment(nil), f.segOrder...)
	s.snapProc = map[string]int64{}
	for key, o := range f.processing.objs {
		s.snapProc[key] = o.putStartMs
	}
}

// adapt returns c made expressible, or nil to draw another command.
func (s *replayStream) adapt(f *FSM, c Command) Command {
	// Deferred REMOVEs leave etcd's view behind the source until they are
	// exported, which replay then reconciles: TestReplayDeferredRemovals.
	if _, ok := c.(*ReleaseRemovals); ok {
		return nil
	}
	// One replica per object, so every replica an unmount drops takes its
	// object, and the OpLog says so.
	expressible := func(p *PutStart) bool {
		p.ReplicaNum = 1
		return !s.replacesSnapshotPut(f, p.Key)
	}
	switch c := c.(type) {
	case *PutStart:
		if !expressible(c) {
			return nil
		}
	case *UpsertStart:
		if !expressible(&c.PutStart) {
			return nil
		}
	case *Batch:
		for _, cmd := range c.Cmds {
			switch p := cmd.(type) {
			case *PutStart:
				if !expressible(p) {
					return nil
				}
			case *UpsertStart:
				if !expressible(&p.PutStart) {
					return nil
				}
			}
		}
	case *MountSegment:
		if s.snapSegs != nil {
			// gen mounts a random spec; here its owner mounts a segment of
			// the snapshot again, which keeps the stream alive.
			sg := s.snapSegs[s.g.r.IntN(len(s.snapSegs))]
			c.ClientID, c.Segment = sg.clientID, sg.spec()
		}
	case *RemountSegments:
		if s.snapSegs != nil {
			return nil
		}
	}
	return c
}

func (s *replayStream) replacesSnapshotPut(f *FSM, key string) bool {
	o, ok := f.getObject(key)
	if !ok || !o.processing() {
		return false
	}
	at, ok := s.snapProc[key]
	return ok && at == o.putStartMs
}

// completeObjects is what an etcd follower knows of the complete objects:
// key → key seq and PUT_END payload.
func completeObjects(f *FSM) map[string]string {
	out := map[string]string{}
	f.EachComplete(func(key string, keySeq uint64, p oplog.PutEndPayload) {
		out[key] = fmt.Sprintf("%d %s", keySeq, oplog.EncodePutEndPayload(p))
	})
	return out
}

// TestReplayReproducesSource is the property disaster recovery rests on: a
// snapshot of cluster A, restored into B, plus the OpLog A wrote after it,
// gives B A's complete objects — same keys, sizes, key seqs, and, with one
// replica per object, the same buffers — and A's applied seq, with every
// invariant holding after each entry. B replays A's entries as A produces
// them and is compared at checkpoints, not only at the end, since gen's
// state churns.
func TestReplayReproducesSource(t *testing.T) {
	const before, after, checkEvery = 4000, 6000, 10
	ops := map[oplog.OpType]int{}
	var overProcessing, redrawn, compared int
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			s := &replayStream{g: newGen(rand.New(rand.NewPCG(seed, 11)))}
			a := New()
			// The snapshot is taken once the state has some segments and a
			// put in progress, so replay has something to complete.
			for i := 0; i < before || len(a.segOrder) < 3 || a.processing.len() == 0; i++ {
				a.Apply(Encode(s.next(a)))
			}
			var buf bytes.Buffer
			require.NoError(t, a.Snapshot().Write(&buf, snapshots.Header{}))
			s.snapshotTaken(a)
			b := New()
			_, err := b.Restore(&buf)
			require.NoError(t, err)

			entries := 0
			for i := 1; i <= after; i++ {
				seq := a.appliedSeq
				a.Apply(Encode(s.next(a)))
				for _, e := range a.RingAfter(seq, math.MaxInt).Entries() {
					if o, ok := b.getObject(e.Key); ok && o.processing() && e.OpType == oplog.OpPutEnd {
						overProcessing++
					}
					note, err := b.ReplayEntry(e)
					require.NoError(t, err, "entry %d", e.SequenceID)
					require.Equal(t, ReplayNote{}, note, "entry %d: nothing to reconcile in this stream", e.SequenceID)
					require.NoError(t, b.CheckInvariants(), "after entry %d", e.SequenceID)
					ops[e.OpType]++
					entries++
				}
				// Every entry A produced was collected and replayed.
				require.Equal(t, a.appliedSeq, b.appliedSeq, "command %d", i)
				if i%checkEvery != 0 && i != after {
					continue
				}
				// A key whose REMOVE A has deferred (a bulk removal's) is
				// still in etcd's view until A exports it: the window a
				// rebuild from etcd misses.
				want, got := completeObjects(a), completeObjects(b)
				for k := range a.deferral.at {
					delete(got, k)
				}
				require.Equal(t, want, got, "command %d", i)
				if len(a.deferral.at) == 0 {
					require.Equal(t, a.ObjectSetDigest(), b.ObjectSetDigest(), "command %d", i)
				}
				compared += len(want)
				// A forgets tombstones at its ticks; replay has no ticks, so
				// it may remember more, never other.
				a.tombstones.Ascend(func(ta tombstone) bool {
					if _, waiting := a.deferral.at[ta.key]; waiting {
						return true
					}
					tb, ok := b.tombstones.Get(tombstone{key: ta.key})
					require.True(t, ok && tb == ta, "command %d: tombstone %+v, replay has %+v", i, ta, tb)
					return true
				})
			}
			require.Empty(t, b.Ring().Entries(), "every replayed entry is in etcd already")
			// The offline tool writes the result as the new cluster's snapshot.
			require.Equal(t, b.Digest(), roundTrip(t, b).Digest())
			redrawn += s.redrawn
			t.Logf("%d entries replayed; %d commands redrawn", entries, s.redrawn)
		})
	}
	// The property proves little unless every kind of entry occurred, puts
	// in progress at the snapshot were completed by replay, and there were
	// objects to compare.
	for _, op := range []oplog.OpType{oplog.OpPutEnd, oplog.OpRemove, oplog.OpPutRevoke} {
		require.Positive(t, ops[op], "no %v entry replayed", op)
	}
	require.Positive(t, overProcessing, "no PUT_END over a PROCESSING object of the snapshot")
	require.Greater(t, compared, 5000, "too few complete objects compared")
	t.Logf("entries by op %v; PUT_END over a snapshot PROCESSING object %d; complete objects compared %d; commands redrawn %d",
		ops, overProcessing, compared, redrawn)
}

// replayFix is a source cluster and a state restored from its snapshot: c1
// owns s1 and s2, which hold "done" (complete, key seq 1) and "busy"
// (PROCESSING); s3, mounted last, is empty. The snapshot's export ring still
// holds done's PUT_END.
type replayFix struct {
	src     *h
	dst     *FSM
	snapSeq uint64
}

const s3Base = 0x30000

func newReplayFix(t *testing.T) *replayFix {
	src := newH(t)
	src.mount("c1", "s1", 0x10000, 1000)
	src.mount("c1", "s2", 0x20000, 1000)
	src.put("done", "c1", 100)
	require.NoError(t, src.putStart("busy", "c1", 200).Err)
	src.mount("c1", "s3", s3Base, 1000)
	dst := roundTrip(t, src.f)
	require.Len(t, dst.Ring().Entries(), 1)
	return &replayFix{src, dst, src.f.appliedSeq}
}

// entries are the source's OpLog entries after the snapshot.
func (x *replayFix) entries() []oplog.Entry {
	return x.src.f.RingAfter(x.snapSeq, math.MaxInt).Entries()
}

// next returns the dst's next entry, one second later.
func (x *replayFix) next(op oplog.OpType, key, payload string, keySeq uint64) oplog.Entry {
	return oplog.NewEntry(x.dst.appliedSeq+1, x.dst.nowMs+1000, op, key, payload, keySeq, oplog.SourceNone)
}

// putEnd returns the dst's next PUT_END of key with the given replicas.
func (x *replayFix) putEnd(key string, keySeq, size uint64, replicas ...[]oplog.BufferDesc) oplog.Entry {
	p := oplog.PutEndPayload{Size: size}
	for _, bs := range replicas {
		p.Replicas = append(p.Replicas, oplog.ReplicaDesc{Status: oplog.ReplicaComplete, Buffers: bs})
	}
	return x.next(oplog.OpPutEnd, key, oplog.EncodePutEndPayload(p), keySeq)
}

// at is the buffer of key's first slice in dst, as a descriptor.
func (x *replayFix) at(key string) oplog.BufferDesc {
	o, ok := x.dst.getObject(key)
	require.True(x.src.t, ok, key)
	return o.descriptors()[0].Buffers[0]
}

func s3(off, size uint64) []oplog.BufferDesc {
	return []oplog.BufferDesc{{SegmentID: "s3", SegmentName: "name-s3", Address: s3Base + off, Size: size}}
}

func tombOf(f *FSM, key string) (tombstone, bool) {
	return f.tombstones.Get(tombstone{key: key})
}

// replay applies e to f and checks the invariants.
func replay(t *testing.T, f *FSM, e oplog.Entry) {
	t.Helper()
	_, err := f.ReplayEntry(e)
	require.NoError(t, err)
	require.NoError(t, f.CheckInvariants())
	require.Equal(t, e.SequenceID, f.appliedSeq)
	require.Empty(t, f.Ring().Entries(), "the ring holds nothing etcd has")
}

func TestReplayPutEndOverProcessing(t *testing.T) {
	x := newReplayFix(t)
	x.src.ok(&PutEnd{NowMs: x.src.now + 5, Key: "busy", ClientID: "c1"})
	es := x.entries()
	require.Len(t, es, 1)
	replay(t, x.dst, es[0])

	o, ok := x.dst.getObject("busy")
	require.True(t, ok)
	want, _ := x.src.f.getObject("busy")
	require.Equal(t, want.descriptors(), o.descriptors(), "the very buffers the put had, now COMPLETE")
	require.Equal(t, object{size: 200, putStartMs: es[0].TimestampMs, leaseMs: es[0].TimestampMs, keySeq: 1},
		object{size: o.size, clientID: o.clientID, putStartMs: o.putStartMs, leaseMs: o.leaseMs, softPin: o.softPin, keySeq: o.keySeq},
		"what the entry does not say is neutral: no client, no soft pin")
	require.Zero(t, x.dst.processing.len())
	require.Equal(t, x.src.f.used, x.dst.used)
	require.Equal(t, x.src.f.ObjectSetDigest(), x.dst.ObjectSetDigest())

	// The original client's retry is refused, which is harmless: the object
	// is complete.
	require.Equal(t, errcode.IllegalClient, x.dst.ApplyCommand(&PutEnd{NowMs: x.src.now, Key: "busy", ClientID: "c1"}).Code())
}

func TestReplayPutEndReplacesCompleteObject(t *testing.T) {
	x := newReplayFix(t)
	old := x.at("done")
	usedBefore := x.dst.used
	replay(t, x.dst, x.putEnd("done", 2, 150, s3(0, 150)))
	o, _ := x.dst.getObject("done")
	require.Equal(t, uint64(2), o.keySeq)
	require.Equal(t, s3(0, 150), o.descriptors()[0].Buffers)
	require.Equal(t, usedBefore+50, x.dst.used, "the old 100 bytes are freed, 150 taken")
	// The old place is free again: another object may take it.
	replay(t, x.dst, x.putEnd("other", 1, old.Size, []oplog.BufferDesc{old}))
}

func TestReplayPutEndReusingOwnBuffers(t *testing.T) {
	x := newReplayFix(t)
	old := x.at("done")
	moved := old
	moved.Address += 50 // overlaps the old place, which is freed first
	replay(t, x.dst, x.putEnd("done", 2, 100, []oplog.BufferDesc{moved}))
	require.Equal(t, moved, x.at("done"))
}

func TestReplayRemovals(t *testing.T) {
	tests := []struct {
		name           string
		entry          func(x *replayFix) oplog.Entry
		key            string
		keySeq         uint64
		wantProcessing int // PROCESSING objects left
	}{
		{"REMOVE of a live key", func(x *replayFix) oplog.Entry {
			x.src.ok(&Remove{NowMs: x.src.now + 5, Key: "done", Force: true})
			return x.entries()[0]
		}, "done", 2, 1},
		{"PUT_REVOKE", func(x *replayFix) oplog.Entry {
			x.src.ok(&PutRevoke{NowMs: x.src.now + 5, Key: "busy", ClientID: "c1"})
			return x.entries()[0]
		}, "busy", 1, 0},
		{"REMOVE of a PROCESSING put", func(x *replayFix) oplog.Entry {
			x.src.now += x.src.f.params.PutStartReleaseMs + 1
			x.src.keepAlive("c1") // reclaims it: REMOVE source=discard
			return x.entries()[0]
		}, "busy", 1, 0},
		{"REMOVE of an absent key", func(x *replayFix) oplog.Entry {
			return x.next(oplog.OpRemove, "ghost", "", 5)
		}, "ghost", 5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newReplayFix(t)
			e := tt.entry(x)
			_, existed := x.dst.getObject(tt.key)
			usedBefore := x.dst.used
			replay(t, x.dst, e)
			_, ok := x.dst.getObject(tt.key)
			require.False(t, ok)
			tomb, ok := tombOf(x.dst, tt.key)
			require.True(t, ok)
			require.Equal(t, tombstone{tt.key, tt.keySeq, e.TimestampMs}, tomb)
			if existed {
				require.Less(t, x.dst.used, usedBefore, "its buffers are freed")
			}
			require.Equal(t, tt.wantProcessing, x.dst.processing.len())
			if e.Key != "ghost" {
				require.Equal(t, x.src.f.ObjectSetDigest(), x.dst.ObjectSetDigest())
			}
		})
	}
}

// TestReplayKeySeqContinues replays a key's life and then lets the restored
// state run: the key's sequence goes on from the replayed tombstone.
func TestReplayKeySeqContinues(t *testing.T) {
	x := newReplayFix(t)
	steps := []struct {
		e      oplog.Entry
		live   bool
		keySeq uint64 // of the object, or of the tombstone
	}{
		{x.putEnd("k", 1, 10, s3(0, 10)), true, 1},
		{x.next(oplog.OpRemove, "k", "", 2), false, 2},
		{x.putEnd("k", 3, 20, s3(5, 20)), true, 3},
		{x.putEnd("k", 4, 30, s3(100, 30)), true, 4}, // a newer life without a REMOVE seen
		{x.next(oplog.OpPutRevoke, "k", "", 5), false, 5},
	}
	for i, st := range steps {
		st.e = oplog.NewEntry(x.dst.appliedSeq+1, st.e.TimestampMs+int64(i), st.e.OpType, st.e.Key, st.e.Payload, st.e.KeySequenceID, st.e.Source)
		replay(t, x.dst, st.e)
		o, live := x.dst.getObject("k")
		tomb, buried := tombOf(x.dst, "k")
		require.Equal(t, st.live, live, "step %d", i)
		require.Equal(t, !st.live, buried, "step %d: a tombstone exactly while the key is gone", i)
		if live {
			require.Equal(t, st.keySeq, o.keySeq, "step %d", i)
		} else {
			require.Equal(t, tombstone{"k", st.keySeq, st.e.TimestampMs}, tomb, "step %d", i)
		}
	}

	// The rebuilt state goes on as a cluster: a new put of k continues the
	// key's sequence, and the OpLog continues the replayed seq.
	now := x.dst.nowMs + 1
	f := x.dst
	require.NoError(t, f.ApplyCommand(&PutStart{NowMs: now, Key: "k", SliceLengths: []uint64{8}, ReplicaNum: 1, ClientID: "c1"}).Err)
	require.NoError(t, f.ApplyCommand(&PutEnd{NowMs: now, Key: "k", ClientID: "c1"}).Err)
	require.NoError(t, f.CheckInvariants())
	ring := f.Ring().Entries()
	require.Len(t, ring, 1)
	require.Equal(t, oplog.NewEntry(x.snapSeq+uint64(len(steps))+1, now, oplog.OpPutEnd, "k", ring[0].Payload, 6, oplog.SourceNone), ring[0])
}

// TestReplayErrors: every refused entry names what is wrong and leaves the
// state exactly as it was, export ring included.
func TestReplayErrors(t *testing.T) {
	tests := []struct {
		name  string
		entry func(x *replayFix) oplog.Entry
		code  errcode.Code
		msg   string
	}{
		{"gap", func(x *replayFix) oplog.Entry {
			return oplog.NewEntry(x.dst.appliedSeq+2, x.dst.nowMs, oplog.OpRemove, "done", "", 2, oplog.SourceRemove)
		}, errcode.OplogEntryNotFound, "the OpLog has a gap"},
		{"already applied", func(x *replayFix) oplog.Entry {
			return oplog.NewEntry(x.dst.appliedSeq, x.dst.nowMs, oplog.OpRemove, "done", "", 2, oplog.SourceRemove)
		}, errcode.OplogEntryNotFound, "is not after applied seq"},
		{"bad checksum", func(x *replayFix) oplog.Entry {
			e := x.next(oplog.OpRemove, "done", "", 2)
			e.Key = "dome"
			e.PrefixHash = oplog.PrefixHash(e.Key)
			return e
		}, errcode.ChecksumMismatch, "checksum"},
		{"bad prefix hash", func(x *replayFix) oplog.Entry {
			e := x.next(oplog.OpRemove, "done", "", 2)
			e.PrefixHash++
			return e
		}, errcode.ChecksumMismatch, "prefix_hash"},
		{"invalid key", func(x *replayFix) oplog.Entry {
			return x.next(oplog.OpRemove, "", "", 2)
		}, errcode.InvalidKey, "key is empty"},
		{"key_sequence_id 0", func(x *replayFix) oplog.Entry {
			return x.next(oplog.OpRemove, "ghost", "", 0)
		}, errcode.InvalidParams, "sequences start at 1"},
		{"key_sequence_id not above the live object's", func(x *replayFix) oplog.Entry {
			return x.next(oplog.OpRemove, "done", "", 1)
		}, errcode.InvalidParams, "not of one cluster"},
		{"unknown op type", func(x *replayFix) oplog.Entry {
			return x.next(oplog.OpType(9), "done", "", 2)
		}, errcode.InvalidParams, "unknown op type"},
		{"malformed payload", func(x *replayFix) oplog.Entry {
			return x.next(oplog.OpPutEnd, "new", `{"size":1}`, 1)
		}, errcode.InvalidParams, "replicas"},
		{"no replica", func(x *replayFix) oplog.Entry {
			return x.putEnd("new", 1, 10)
		}, errcode.InvalidParams, "0 replicas"},
		{"replica without buffers", func(x *replayFix) oplog.Entry {
			return x.putEnd("new", 1, 0, nil)
		}, errcode.InvalidParams, "has 0 buffers"},
		{"sizes do not add up", func(x *replayFix) oplog.Entry {
			return x.putEnd("new", 1, 10, s3(0, 10), s3(20, 9))
		}, errcode.InvalidParams, "replica 1 holds 9 bytes, the object is 10"},
		{"sizes overflow", func(x *replayFix) oplog.Entry {
			require.NoError(t, x.dst.ApplyCommand(&MountSegment{NowMs: x.dst.nowMs, ClientID: "c9",
				Segment: SegmentSpec{ID: "huge", Name: "name-huge", Base: 0, Size: math.MaxUint64}}).Err)
			half := oplog.BufferDesc{SegmentID: "huge", SegmentName: "name-huge", Address: 0, Size: 1 << 63}
			return x.putEnd("new", 1, 10, []oplog.BufferDesc{half, half})
		}, errcode.InvalidParams, "buffer sizes overflow 64 bits"},
		{"below its segment", func(x *replayFix) oplog.Entry {
			return x.putEnd("new", 1, 10, []oplog.BufferDesc{{SegmentID: "s3", SegmentName: "name-s3", Address: s3Base - 1, Size: 10}})
		}, errcode.InvalidParams, "does not lie inside segment"},
		{"past its segment", func(x *replayFix) oplog.Entry {
			return x.putEnd("new", 1, 20, s3(990, 20))
		}, errcode.InvalidParams, "does not lie inside segment"},
		{"zero-size buffer", func(x *replayFix) oplog.Entry {
			return x.putEnd("new", 1, 10, append(s3(0, 10), s3(10, 0)...))
		}, errcode.InvalidParams, "does not lie inside segment"},
		{"overlaps itself", func(x *replayFix) oplog.Entry {
			return x.putEnd("new", 1, 10, s3(0, 10), s3(5, 10))
		}, errcode.InvalidParams, "overlap each other"},
		{"puts a live object twice in its own place", func(x *replayFix) oplog.Entry {
			own := x.at("done")
			return x.putEnd("done", 2, 100, []oplog.BufferDesc{own}, []oplog.BufferDesc{own})
		}, errcode.InvalidParams, "overlap each other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newReplayFix(t)
			e := tt.entry(x)
			digest, extents := x.dst.Digest(), allExtents(x.dst)
			_, err := x.dst.ReplayEntry(e)
			require.Equal(t, tt.code, errcode.Of(err), "%v", err)
			require.ErrorContains(t, err, tt.msg)
			require.Equal(t, digest, x.dst.Digest(), "the state is unchanged")
			require.Equal(t, extents, allExtents(x.dst), "the allocators are unchanged")
			require.NoError(t, x.dst.CheckInvariants())
			require.Len(t, x.dst.Ring().Entries(), 1, "the ring is not trimmed by a refused entry")

			// Replay goes on with a good entry.
			replay(t, x.dst, x.next(oplog.OpRemove, "done", "", 2))
		})
	}
}

func allExtents(f *FSM) map[string][]freeRange {
	out := map[string][]freeRange{}
	for _, s := range f.segOrder {
		out[s.id] = s.alloc.extents()
	}
	return out
}

func TestReplayEntries(t *testing.T) {
	x := newReplayFix(t)
	x.src.ok(&PutEnd{NowMs: x.src.now, Key: "busy", ClientID: "c1"})
	x.src.ok(&Remove{NowMs: x.src.now, Key: "done", Force: true})
	es := x.entries()
	require.Len(t, es, 2)
	bad := es[1]
	bad.SequenceID += 5 // a gap after the first
	n, _, err := x.dst.ReplayEntries([]oplog.Entry{es[0], bad, es[1]})
	require.Equal(t, 1, n)
	require.Equal(t, errcode.OplogEntryNotFound, errcode.Of(err))
	n, _, err = x.dst.ReplayEntries(es[1:])
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, x.src.f.ObjectSetDigest(), x.dst.ObjectSetDigest())
	require.Equal(t, x.src.f.appliedSeq, x.dst.appliedSeq)
}

// TestReplayLimits pins down what the OpLog cannot express: each source
// below changes buffers or segments without an entry, and replay stops at
// the first entry that depends on it, naming the cause.
// TestReplayReconciles: what the OpLog cannot express is resolved in the
// entries' favour, and the note says what was done.
func TestReplayReconciles(t *testing.T) {
	tests := []struct {
		name  string
		setup func(src *h) // before the snapshot
		after func(src *h) // after it
		note  ReplayNote
		check func(t *testing.T, dst *FSM)
	}{
		{"segment mounted after the snapshot", func(src *h) {
			src.mount("c1", "s1", 0x10000, 1000)
			src.put("k", "c1", 10) // on s1, in the snapshot
		}, func(src *h) {
			src.mount("c2", "s2", 0x10000, 1000)
			src.ok(&Remove{NowMs: src.now, Key: "k", Force: true})
			src.ok(&PutStart{NowMs: src.now, Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 1, PreferredSegment: "name-s2", ClientID: "c2"})
			src.ok(&PutEnd{NowMs: src.now, Key: "k", ClientID: "c2"})
		}, ReplayNote{Skipped: true}, func(t *testing.T, dst *FSM) {
			assert.False(t, dst.objects.Has(objItem{key: "k"}), "the object cannot be placed: it is a miss")
			tomb, ok := dst.tombstones.Get(tombstone{key: "k"})
			require.True(t, ok)
			assert.Equal(t, uint64(3), tomb.keySeq, "its sequence is kept")
		}},
		{"abandoned put replaced", func(src *h) {
			src.mount("c1", "s1", 0, 1000)
			require.NoError(t, src.putStart("stale", "c1", 100).Err) // [0,100)
			src.put("fill", "c1", 900)                               // [100,1000)
		}, func(src *h) {
			src.now += src.f.params.PutStartDiscardMs + 1
			require.NoError(t, src.putStart("stale", "c1", 40).Err) // replaces it, at [0,40)
			src.put("k", "c1", 60)                                  // [40,100): stale's old place
		}, ReplayNote{StaleDropped: 1}, func(t *testing.T, dst *FSM) {
			assert.False(t, dst.objects.Has(objItem{key: "stale"}), "the abandoned put goes whole")
			assert.True(t, dst.objects.Has(objItem{key: "k"}))
		}},
		{"space of a preempted write released after the snapshot", func(src *h) {
			src.mount("c1", "s1", 0, 1000)
			require.NoError(t, src.putStart("w", "c1", 100).Err) // [0,100), PROCESSING
			src.put("fill", "c1", 800)                           // [100,900)
			// The upsert takes the write over; its writer may still be
			// writing, so [0,100) stays held (discarded) past the snapshot.
			src.ok(&UpsertStart{PutStart: PutStart{NowMs: src.now, Key: "w", SliceLengths: []uint64{100}, ReplicaNum: 1, ClientID: "c1"}, Copy: true}) // [900,1000)
		}, func(src *h) {
			src.ok(&PutEnd{NowMs: src.now, Key: "w", ClientID: "c1"})
			src.now += src.f.params.PutStartReleaseMs
			src.keepAlive("c1") // releases [0,100) without an entry
			src.put("k", "c1", 100)
		}, ReplayNote{}, func(t *testing.T, dst *FSM) {
			assert.Empty(t, dst.discarded, "the held space went back, as at the source")
			assert.True(t, dst.objects.Has(objItem{key: "k"}))
		}},
		{"space of a preempted write freed with its segment", func(src *h) {
			src.mount("c1", "s1", 0, 1000)
			require.NoError(t, src.putStart("w", "c1", 100).Err)                                                                                       // [0,100), PROCESSING
			src.put("fill", "c1", 800)                                                                                                                 // [100,900)
			src.ok(&UpsertStart{PutStart: PutStart{NowMs: src.now, Key: "w", SliceLengths: []uint64{100}, ReplicaNum: 1, ClientID: "c1"}, Copy: true}) // holds [0,100)
		}, func(src *h) {
			// Unmounted, the held space goes with the segment, silently;
			// mounted again, it is free long before its release time.
			src.ok(&UnmountSegment{NowMs: src.now, ClientID: "c1", SegmentID: "s1"})
			src.mount("c1", "s1", 0, 1000)
			src.put("k", "c1", 100)
		}, ReplayNote{StaleDropped: 1}, func(t *testing.T, dst *FSM) {
			assert.Empty(t, dst.discarded)
			assert.True(t, dst.objects.Has(objItem{key: "k"}))
		}},
		{"replica lost with one of its segments", func(src *h) {
			src.mount("c1", "q", 0, 1000)
			src.mount("c2", "p", 0, 100)
			// Replica 0 prefers p: its 60-byte slice fits there, its
			// 80-byte slice goes to q. Replica 1 is all on q.
			src.ok(&PutStart{NowMs: src.now, Key: "two", SliceLengths: []uint64{60, 80}, ReplicaNum: 2, PreferredSegment: "name-p", ClientID: "c1"})
			src.ok(&PutEnd{NowMs: src.now, Key: "two", ClientID: "c1"})
		}, func(src *h) {
			o, _ := src.f.getObject("two")
			require.Equal(t, "p", o.replicas[0].buffers[0].seg.id)
			require.Equal(t, "q", o.replicas[0].buffers[1].seg.id)
			src.ok(&UnmountSegment{NowMs: src.now, ClientID: "c2", SegmentID: "p"})
			require.Len(t, src.f.Ring().Entries(), 1, "losing a replica exports nothing")
			src.put("k", "c1", 80) // best fit: the 80 bytes replica 0 left on q
		}, ReplayNote{StaleDropped: 1}, func(t *testing.T, dst *FSM) {
			o, ok := dst.getObject("two")
			require.True(t, ok, "the object keeps its other replica")
			assert.Len(t, o.replicas, 1)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newH(t)
			tt.setup(src)
			dst := roundTrip(t, src.f)
			from := src.f.appliedSeq
			tt.after(src)
			es := src.f.RingAfter(from, math.MaxInt).Entries()
			require.NotEmpty(t, es)
			n, note, err := dst.ReplayEntries(es)
			require.NoError(t, err)
			require.Equal(t, len(es), n)
			assert.Equal(t, tt.note, note)
			require.NoError(t, dst.CheckInvariants())
			assert.Equal(t, src.f.Stats().AppliedSeq, dst.Stats().AppliedSeq)
			tt.check(t, dst)
		})
	}
}
