package fsm

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMountSegment(t *testing.T) {
	seg := func(id, name string, base, size uint64) SegmentSpec {
		return SegmentSpec{ID: id, Name: name, Base: base, Size: size}
	}
	tests := []struct {
		name   string
		client string
		spec   SegmentSpec
		want   errcode.Code
	}{
		{"new segment", "c1", seg("s2", "n2", 1000, 100), errcode.OK},
		{"same segment again is idempotent", "c1", seg("s1", "name-s1", 0, 100), errcode.OK},
		{"same id other range", "c1", seg("s1", "name-s1", 0, 200), errcode.SegmentAlreadyExists},
		{"same id other client", "c2", seg("s1", "name-s1", 0, 100), errcode.SegmentAlreadyExists},
		{"name taken", "c2", seg("s9", "name-s1", 0, 100), errcode.SegmentAlreadyExists},
		{"overlaps own segment", "c1", seg("s3", "n3", 50, 100), errcode.InvalidParams},
		{"same range other client is fine", "c2", seg("s3", "n3", 0, 100), errcode.OK},
		{"zero size", "c1", seg("s4", "n4", 5000, 0), errcode.InvalidParams},
		{"overflowing range", "c1", seg("s4", "n4", ^uint64(0)-5, 100), errcode.InvalidParams},
		{"empty id", "c1", seg("", "n4", 5000, 10), errcode.InvalidParams},
		{"empty name", "c1", seg("s4", "", 5000, 10), errcode.InvalidParams},
		{"empty client", "", seg("s4", "n4", 5000, 10), errcode.InvalidParams},
		{"client id too long", strings.Repeat("c", MaxIDLen+1), seg("s4", "n4", 5000, 10), errcode.InvalidParams},
		{"invalid utf-8 id", "c1", seg("s\xff", "n4", 5000, 10), errcode.InvalidParams},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newH(t)
			x.mount("c1", "s1", 0, 100)
			x.code(tt.want, &MountSegment{NowMs: x.now, ClientID: tt.client, Segment: tt.spec})
		})
	}
}

func TestRemountSegments(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 100)
	specs := []SegmentSpec{{ID: "s1", Name: "name-s1", Base: 0, Size: 100}, {ID: "s2", Name: "n2", Base: 100, Size: 50}}
	x.ok(&RemountSegments{NowMs: x.now, ClientID: "c1", Segments: specs})
	assert.Equal(t, uint64(150), x.f.Stats().CapacityBytes)

	// All or nothing: one bad segment refuses the whole request.
	bad := []SegmentSpec{{ID: "s3", Name: "n3", Base: 200, Size: 10}, {ID: "s4", Name: "n4", Base: 205, Size: 10}}
	x.code(errcode.InvalidParams, &RemountSegments{NowMs: x.now, ClientID: "c1", Segments: bad})
	x.code(errcode.InvalidParams, &RemountSegments{NowMs: x.now, ClientID: "", Segments: specs})
	x.code(errcode.SegmentAlreadyExists, &RemountSegments{NowMs: x.now, ClientID: "c2", Segments: specs[:1]})
	assert.Equal(t, 2, x.f.Stats().Segments)
}

func TestUnmountSegment(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 100)
	x.mount("c1", "s2", 1000, 100)
	x.mount("c2", "s3", 0, 100)
	for key, replicas := range map[string]uint32{"only-on-s1": 1, "two": 2} {
		x.ok(&PutStart{NowMs: x.now, Key: key, SliceLengths: []uint64{10}, ReplicaNum: replicas, PreferredSegment: "name-s1", ClientID: "c1"})
		x.ok(&PutEnd{NowMs: x.now, Key: key, ClientID: "c1"})
	}

	x.code(errcode.SegmentNotFound, &UnmountSegment{NowMs: x.now, ClientID: "c1", SegmentID: "nope"})
	x.code(errcode.IllegalClient, &UnmountSegment{NowMs: x.now, ClientID: "c2", SegmentID: "s1"})

	seq := x.f.appliedSeq
	r := x.ok(&UnmountSegment{NowMs: x.now, ClientID: "c1", SegmentID: "s1"})
	assert.Equal(t, uint64(1), r.Removed)
	assert.False(t, x.exists("only-on-s1"))
	o, ok := x.f.getObject("two")
	require.True(t, ok, "an object keeps its other replica")
	assert.Len(t, o.replicas, 1)
	assert.NotEqual(t, "s1", o.replicas[0].buffers[0].seg.id)
	last := entries(x.f)[len(entries(x.f))-1]
	assert.Equal(t, oplog.OpRemove, last.OpType)
	assert.Equal(t, oplog.SourceUnmountSegment, last.Source)
	assert.Equal(t, "only-on-s1", last.Key)
	assert.Equal(t, seq+1, x.f.appliedSeq)
	assert.Equal(t, uint64(200), x.f.capacity)
	assert.Equal(t, uint64(10), x.f.used)
	x.code(errcode.SegmentNotFound, &UnmountSegment{NowMs: x.now, ClientID: "c1", SegmentID: "s1"})
}

// objIndexSeg returns the index in segOrder of the first buffer's segment.
func (f *FSM) objIndexSeg(key string) int {
	o, _ := f.getObject(key)
	for i, s := range f.segOrder {
		if s == o.replicas[0].buffers[0].seg {
			return i
		}
	}
	return -1
}

func TestPutStartValidation(t *testing.T) {
	tests := []struct {
		name string
		cmd  PutStart
		want errcode.Code
	}{
		{"ok", PutStart{Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1"}, errcode.OK},
		{"empty key", PutStart{Key: "", SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1"}, errcode.InvalidKey},
		{"key over 4 KiB", PutStart{Key: strings.Repeat("k", MaxKeyLen+1), SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1"}, errcode.InvalidKey},
		{"key of 4 KiB", PutStart{Key: strings.Repeat("k", MaxKeyLen), SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1"}, errcode.OK},
		{"key not utf-8", PutStart{Key: "\xff", SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1"}, errcode.InvalidKey},
		{"zero size", PutStart{Key: "k", SliceLengths: []uint64{0}, ReplicaNum: 1, ClientID: "c1"}, errcode.InvalidParams},
		{"no slices", PutStart{Key: "k", ReplicaNum: 1, ClientID: "c1"}, errcode.InvalidParams},
		{"too many slices", PutStart{Key: "k", SliceLengths: make([]uint64, MaxSlices+1), ReplicaNum: 1, ClientID: "c1"}, errcode.InvalidParams},
		{"size overflow", PutStart{Key: "k", SliceLengths: []uint64{^uint64(0), 2}, ReplicaNum: 1, ClientID: "c1"}, errcode.InvalidParams},
		{"replica_num 0", PutStart{Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 0, ClientID: "c1"}, errcode.InvalidParams},
		{"replica_num 9", PutStart{Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 9, ClientID: "c1"}, errcode.InvalidParams},
		{"no client", PutStart{Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 1}, errcode.InvalidParams},
		{"preferred name too long", PutStart{Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1", PreferredSegment: strings.Repeat("p", 2000)}, errcode.InvalidParams},
		{"bigger than any segment", PutStart{Key: "k", SliceLengths: []uint64{1 << 20}, ReplicaNum: 1, ClientID: "c1"}, errcode.NoAvailableHandle},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newH(t)
			x.mount("c1", "s1", 0, 1000)
			x.mount("c1", "s2", 1000, 1000)
			tt.cmd.NowMs = x.now
			x.code(tt.want, &tt.cmd)
			assert.Equal(t, tt.want == errcode.NoAvailableHandle, x.f.needSpace, "need-space flag")
		})
	}
}

func TestPutStartWithoutSegments(t *testing.T) {
	x := newH(t)
	x.code(errcode.NoAvailableHandle, &PutStart{NowMs: x.now, Key: "k", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c"})
}

func TestPutLifecycle(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0x1000, 1000)
	x.mount("c1", "s2", 0x9000, 1000)
	x.mount("c2", "s3", 0x1000, 1000)

	r := x.ok(&PutStart{NowMs: x.now, Key: "a/b", SliceLengths: []uint64{100, 50}, ReplicaNum: 3, ClientID: "c1"})
	require.Len(t, r.Replicas, 3)
	segs := map[string]bool{}
	for _, rep := range r.Replicas {
		assert.Equal(t, "PROCESSING", rep.Status)
		require.Len(t, rep.Buffers, 2)
		assert.Equal(t, uint64(100), rep.Buffers[0].Size)
		assert.Equal(t, uint64(50), rep.Buffers[1].Size)
		segs[rep.Buffers[0].SegmentID] = true
	}
	assert.Len(t, segs, 3, "replicas sit on distinct segments")

	x.code(errcode.ObjectAlreadyExists, &PutStart{NowMs: x.now, Key: "a/b", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c2"})
	assert.Equal(t, errcode.ReplicaIsNotReady, errcode.Of(x.f.GetReplicaList("a/b", x.now).Err))
	assert.False(t, x.f.ExistKey("a/b", x.now).Found, "a PROCESSING object does not exist for readers")
	x.code(errcode.ReplicaIsNotReady, &Remove{NowMs: x.now, Key: "a/b", Force: true})

	x.code(errcode.IllegalClient, &PutEnd{NowMs: x.now, Key: "a/b", ClientID: "c2"})
	x.code(errcode.ObjectNotFound, &PutEnd{NowMs: x.now, Key: "nope", ClientID: "c1"})
	x.code(errcode.InvalidKey, &PutEnd{NowMs: x.now, Key: "", ClientID: "c1"})
	x.ok(&PutEnd{NowMs: x.now, Key: "a/b", ClientID: "c1"})
	require.Len(t, entries(x.f), 1)
	e := entries(x.f)[0]
	assert.Equal(t, oplog.OpPutEnd, e.OpType)
	assert.Equal(t, uint64(1), e.SequenceID)
	assert.Equal(t, uint64(1), e.KeySequenceID)
	assert.NoError(t, e.Verify())
	p, err := oplog.DecodePutEndPayload(e.Payload)
	require.NoError(t, err)
	assert.Equal(t, uint64(150), p.Size)
	assert.Len(t, p.Replicas, 3)
	assert.Equal(t, "COMPLETE", p.Replicas[0].Status)

	// A retried PutEnd is a no-op, not a second entry.
	x.ok(&PutEnd{NowMs: x.now, Key: "a/b", ClientID: "c1"})
	assert.Len(t, entries(x.f), 1)

	x.code(errcode.InvalidWrite, &PutRevoke{NowMs: x.now, Key: "a/b", ClientID: "c1"})
	read := x.f.GetReplicaList("a/b", x.now)
	require.NoError(t, read.Err)
	assert.True(t, read.Found)
	assert.Len(t, read.Replicas, 3)
	assert.Equal(t, x.now+x.f.params.LeaseTTLMs, read.Grant.UntilMs)
	assert.Equal(t, lease.Renewal{Key: "a/b", AtMs: x.now}, read.Grant.Renewal)
}

// A batch reads each key as GetReplicaList reads it alone, whatever the
// mix of keys, with the key index or without, past the batch size that
// fits on the stack.
func TestGetReplicaListsReadsEachKeyAsAlone(t *testing.T) {
	for _, indexed := range []bool{false, true} {
		x := newH(t)
		x.mount("c1", "s1", 0, 1<<20)
		x.mount("c1", "s2", 1<<20, 1<<20)
		x.put("one", "c1", 10)
		x.put("sliced", "c1", 10, 20)
		require.NoError(t, x.apply(&PutStart{NowMs: x.now, Key: "softpinned", SliceLengths: []uint64{10}, ReplicaNum: 1, SoftPin: true, ClientID: "c1"}).Err)
		x.ok(&PutEnd{NowMs: x.now, Key: "softpinned", ClientID: "c1"})
		require.NoError(t, x.apply(&PutStart{NowMs: x.now, Key: "twice", SliceLengths: []uint64{10}, ReplicaNum: 2, ClientID: "c1"}).Err)
		x.ok(&PutEnd{NowMs: x.now, Key: "twice", ClientID: "c1"})
		require.NoError(t, x.putStart("writing", "c1", 10).Err)
		x.f.IndexKeys(indexed)
		keys := []string{"one", "nope", "sliced", "", "writing", "twice", "one", "bad\xff", "softpinned"}
		for i := range 200 {
			k := fmt.Sprintf("k%d", i)
			x.put(k, "c1", 10)
			keys = append(keys, k)
		}
		for _, n := range []int{1, 2, 8, 128, len(keys)} {
			out := make([]KeyRead, n)
			x.f.GetReplicaLists(keys[:n], x.now+3, out)
			for i, k := range keys[:n] {
				assert.Equal(t, x.f.GetReplicaList(k, x.now+3), out[i], "indexed %v, batch of %d, key %q", indexed, n, k)
			}
		}
	}
}

func TestPutRevoke(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	require.NoError(t, x.putStart("k", "c1", 100).Err)
	x.code(errcode.IllegalClient, &PutRevoke{NowMs: x.now, Key: "k", ClientID: "c2"})
	x.code(errcode.ObjectNotFound, &PutRevoke{NowMs: x.now, Key: "nope", ClientID: "c1"})
	r := x.ok(&PutRevoke{NowMs: x.now, Key: "k", ClientID: "c1"})
	assert.Equal(t, uint64(1), r.Removed)
	assert.False(t, x.exists("k"))
	assert.Equal(t, uint64(0), x.f.used)
	require.Len(t, entries(x.f), 1)
	assert.Equal(t, oplog.OpPutRevoke, entries(x.f)[0].OpType)
	// The key's sequence continues after re-creation.
	x.put("k", "c1", 10)
	assert.Equal(t, uint64(2), entries(x.f)[1].KeySequenceID)
}

func TestStalePutStart(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	require.NoError(t, x.putStart("k", "c1", 100).Err)
	x.now += x.f.params.PutStartDiscardMs - 1
	x.code(errcode.ObjectAlreadyExists, &PutStart{NowMs: x.now, Key: "k", SliceLengths: []uint64{5}, ReplicaNum: 1, ClientID: "c2"})
	x.now++
	x.ok(&PutStart{NowMs: x.now, Key: "k", SliceLengths: []uint64{5}, ReplicaNum: 1, ClientID: "c2"})
	o, _ := x.f.getObject("k")
	assert.Equal(t, "c2", o.clientID, "an abandoned put is preempted")
	assert.Equal(t, uint64(5), x.f.used)
	assert.Empty(t, entries(x.f), "preemption exports nothing: the put was never visible")

	x.now += x.f.params.PutStartReleaseMs - 1
	x.keepAlive("c1")
	assert.True(t, x.exists("k"))
	x.now++
	r := x.keepAlive("c1")
	assert.False(t, x.exists("k"), "released after put_start_release_timeout")
	assert.Equal(t, uint64(1), r.Removed)
	assert.Equal(t, oplog.SourceDiscard, entries(x.f)[0].Source)
}

func TestRemove(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	x.put("k", "c1", 10)
	x.code(errcode.ObjectNotFound, &Remove{NowMs: x.now, Key: "nope"})
	x.code(errcode.InvalidKey, &Remove{NowMs: x.now, Key: ""})

	// A read lease blocks an unforced remove until it ends.
	x.tick(lease.Renewal{Key: "k", AtMs: x.now})
	x.code(errcode.ObjectHasLease, &Remove{NowMs: x.now, Key: "k"})
	x.now += x.f.params.LeaseTTLMs - 1
	x.code(errcode.ObjectHasLease, &Remove{NowMs: x.now, Key: "k"})
	x.now++
	x.ok(&Remove{NowMs: x.now, Key: "k"})
	assert.False(t, x.exists("k"))

	x.put("k2", "c1", 10)
	x.tick(lease.Renewal{Key: "k2", AtMs: x.now})
	x.ok(&Remove{NowMs: x.now, Key: "k2", Force: true})
	last := entries(x.f)[len(entries(x.f))-1]
	assert.Equal(t, oplog.SourceRemove, last.Source)
	assert.Equal(t, "k2", last.Key)
}

func TestRemoveByRegexAndAll(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 10000)
	for _, k := range []string{"a/1", "a/2", "a/3", "b/1"} {
		x.put(k, "c1", 10)
	}
	require.NoError(t, x.putStart("a/processing", "c1", 10).Err)
	x.tick(lease.Renewal{Key: "a/2", AtMs: x.now})

	x.code(errcode.InvalidParams, &RemoveByRegex{NowMs: x.now, Regex: "a/("})
	x.code(errcode.InvalidParams, &RemoveByRegex{NowMs: x.now, Regex: strings.Repeat("a", MaxRegexLen+1)})
	r := x.ok(&RemoveByRegex{NowMs: x.now, Regex: "^a/"})
	assert.Equal(t, uint64(2), r.Removed, "a/1 and a/3; a/2 is leased, a/processing in flight")
	assert.True(t, x.exists("a/2"))
	assert.True(t, x.exists("a/processing"))
	assert.Equal(t, oplog.SourceRemoveByRegex, entries(x.f)[len(entries(x.f))-1].Source)

	r = x.ok(&RemoveAll{NowMs: x.now})
	assert.Equal(t, uint64(1), r.Removed, "b/1")
	r = x.ok(&RemoveAll{NowMs: x.now, Force: true})
	assert.Equal(t, uint64(1), r.Removed, "a/2 despite its lease")
	assert.Equal(t, oplog.SourceRemoveAll, entries(x.f)[len(entries(x.f))-1].Source)
	assert.Equal(t, 1, x.f.objects.Len(), "only the PROCESSING put is left")
}

func TestReads(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 10000)
	x.put("a/1", "c1", 10)
	x.put("a/2", "c1", 10)
	x.put("b/1", "c1", 10)

	assert.Equal(t, errcode.ObjectNotFound, errcode.Of(x.f.GetReplicaList("nope", x.now).Err))
	assert.False(t, x.f.GetReplicaList("nope", x.now).Found)
	assert.Equal(t, errcode.InvalidKey, errcode.Of(x.f.GetReplicaList("", x.now).Err))
	r := x.f.ExistKey("a/1", x.now+7)
	require.NoError(t, r.Err)
	assert.True(t, r.Found)
	assert.Equal(t, x.now+7+x.f.params.LeaseTTLMs, r.Grant.UntilMs)
	r = x.f.ExistKey("nope", x.now)
	assert.NoError(t, r.Err)
	assert.False(t, r.Found)
	assert.Equal(t, errcode.InvalidKey, errcode.Of(x.f.ExistKey("", x.now).Err))

	got, err := x.f.GetReplicaListByRegex("^a/", x.now)
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "a/1", got[0].Key)
	assert.Equal(t, "a/2", got[1].Key)
	_, err = x.f.GetReplicaListByRegex("(", x.now)
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err))

	// Reads do not change the state: the renewal travels in a Tick.
	before := x.f.Digest()
	x.f.GetReplicaList("a/1", x.now)
	assert.Equal(t, before, x.f.Digest())
	assert.True(t, x.f.HasSession("c1"))
	assert.False(t, x.f.HasSession("c9"))
}

func TestSoftPin(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	x.ok(&PutStart{NowMs: x.now, Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 1, SoftPin: true, ClientID: "c1"})
	x.ok(&PutEnd{NowMs: x.now, Key: "k", ClientID: "c1"})
	o, _ := x.f.getObject("k")
	assert.Equal(t, x.now+x.f.params.SoftPinTTLMs, o.softPinMs)
	x.now += 1000
	x.tick(lease.Renewal{Key: "k", AtMs: x.now})
	o, _ = x.f.getObject("k")
	assert.Equal(t, x.now+x.f.params.SoftPinTTLMs, o.softPinMs, "a read extends the soft pin")
	assert.Equal(t, x.now+x.f.params.LeaseTTLMs, o.leaseMs)
	// Renewals never shorten a lease.
	x.tick(lease.Renewal{Key: "k", AtMs: x.now - 500}, lease.Renewal{Key: "gone", AtMs: x.now})
	o2, _ := x.f.getObject("k")
	assert.Same(t, o, o2, "an unchanged object is not copied")
}

func TestClientExpiryOrderAndPings(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	x.mount("c2", "s2", 0, 1000)
	x.ok(&PutStart{NowMs: x.now, Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 1, PreferredSegment: "name-s1", ClientID: "c2"})
	x.ok(&PutEnd{NowMs: x.now, Key: "k", ClientID: "c2"})
	require.Equal(t, "s1", x.f.segOrder[x.f.objIndexSeg("k")].id, "preferred segment honoured")

	ttl := x.f.params.ClientTTLMs
	x.now += ttl / 2
	x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c2", AtMs: x.now}, {ClientID: "unknown", AtMs: x.now}}})
	x.now += ttl / 2
	r := x.tick()
	assert.False(t, x.f.HasSession("c1"), "c1 missed its pings")
	assert.True(t, x.f.HasSession("c2"))
	assert.False(t, x.exists("k"), "its only replica was on c1's segment")
	assert.Equal(t, uint64(1), r.Removed)
	assert.Equal(t, oplog.SourceClientExpired, entries(x.f)[len(entries(x.f))-1].Source)
	assert.Equal(t, uint64(1000), x.f.capacity)
	x.now += ttl
	x.tick()
	assert.Equal(t, 0, x.f.Stats().Sessions)
	assert.Equal(t, uint64(0), x.f.capacity)
}

// TestExpiryBounded: a tick with ExpireMax expires sessions in deadline
// order until their segments have held that many objects, leaves the rest
// past their deadline for the next tick, and counts all of its REMOVEs as
// one bulk removal; without it every expired session goes at once, a bulk
// removal each.
func TestExpiryBounded(t *testing.T) {
	tests := []struct {
		name      string
		max       uint64
		removed   []uint64 // by each tick
		ringAdded int      // REMOVEs in the ring after the first tick (Direct 4)
	}{
		{"unbounded", 0, []uint64{9}, 9},
		{"a session a tick", 3, []uint64{3, 3, 3}, 3},
		{"two sessions a tick", 4, []uint64{6, 3}, 4},
		{"all in one bulk", 100, []uint64{9}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newH(t)
			x.ok(&ReleaseRemovals{NowMs: x.now, Direct: 4})
			for i, c := range []string{"c1", "c2", "c3"} {
				x.mount(c, "s"+c, uint64(i)<<20, 1000)
				for k := range 3 {
					x.ok(&PutStart{NowMs: x.now, Key: fmt.Sprintf("%s/%d", c, k), SliceLengths: []uint64{10}, ReplicaNum: 1, PreferredSegment: "name-s" + c, ClientID: c})
					x.ok(&PutEnd{NowMs: x.now, Key: fmt.Sprintf("%s/%d", c, k), ClientID: c})
				}
				x.now++ // c1's deadline is the earliest
			}
			before := len(entries(x.f))
			x.now += x.f.params.ClientTTLMs
			for i, want := range tt.removed {
				r := x.ok(&Tick{NowMs: x.now, ExpireMax: tt.max})
				assert.Equal(t, want, r.Removed, "tick %d", i)
				if i == 0 {
					assert.Len(t, entries(x.f), before+tt.ringAdded, "REMOVEs in the ring after the first tick")
					if tt.max == 3 {
						assert.False(t, x.f.HasSession("c1"))
						assert.True(t, x.f.HasSession("c2"), "past its deadline, left for the next tick")
					}
				}
			}
			assert.Zero(t, x.f.Stats().Sessions)
			assert.Zero(t, x.f.Stats().Objects)
		})
	}
}

// TestLapsedSessionTakesNoObjects: once expiry is bounded, the segment of
// a session past its deadline, waiting for a tick to expire it, gets no new
// buffers (a ping revives it); an older leader's unbounded ticks leave the
// rule off, as it was, and a snapshot keeps it on.
func TestLapsedSessionTakesNoObjects(t *testing.T) {
	x := newH(t)
	x.mount("c2", "s2", 1<<20, 1000) // expired first: its deadline is the earliest
	x.put("c2/k", "c2", 10)
	x.now++
	x.mount("c1", "s1", 0, 1000)
	x.now++
	x.mount("c3", "s3", 2<<20, 1000)
	place := func(key, client string) string {
		t.Helper()
		x.ok(&PutStart{NowMs: x.now, Key: key, SliceLengths: []uint64{10}, ReplicaNum: 1, PreferredSegment: "name-s1", ClientID: client})
		o, _ := x.f.getObject(key)
		return o.replicas[0].buffers[0].seg.id
	}
	x.now += x.f.params.ClientTTLMs
	assert.Equal(t, "s1", place("before", "c3"), "no bounded tick yet: the rule is off")

	r := x.ok(&Tick{NowMs: x.now, ExpireMax: 1, Pings: []lease.Ping{{ClientID: "c3", AtMs: x.now}}})
	assert.Equal(t, uint64(1), r.Removed, "c2's object; c1 waits for the next tick")
	require.True(t, x.f.HasSession("c1"))
	assert.Equal(t, "s3", place("after", "c3"), "c1 is past its deadline: its segment takes nothing")

	g := roundTrip(t, x.f)
	assert.True(t, g.expiryBounded, "the snapshot keeps the rule")
	assert.Equal(t, x.f.Digest(), g.Digest())

	x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c1", AtMs: x.now}, {ClientID: "c3", AtMs: x.now}}})
	assert.Equal(t, "s1", place("revived", "c3"), "a ping in time keeps the session and opens its segment again")
}

func TestPromote(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	x.put("k", "c1", 10)
	require.NoError(t, x.putStart("p", "c1", 10).Err)
	p := DefaultParams()
	p.LeaseTTLMs = 7000
	x.code(errcode.InvalidParams, &Promote{NowMs: x.now, LeaderID: "n2", Term: 2, Params: Params{}})
	x.now += 3000
	x.ok(&Promote{NowMs: x.now, LeaderID: "n2", Term: 2, Params: p})
	assert.Equal(t, int64(7000), x.f.Params().LeaseTTLMs)
	assert.Equal(t, "n2", x.f.Stats().LeaderID)
	x.code(errcode.ObjectHasLease, &Remove{NowMs: x.now + 6999, Key: "k"})
	assert.True(t, x.exists("p"), "PROCESSING puts survive promotion")
	d, _ := x.f.deadlines.Deadline("c1")
	assert.Equal(t, x.now+x.f.params.ClientTTLMs, d)
	x.ok(&Remove{NowMs: x.now + 7000, Key: "k"})

	// Without etcd the ring is not kept.
	p.ExportRingCap = 0
	x.ok(&Promote{NowMs: x.now, LeaderID: "n3", Term: 3, Params: p})
	assert.Empty(t, entries(x.f))
	seq := x.f.appliedSeq
	x.put("k2", "c1", 10)
	assert.Empty(t, entries(x.f))
	assert.Equal(t, seq+1, x.f.appliedSeq, "sequence ids advance regardless")
}

// TestPromoteSessionGrace: a Promote gives every session the client TTL
// plus its grace from the promotion, and refuses a grace out of bounds.
func TestPromoteSessionGrace(t *testing.T) {
	for _, c := range []struct {
		name     string
		grace    int64
		pingedMs int64 // the session's last ping, from the promotion
		want     int64 // its deadline, from the promotion
		code     errcode.Code
	}{
		{"none: one TTL", 0, -5000, 10_000, errcode.OK},
		{"one more TTL", 10_000, -5000, 20_000, errcode.OK},
		{"negative", -1, 0, 0, errcode.InvalidParams},
		{"over a day", MaxSessionGraceMs + 1, 0, 0, errcode.InvalidParams},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := newH(t)
			x.mount("c1", "s1", 0, 1000)
			promoted := x.now + 5000
			x.ok(&Tick{NowMs: promoted + c.pingedMs, Pings: []lease.Ping{{ClientID: "c1", AtMs: promoted + c.pingedMs}}})
			r := x.apply(&Promote{NowMs: promoted, LeaderID: "n2", Term: 2, Params: DefaultParams(), SessionGraceMs: c.grace})
			require.Equal(t, c.code, r.Code(), "%v", r.Err)
			if c.code != errcode.OK {
				return
			}
			d, _ := x.f.deadlines.Deadline("c1")
			assert.Equal(t, promoted+c.want, d)
			x.ok(&Tick{NowMs: promoted + c.want - 1})
			assert.Equal(t, 1, x.f.Stats().Sessions, "alive until its deadline")
			x.ok(&Tick{NowMs: promoted + c.want})
			assert.Zero(t, x.f.Stats().Sessions, "expired at it")
		})
	}
}

func TestExportRing(t *testing.T) {
	x := newH(t)
	p := DefaultParams()
	p.ExportRingCap = 3
	x.ok(&Promote{NowMs: x.now, LeaderID: "n1", Term: 1, Params: p})
	x.mount("c1", "s1", 0, 1000)
	for _, k := range []string{"a", "b", "c"} {
		x.put(k, "c1", 10)
	}
	r := x.apply(&PutStart{NowMs: x.now, Key: "d", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c1"})
	require.Equal(t, errcode.EtcdOperationError, r.Code())
	// Not only an outage fills the ring: writes faster than etcd takes them do too.
	assert.Contains(t, r.Err.Error(), "etcd is unreachable or takes them slower than they come")
	x.code(errcode.EtcdOperationError, &Remove{NowMs: x.now, Key: "a", Force: true})
	x.code(errcode.EtcdOperationError, &UnmountSegment{NowMs: x.now, ClientID: "c1", SegmentID: "s1"})
	x.code(errcode.EtcdOperationError, &RemoveAll{NowMs: x.now})
	// Reads, ticks and eviction go on.
	require.NoError(t, x.f.GetReplicaList("a", x.now).Err)
	x.now += x.f.params.LeaseTTLMs // past Promote's lease on everything
	x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c1", AtMs: x.now}}, Evict: true})
	assert.Greater(t, len(entries(x.f)), 3, "eviction entries go past the bound")

	x.code(errcode.InvalidParams, &Exported{Seq: x.f.appliedSeq + 1})
	x.ok(&Exported{Seq: 2})
	assert.Equal(t, uint64(3), entries(x.f)[0].SequenceID)
	x.ok(&Exported{Seq: 1}) // stale acknowledgement
	assert.Equal(t, uint64(3), entries(x.f)[0].SequenceID)
	x.ok(&Exported{Seq: x.f.appliedSeq})
	assert.Empty(t, entries(x.f))
	x.ok(&PutStart{NowMs: x.now, Key: "d", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c1"})
}

func TestKeySequenceTombstones(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	x.put("k", "c1", 10)
	x.ok(&Remove{NowMs: x.now, Key: "k", Force: true})
	x.put("k", "c1", 10)
	last := entries(x.f)[len(entries(x.f))-1]
	assert.Equal(t, uint64(3), last.KeySequenceID, "PUT_END 1, REMOVE 2, PUT_END 3")
	x.ok(&Remove{NowMs: x.now, Key: "k", Force: true})
	assert.Equal(t, 1, x.f.tombstones.Len())
	x.now += x.f.params.KeySeqRetainMs - 1
	x.keepAlive("c1")
	assert.Equal(t, 1, x.f.tombstones.Len())
	x.now++
	x.keepAlive("c1")
	assert.Equal(t, 0, x.f.tombstones.Len(), "forgotten after an hour of command time")
	x.put("k", "c1", 10)
	assert.Equal(t, uint64(1), entries(x.f)[len(entries(x.f))-1].KeySequenceID)
}

func TestTimeNeverGoesBack(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	x.ok(&Tick{NowMs: 5_000_000})
	x.ok(&Tick{NowMs: 10})
	assert.Equal(t, int64(5_000_000), x.f.Stats().NowMs)
}

func TestApplyBadEntries(t *testing.T) {
	f := New()
	before := f.Digest()
	tests := []struct {
		name  string
		entry []byte
		want  errcode.Code
	}{
		{"empty", nil, errcode.InvalidParams},
		{"unknown type", []byte{77, 1, 2}, errcode.InvalidVersion},
		{"truncated", Encode(&PutStart{Key: "key", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c"})[:5], errcode.InvalidParams},
		{"trailing bytes", append(Encode(&RemoveAll{}), 0), errcode.InvalidParams},
		{"bad bool", []byte{byte(CmdRemoveAll), 0, 7}, errcode.InvalidParams},
		{"huge list", []byte{byte(CmdRemountSegments), 0, 1, 'c', 0xff, 0xff, 0xff, 0xff, 0x0f}, errcode.InvalidParams},
		{"replica_num overflow", []byte{byte(CmdPutStart), 0, 1, 'k', 1, 1, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 1, 'c'}, errcode.InvalidParams},
		{"ignorable unknown type", []byte{0x80 | 99, 1, 2, 3}, errcode.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := f.Apply(tt.entry)
			assert.Equal(t, tt.want, r.Code(), "%v", r.Err)
			assert.Equal(t, before, f.Digest(), "a rejected entry changes nothing")
		})
	}
}

func TestCommandRoundTrip(t *testing.T) {
	cmds := []Command{
		&MountSegment{NowMs: 1, ClientID: "c", Segment: SegmentSpec{ID: "s", Name: "n", Base: 5, Size: 6}},
		&UnmountSegment{NowMs: 2, ClientID: "c", SegmentID: "s"},
		&RemountSegments{NowMs: 3, ClientID: "c", Segments: []SegmentSpec{{ID: "s", Name: "n", Base: 1, Size: 2}}},
		&MountSegment{NowMs: 1, ClientID: "c", Segment: SegmentSpec{ID: "s", Name: "n", Base: 5, Size: 6, Endpoint: "10.0.0.1:15000", Protocol: "tcp"}},
		&RemountSegments{NowMs: 3, ClientID: "c", Segments: []SegmentSpec{{ID: "s", Name: "n", Base: 1, Size: 2}, {ID: "t", Name: "m", Base: 3, Size: 2, Endpoint: "e", Protocol: "rdma"}}},
		&PutStart{NowMs: 4, Key: "k", SliceLengths: []uint64{1, 2}, ReplicaNum: 2, SoftPin: true, PreferredSegment: "n", ClientID: "c"},
		&PutEnd{NowMs: 5, Key: "k", ClientID: "c"},
		&PutRevoke{NowMs: 6, Key: "k", ClientID: "c"},
		&Remove{NowMs: 7, Key: "k", Force: true},
		&RemoveByRegex{NowMs: 8, Regex: "^k", Force: true},
		&RemoveAll{NowMs: 9, Force: true},
		&Tick{NowMs: -10, Renewals: []lease.Renewal{{Key: "k", AtMs: 3}}, Pings: []lease.Ping{{ClientID: "c", AtMs: 4}}, Evict: true},
		&Tick{NowMs: 10, ExpireMax: 16384},
		&Promote{NowMs: 11, LeaderID: "n1", LeaderAddr: "127.0.0.1:7100", Term: 3, Params: DefaultParams()},
		&Promote{NowMs: 11, LeaderID: "n1", LeaderAddr: "127.0.0.1:7100", Term: 3, Params: DefaultParams(), MooncakeAddr: "127.0.0.1:50051"},
		&Promote{NowMs: 11, LeaderID: "n1", Term: 3, Params: DefaultParams(), SessionGraceMs: 10_000},
		&Promote{NowMs: 11, LeaderID: "n1", Term: 3, Params: DefaultParams(), MooncakeAddr: "127.0.0.1:50051", SessionGraceMs: 1},
		&Exported{Seq: 12},
	}
	for _, c := range cmds {
		t.Run(c.Type().String(), func(t *testing.T) {
			got, err := Decode(Encode(c))
			require.NoError(t, err)
			assert.Equal(t, c, got)
		})
	}
	assert.Equal(t, "type(99)", CmdType(99).String())
}

// TestPromoteSessionGraceDecode: a Promote's grace, when written, is 1 ms
// to a day; one written otherwise is a corrupt entry.
func TestPromoteSessionGraceDecode(t *testing.T) {
	for _, mooncake := range []string{"", "127.0.0.1:50051"} {
		base := Encode(&Promote{NowMs: 11, LeaderID: "n1", Term: 3, Params: DefaultParams(), MooncakeAddr: mooncake})
		for _, grace := range []int64{0, -1, MaxSessionGraceMs + 1} {
			e := enc{b: append([]byte(nil), base...)}
			e.i64(grace)
			_, err := Decode(e.b)
			assert.ErrorContains(t, err, "session grace written as", "grace %d, Mooncake address %q", grace, mooncake)
		}
	}
}

func TestRingAfterAndLease(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	for _, k := range []string{"a", "b", "c", "d"} {
		x.put(k, "c1", 10)
	}
	x.ok(&Exported{Seq: 1})
	seqs := func(es []oplog.Entry) []uint64 {
		var out []uint64
		for _, e := range es {
			out = append(out, e.SequenceID)
		}
		return out
	}
	assert.Equal(t, []uint64{2, 3, 4}, seqs(x.f.RingAfter(0, 10).Entries()), "trimmed entries are gone")
	assert.Equal(t, []uint64{3, 4}, seqs(x.f.RingAfter(2, 10).Entries()))
	assert.Equal(t, []uint64{3}, seqs(x.f.RingAfter(2, 1).Entries()))
	assert.Empty(t, x.f.RingAfter(4, 10).Entries())
	oldest, ok := x.f.RingAfter(2, 10).OldestMs()
	assert.True(t, ok)
	assert.Equal(t, x.f.RingAfter(2, 10).Entries()[0].TimestampMs, oldest, "the command time of the first entry")
	_, ok = x.f.RingAfter(4, 10).OldestMs()
	assert.False(t, ok, "nothing after the last")
	l, sp, ok := x.f.Lease("a")
	assert.True(t, ok)
	assert.Equal(t, x.now, l)
	assert.Zero(t, sp)
	_, _, ok = x.f.Lease("nope")
	assert.False(t, ok)
}

func TestBatch(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	b := &Batch{Cmds: []Command{
		&PutStart{NowMs: x.now, Key: "a", SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1"},
		&PutStart{NowMs: x.now, Key: "a", SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c1"},
		&PutEnd{NowMs: x.now, Key: "a", ClientID: "c1"},
		&PutRevoke{NowMs: x.now, Key: "nope", ClientID: "c1"},
	}}
	got, err := Decode(Encode(b))
	require.NoError(t, err)
	require.Equal(t, b, got)
	r := x.ok(b)
	require.Len(t, r.Batch, 4)
	assert.NoError(t, r.Batch[0].Err)
	assert.Len(t, r.Batch[0].Replicas, 1)
	assert.Equal(t, errcode.ObjectAlreadyExists, r.Batch[1].Code(), "items apply in order")
	assert.NoError(t, r.Batch[2].Err)
	assert.Equal(t, errcode.ObjectNotFound, r.Batch[3].Code())
	assert.Len(t, entries(x.f), 1)

	// Only puts may be batched: the decoder refuses anything else, and so
	// does Apply if handed one directly.
	bad := Encode(&Batch{Cmds: []Command{&RemoveAll{Force: true}}})
	assert.Equal(t, errcode.InvalidParams, x.apply(&rawEntry{bad}).Code())
	r = x.f.ApplyCommand(&Batch{Cmds: []Command{&RemoveAll{Force: true}}})
	assert.Equal(t, errcode.InvalidParams, r.Batch[0].Code())
	assert.True(t, x.exists("a"))
}

// rawEntry lets a test apply hand-made log bytes through h.apply.
type rawEntry struct{ b []byte }

func (r *rawEntry) Type() CmdType { return CmdType(r.b[0]) }
func (r *rawEntry) encode(e *enc) { e.b = append(e.b[:0], r.b...) }
func (r *rawEntry) decode(*dec)   {}

// TestSegmentTransportTypes: a segment with a transfer-engine endpoint goes
// in a command type of its own, so a node of an earlier release halts on it;
// without one, the bytes are those of the earlier release.
func TestSegmentTransportTypes(t *testing.T) {
	plain := SegmentSpec{ID: "s", Name: "n", Base: 5, Size: 6}
	withTE := plain
	withTE.Endpoint, withTE.Protocol = "10.0.0.1:15000", "tcp"
	assert.Equal(t, CmdMountSegment, (&MountSegment{Segment: plain}).Type())
	assert.Equal(t, CmdMountSegmentTransport, (&MountSegment{Segment: withTE}).Type())
	assert.Equal(t, CmdRemountSegmentsTransport, (&RemountSegments{Segments: []SegmentSpec{plain, withTE}}).Type())

	x := newH(t)
	require.NoError(t, x.f.Apply(Encode(&MountSegment{NowMs: 1, ClientID: "c", Segment: withTE})).Err)
	assert.Equal(t, "10.0.0.1:15000", x.f.Segments()[0].Endpoint)
	other := withTE
	other.Endpoint = "10.0.0.2:15000"
	assert.Equal(t, errcode.SegmentAlreadyExists, errcode.Of(x.f.Apply(Encode(&MountSegment{NowMs: 2, ClientID: "c", Segment: other})).Err),
		"the same segment from another endpoint is another segment")
	long := withTE
	long.ID, long.Name, long.Base, long.Endpoint = "s2", "n2", 100, strings.Repeat("e", MaxIDLen+1)
	assert.Equal(t, errcode.InvalidParams, errcode.Of(x.f.Apply(Encode(&MountSegment{NowMs: 3, ClientID: "c", Segment: long})).Err))
}

// TestSingleObjectSize: nearly every object is a single one (laidOut), and
// its allocation is most of a follower's memory per object; it stays in
// Go's 144-byte size class, the next being 160.
func TestSingleObjectSize(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(singleObject{}), uintptr(144))
}
