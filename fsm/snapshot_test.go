package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// busyState returns an FSM with some of everything: segments of several
// clients, complete and PROCESSING objects, soft pins, tombstones, a ring.
func busyState(t testing.TB) *FSM {
	g := newGen(rand.New(rand.NewPCG(5, 5)))
	f := New()
	for i := 0; i < 3000; i++ {
		f.Apply(Encode(g.next(f)))
	}
	x := &h{t: t, f: f, now: g.now}
	x.mount("z", "zs", 0, 1<<20)
	// On z's own segment, so other clients' expiry cannot take them.
	put := func(key string, softPin bool, end bool, sizes ...uint64) {
		x.ok(&PutStart{NowMs: x.now, Key: key, SliceLengths: sizes, ReplicaNum: 1, SoftPin: softPin, PreferredSegment: "name-zs", ClientID: "z"})
		if end {
			x.ok(&PutEnd{NowMs: x.now, Key: key, ClientID: "z"})
		}
	}
	put("z/complete", false, true, 100, 200)
	put("z/processing", false, false, 10)
	put("z/pinned", true, true, 5)
	put("z/gone", false, true, 1)
	x.ok(&Remove{NowMs: x.now, Key: "z/gone", Force: true})
	require.NotZero(t, f.tombstones.Len())
	require.NotZero(t, f.ring.len())
	return f
}

func TestSnapshotRoundTrip(t *testing.T) {
	f := busyState(t)
	var buf bytes.Buffer
	hdr := snapshots.Header{RaftIndex: 42, RaftTerm: 3, ClusterID: "cl", NodeID: "n1", CreatedUnixMs: 99}
	require.NoError(t, f.Snapshot().Write(&buf, hdr))

	sum, err := snapshots.Inspect(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, uint64(f.objects.Len()), sum.Header.Objects)
	assert.Equal(t, uint64(len(f.segments)), sum.Header.Segments)
	assert.Equal(t, uint64(len(f.sessions)), sum.Header.Sessions)
	assert.Equal(t, f.used, sum.Header.Bytes)
	assert.Equal(t, f.appliedSeq, sum.Header.AppliedSeq)

	g := New()
	h, err := g.Restore(&buf)
	require.NoError(t, err)
	assert.Equal(t, uint64(42), h.RaftIndex)
	assert.Equal(t, "cl", h.ClusterID)
	assertRestored(t, f, g)
	var again bytes.Buffer
	require.NoError(t, g.Snapshot().Write(&again, hdr))
	sum2, err := snapshots.Inspect(&again)
	require.NoError(t, err)
	assert.Equal(t, sum.Digest, sum2.Digest, "the restored state writes the same body back")

	// The restored state goes on exactly like the original.
	gen := newGen(rand.New(rand.NewPCG(6, 6)))
	gen.now = f.nowMs
	for i := 0; i < 2000; i++ {
		e := Encode(gen.next(f))
		require.Equal(t, f.Apply(e), g.Apply(e))
	}
	assert.Equal(t, f.Digest(), g.Digest())
}

// TestRestoreInParallel: a restore whose objects are decoded in several
// tasks at once, in batches down to one record, and whose segments are
// built in parts, builds the state a restore in turn builds (under -race:
// the tasks touch disjoint data).
func TestRestoreInParallel(t *testing.T) {
	f := busyState(t)
	// Enough objects for many steps: on eight segments of four clients,
	// of one to three replicas of one to three buffers, some in progress.
	x := &h{t: t, f: f, now: f.nowMs}
	for c := range 4 {
		for s := range 2 {
			x.mount(fmt.Sprintf("w%d", c), fmt.Sprintf("w%d-%d", c, s), uint64(c*2+s)<<32, 1<<30)
		}
	}
	for i := range 5000 {
		key, client := fmt.Sprintf("obj/%08x", uint32(i)*2654435761), fmt.Sprintf("w%d", i%4)
		sizes := []uint64{64, 32, 16}[:1+i%3]
		cmds := []Command{&PutStart{NowMs: x.now, Key: key, SliceLengths: sizes, ReplicaNum: uint32(1 + i%3/2 + i%5/4), ClientID: client}}
		if i%10 != 0 {
			cmds = append(cmds, &PutEnd{NowMs: x.now, Key: key, ClientID: client})
		}
		for _, c := range cmds { // without x.ok's check of every invariant after each
			require.NoError(t, f.Apply(Encode(c)).Err)
		}
	}
	require.NoError(t, f.CheckInvariants())
	var buf bytes.Buffer
	require.NoError(t, f.Snapshot().Write(&buf, snapshots.Header{}))
	file := buf.Bytes()
	for _, tt := range []struct{ width, batch int }{{1, objectBatch}, {2, 1}, {3, 7}, {2, 64}, {4, 3}} {
		t.Run(fmt.Sprintf("%d tasks of %d records", tt.width, tt.batch), func(t *testing.T) {
			g := New()
			_, err := g.restore(bytes.NewReader(file), tt.width, inGoroutines, tt.batch)
			require.NoError(t, err)
			assertRestored(t, f, g)
			var again bytes.Buffer
			require.NoError(t, g.Snapshot().Write(&again, snapshots.Header{}))
			assert.Equal(t, file, again.Bytes(), "the restored state writes the same file back")
		})
	}
}

// assertRestored checks that g, restored from a snapshot of f, is f's
// state, its key sets made at their final size: an object with two
// buffers in a segment (busyState's z/complete) counted once, nothing grown.
func assertRestored(t *testing.T, f, g *FSM) {
	t.Helper()
	assert.Equal(t, f.Digest(), g.Digest())
	assert.Equal(t, f.Stats(), g.Stats())
	require.NoError(t, g.CheckInvariants())
	for _, s := range g.segments {
		if s.objs != nil {
			assert.Equal(t, len(s.objs.arena), cap(s.objs.arena), "segment %s's key arena", s.id)
			assert.Equal(t, tableSize(s.objs.n), len(s.objs.slots), "segment %s's key table", s.id)
		}
	}
}

// inGoroutines runs each task in a goroutine of its own, as the node does.
func inGoroutines(tasks ...func()) {
	var wg sync.WaitGroup
	for _, t := range tasks {
		wg.Go(t)
	}
	wg.Wait()
}

// A file packs its objects: a Mooncake client's UUID once, in its session,
// and each key as what it adds to the one before it.
func TestSnapshotPacksObjects(t *testing.T) {
	x := newH(t)
	owner := "5f0c8a51-21f4-4c49-9d5e-6f1e0b6a9c42"[:33]
	x.mount(owner, "s1", 0, 1<<30)
	for i := range 2000 {
		x.put(fmt.Sprintf("llama-3-70b/tp0/%016x", i*7919), owner, 4096)
	}
	x.ok(&Exported{Seq: x.f.appliedSeq}) // etcd has the ring: the objects are the file
	var file bytes.Buffer
	require.NoError(t, x.f.Snapshot().Write(&file, snapshots.Header{}))
	var plain bytes.Buffer
	w, err := snapshots.NewWriter(&plain, snapshots.Header{})
	require.NoError(t, err)
	require.NoError(t, x.f.Snapshot().writeSections(w, false))
	require.NoError(t, w.Close())
	t.Logf("%d objects: %d bytes packed, %d plain", x.f.objects.Len(), file.Len(), plain.Len())
	assert.Less(t, file.Len(), plain.Len()/2)
}

// An object's owner is found among the sessions whether or not it is the
// session's own string: an object put before its owner's session began
// holds a string of its own, and a restore takes an owner written out
// beside its session for a damaged file.
func TestSnapshotFindsOwnersSession(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1<<20)
	x.put("before", "late", 4096)
	x.mount("late", "s2", 1<<20, 1<<20)
	x.put("after", "late", 4096)
	before, ok := x.f.findObject("before")
	require.True(t, ok)
	require.NotSame(t, unsafe.StringData(x.f.sessions["late"].clientID), unsafe.StringData(before.obj.clientID))
	var file bytes.Buffer
	require.NoError(t, x.f.Snapshot().Write(&file, snapshots.Header{}))
	g := New()
	_, err := g.Restore(bytes.NewReader(file.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, x.f.Digest(), g.Digest())
}

func TestSessionIndex(t *testing.T) {
	sessions := []sessionRec{{clientID: "client-a"}, {clientID: "client-b"}}
	x := newSessionIndex(sessions)
	tests := []struct {
		name  string
		id    string
		want  uint64
		found bool
	}{
		{"the session's string", sessions[1].clientID, 1, true},
		{"an equal string of its own", string([]byte("client-a")), 0, true},
		{"a prefix of a session's string, its bytes", sessions[0].clientID[:6], 0, false},
		{"no session", "client-c", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i, ok := x.find(tt.id)
			assert.Equal(t, tt.found, ok)
			assert.Equal(t, tt.want, i)
		})
	}
}

// TestSnapshotIsPointInTime: a snapshot taken before more commands are
// applied writes the state as it was when taken.
func TestSnapshotIsPointInTime(t *testing.T) {
	f := busyState(t)
	want := f.Digest()
	snap := f.Snapshot()
	x := &h{t: t, f: f, now: f.nowMs + 1}
	x.tick(lease.Renewal{Key: "z/complete", AtMs: x.now})
	x.ok(&PutEnd{NowMs: x.now, Key: "z/processing", ClientID: "z"})
	x.ok(&RemoveAll{NowMs: x.now, Force: true})
	x.ok(&Exported{Seq: f.appliedSeq})
	require.NotEqual(t, want, f.Digest())
	var buf bytes.Buffer
	require.NoError(t, snap.Write(&buf, snapshots.Header{}))
	g := New()
	_, err := g.Restore(&buf)
	require.NoError(t, err)
	assert.Equal(t, want, g.Digest())
}

// TestSnapshotDigests: a snapshot's digests are the state's when it was
// taken, a resizing upsert's old value included, whatever is applied after
// (Status computes them once the state's lock is let go).
func TestSnapshotDigests(t *testing.T) {
	f := busyState(t)
	x := &h{t: t, f: f, now: f.nowMs + 1}
	require.NoError(t, x.upsert("z/complete", "z", 400).Err)
	require.NotEmpty(t, f.replaced, "a resizing upsert in progress")
	want, wantSet := f.Digest(), f.ObjectSetDigest()
	snap := f.Snapshot()
	assert.Equal(t, want, snap.Digest())
	assert.Equal(t, wantSet, snap.ObjectSetDigest())
	require.NoError(t, x.end("z/complete", "z").Err)
	x.ok(&RemoveAll{NowMs: x.now, Force: true})
	require.NotEqual(t, want, f.Digest())
	require.NotEqual(t, wantSet, f.ObjectSetDigest())
	assert.Equal(t, want, snap.Digest())
	assert.Equal(t, wantSet, snap.ObjectSetDigest())
}

// TestSnapshotWhileApplying writes snapshots and takes their digests in
// another goroutine while commands keep being applied, as Raft's Persist
// and Status do; the race detector checks that nothing they read is
// modified in place, and each file restores to the digest taken with it.
func TestSnapshotWhileApplying(t *testing.T) {
	f := busyState(t)
	g := newGen(rand.New(rand.NewPCG(9, 9)))
	g.now = f.nowMs
	for round := 0; round < 5; round++ {
		want := f.Digest()
		snap := f.Snapshot()
		wantSet := f.ObjectSetDigest()
		done := make(chan []byte)
		var digest, setDigest [32]byte
		go func() {
			var buf bytes.Buffer
			if err := snap.Write(&buf, snapshots.Header{}); err != nil {
				buf.Reset()
			}
			digest, setDigest = snap.Digest(), snap.ObjectSetDigest()
			done <- buf.Bytes()
		}()
		for i := 0; i < 300; i++ {
			f.Apply(Encode(g.next(f)))
		}
		file := <-done
		require.NotEmpty(t, file)
		require.Equal(t, want, digest, "round %d", round)
		require.Equal(t, wantSet, setDigest, "round %d", round)
		r := New()
		_, err := r.Restore(bytes.NewReader(file))
		require.NoError(t, err)
		require.Equal(t, want, r.Digest(), "round %d", round)
	}
}

func TestDigestDistinguishesStates(t *testing.T) {
	x := newH(t)
	empty := x.f.Digest()
	x.mount("c1", "s1", 0, 100)
	mounted := x.f.Digest()
	assert.NotEqual(t, empty, mounted)
	x.put("k", "c1", 10)
	put := x.f.Digest()
	assert.NotEqual(t, mounted, put)
	x.tick(lease.Renewal{Key: "k", AtMs: x.now})
	assert.NotEqual(t, put, x.f.Digest(), "a lease renewal changes the state")
	y := newH(t)
	assert.Equal(t, empty, y.f.Digest())
}

// TestRestoreRejectsBadSnapshots: each bad file is refused with a clear
// error and the state that was there stays untouched; a restore in
// parallel refuses it with the same error, the first in the file.
func TestRestoreRejectsBadSnapshots(t *testing.T) {
	good := func() *FSM { return busyState(t) }
	write := func(f *FSM) []byte {
		var buf bytes.Buffer
		require.NoError(t, f.Snapshot().Write(&buf, snapshots.Header{}))
		return buf.Bytes()
	}
	valid := write(good())
	firstObject := func(f *FSM) (string, *object) {
		it, _ := f.objects.Min()
		return it.key, it.obj
	}
	tests := []struct {
		name string
		file func() []byte
		want errcode.Code
	}{
		{"truncated", func() []byte { return valid[:len(valid)/2] }, errcode.FileReadFail},
		{"flipped byte in the trailer", func() []byte {
			b := bytes.Clone(valid)
			b[len(b)-1] ^= 0x40
			return b
		}, errcode.ChecksumMismatch},
		{"not a snapshot", func() []byte { return []byte("hello world, not a snapshot at all") }, errcode.FileReadFail},
		{"overlapping buffers", func() []byte {
			f := good()
			x := &h{t: t, f: f, now: f.nowMs}
			x.mount("y", "ys", 0, 1000)
			for _, k := range []string{"y/a", "y/b"} { // both on ys
				x.ok(&PutStart{NowMs: x.now, Key: k, SliceLengths: []uint64{10}, ReplicaNum: 1, PreferredSegment: "name-ys", ClientID: "y"})
				x.ok(&PutEnd{NowMs: x.now, Key: k, ClientID: "y"})
			}
			a, _ := f.getObject("y/a")
			b, _ := f.getObject("y/b")
			b.replicas[0].buffers[0].offset = a.replicas[0].buffers[0].offset + 5
			return write(f)
		}, errcode.FileReadFail},
		{"buffer outside segment", func() []byte {
			f := good()
			_, o := firstObject(f)
			o.replicas[0].buffers[0].offset = o.replicas[0].buffers[0].seg.size
			return write(f)
		}, errcode.FileReadFail},
		{"replica size mismatch", func() []byte {
			f := good()
			_, o := firstObject(f)
			o.size++
			return write(f)
		}, errcode.FileReadFail},
		{"segment without session", func() []byte {
			f := good()
			delete(f.sessions, "z")
			return write(f)
		}, errcode.FileReadFail},
		{"bad ring checksum", func() []byte {
			f := good()
			run := f.ring.view(f.ring.len()-1, 1)[0] // shares the ring's memory
			last := run[0].entry()
			last.Checksum++
			run[0] = ringEntry{seq: last.SequenceID, restored: &last}
			return write(f)
		}, errcode.ChecksumMismatch},
		{"ring not ending at applied seq", func() []byte {
			f := good()
			f.appliedSeq++
			return write(f)
		}, errcode.FileReadFail},
		{"invalid params", func() []byte {
			f := good()
			f.params.LeaseTTLMs = 0
			return write(f)
		}, errcode.InvalidParams},
		{"tombstone of a live key", func() []byte {
			f := good()
			k, _ := firstObject(f)
			f.tombstones.ReplaceOrInsert(tombstone{k, 1, 0})
			return write(f)
		}, errcode.FileReadFail},
		{"no meta", func() []byte {
			var buf bytes.Buffer
			w, _ := snapshots.NewWriter(&buf, snapshots.Header{})
			require.NoError(t, w.Section("meta"))
			require.NoError(t, w.Close())
			return buf.Bytes()
		}, errcode.FileReadFail},
		{"sections out of order", func() []byte {
			var buf bytes.Buffer
			w, _ := snapshots.NewWriter(&buf, snapshots.Header{})
			require.NoError(t, w.Section("ring"))
			require.NoError(t, w.Record([]byte{1}))
			require.NoError(t, w.Section("meta"))
			require.NoError(t, w.Record([]byte{1}))
			require.NoError(t, w.Close())
			return buf.Bytes()
		}, errcode.FileReadFail},
		{"unknown empty section", func() []byte {
			var buf bytes.Buffer
			w, _ := snapshots.NewWriter(&buf, snapshots.Header{})
			require.NoError(t, w.Section("extra"))
			require.NoError(t, w.Close())
			return buf.Bytes()
		}, errcode.FileReadFail},
		{"section of a newer release", func() []byte {
			var buf bytes.Buffer
			w, _ := snapshots.NewWriter(&buf, snapshots.Header{})
			require.NoError(t, w.Section("extra"))
			require.NoError(t, w.Record([]byte{1}))
			require.NoError(t, w.Close())
			return buf.Bytes()
		}, errcode.InvalidVersion},
		{"objects in both sections", func() []byte {
			f := good()
			return rewriteObjects(t, f, write(f), func(i int, key string, o *object, pe packedEnc) (string, []byte) {
				if i == 0 {
					var e enc
					encodeObject(&e, key, o, pe.segIndex)
					return "objects", e.b
				}
				return "objects.v2", pe.object(key, o)
			})
		}, errcode.FileReadFail},
		{"key prefix not the longest shared", func() []byte {
			f := good()
			var keys []string
			f.objects.Ascend(func(it objItem) bool { keys = append(keys, it.key); return true })
			at := slices.IndexFunc(keys[1:], func(k string) bool { return k[0] == keys[0][0] }) + 1
			require.Positive(t, at, "two keys sharing a first byte")
			return rewriteObjects(t, f, write(f), func(i int, key string, o *object, pe packedEnc) (string, []byte) {
				if i == at {
					pe.prev = "" // shares none of the key before it
				}
				return "objects.v2", pe.object(key, o)
			})
		}, errcode.FileReadFail},
		{"owner with a session written out", func() []byte {
			f := good()
			return rewriteObjects(t, f, write(f), func(i int, key string, o *object, pe packedEnc) (string, []byte) {
				if i == 0 {
					clear(pe.sessIndex)
				}
				return "objects.v2", pe.object(key, o)
			})
		}, errcode.FileReadFail},
		{"owner past the sessions", func() []byte {
			f := good()
			return rewriteObjects(t, f, write(f), func(i int, key string, o *object, pe packedEnc) (string, []byte) {
				if i == 0 {
					pe.sessIndex[o.clientID] = uint64(len(f.sessions))
				}
				return "objects.v2", pe.object(key, o)
			})
		}, errcode.InvalidParams},
		{"an object twice", func() []byte {
			f := good()
			var first string
			return rewriteObjects(t, f, write(f), func(i int, key string, o *object, pe packedEnc) (string, []byte) {
				if i == 0 {
					first = key
				}
				if i == 1 {
					return "objects.v2", pe.object(first, o) // the key before it, again
				}
				return "objects.v2", pe.object(key, o)
			})
		}, errcode.FileReadFail},
		{"malformed record", func() []byte {
			var buf bytes.Buffer
			w, _ := snapshots.NewWriter(&buf, snapshots.Header{})
			require.NoError(t, w.Section("meta"))
			require.NoError(t, w.Record([]byte{0xff}))
			require.NoError(t, w.Close())
			return buf.Bytes()
		}, errcode.InvalidParams},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := newH(t)
			x.mount("c1", "s1", 0, 1000)
			x.put("mine", "c1", 10)
			before := x.f.Digest()
			file := tt.file()
			_, err := x.f.Restore(bytes.NewReader(file))
			require.Error(t, err)
			assert.Equal(t, tt.want, errcode.Of(err), "%v", err)
			assert.Equal(t, before, x.f.Digest(), "state untouched")
			assert.True(t, x.exists("mine"))
			_, perr := x.f.restore(bytes.NewReader(file), 3, inGoroutines, 2)
			assert.Equal(t, err, perr, "in parallel")
			assert.Equal(t, before, x.f.Digest(), "state untouched")
		})
	}
}

func TestRestoreOfEveryTruncation(t *testing.T) {
	x := newH(t)
	x.mount("c1", "s1", 0, 1000)
	x.put("k", "c1", 10)
	var buf bytes.Buffer
	require.NoError(t, x.f.Snapshot().Write(&buf, snapshots.Header{}))
	b := buf.Bytes()
	for n := 0; n < len(b); n++ {
		_, err := New().Restore(bytes.NewReader(b[:n]))
		require.Error(t, err, "truncated at %d of %d", n, len(b))
	}
	_, err := New().Restore(bytes.NewReader(b))
	require.NoError(t, err)
}

// packedEnc encodes objects as a file's "objects.v2" section does, from
// maps a test may change to write one wrongly.
type packedEnc struct {
	prev      string
	sessIndex map[string]uint64
	segIndex  ptrIndex[segment, uint64]
}

func (p packedEnc) object(key string, o *object) []byte {
	var e enc
	encodePackedObject(&e, p.prev, key, o, sessionIndex{byID: p.sessIndex}, p.segIndex)
	return e.b
}

// rewriteObjects writes file again with its objects re-encoded by each:
// the i-th object (in key order) goes into the section it names, with its
// record. Every other record is copied as it is.
func rewriteObjects(t *testing.T, f *FSM, file []byte, each func(i int, key string, o *object, pe packedEnc) (section string, rec []byte)) []byte {
	t.Helper()
	sr, err := snapshots.NewReader(bytes.NewReader(file))
	require.NoError(t, err)
	var out bytes.Buffer
	w, err := snapshots.NewWriter(&out, sr.Header())
	require.NoError(t, err)
	section := ""
	put := func(name string, rec []byte) {
		if name != section {
			require.NoError(t, w.Section(name))
			section = name
		}
		require.NoError(t, w.Record(rec))
	}
	for {
		name, rec, err := sr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if name != "objects.v2" {
			put(name, rec)
			continue
		}
		if section == "objects.v2" || section == "objects" {
			continue // written below, at its first record
		}
		pe := packedEnc{sessIndex: map[string]uint64{}, segIndex: newPtrIndex[segment, uint64](len(f.segOrder))}
		for i, s := range f.segOrder {
			pe.segIndex.put(s, uint64(i))
		}
		for i, id := range slices.Sorted(maps.Keys(f.sessions)) {
			pe.sessIndex[id] = uint64(i)
		}
		i := 0
		f.objects.Ascend(func(it objItem) bool {
			put(each(i, it.key, it.obj, pe))
			pe.prev = it.key
			i++
			return true
		})
	}
	require.NoError(t, w.Close())
	return out.Bytes()
}
