package fsm

import (
	"cmp"
	"io"
	"slices"
	"unsafe"

	"github.com/moonraft/moonraft/internal/btree"
	"github.com/moonraft/moonraft/snapshots"
)

// Section names, in the order they appear; the order is part of the format.
// The last three hold state of graceful unmounts and upserts and are written
// only when it exists, so a state without them has the format (and digest)
// of the release before them.
//
// The objects are in one of two sections. A file holds "objects.v2"
// (encodePackedObject): each key as what it adds to the one before it, each
// owner as its place among the sessions. The state's digest is taken over
// "objects", the earlier encoding, which files of earlier releases hold:
// the digest of a state is the same in every release, so nodes of two
// releases compare theirs during a rolling upgrade.
var sectionOrder = []string{"meta", "segments", "sessions", "objects", "objects.v2", "tombstones", "ring", "draining", "replaced", "discarded", "members", "deferred"}

// Snapshot is a point-in-time view of the state. Taking it is cheap (the
// object and tombstone trees are cloned copy-on-write, the rest is small);
// writing it may then run in another goroutine while Apply goes on.
type Snapshot struct {
	meta       meta
	segments   []*segment
	sessions   []sessionRec
	objects    *btree.BTreeG[objItem]
	tombstones *btree.BTreeG[tombstone]
	ring       Pending
	used       uint64
	draining   []drainRec
	replaced   []replacedRec
	discarded  []discard
	members    []memberRec
	// deferDirect is the deferral's direct count (0: off, no section);
	// deferred its waiting REMOVEs, oldest first.
	deferDirect uint64
	deferred    []deferredRemoval
}

type memberRec struct{ id, grpcAddr string }

type drainRec struct {
	seg     *segment
	untilMs int64
}

type replacedRec struct {
	key      string
	replicas []replica
}

type meta struct {
	params             Params
	nowMs              int64
	appliedSeq         uint64
	leaseFloorMs       int64
	needSpace          bool
	leaderID           string
	leaderAddr         string
	leaderMooncakeAddr string
	term               uint64
	expiryBounded      bool
}

type sessionRec struct {
	clientID   string
	deadlineMs int64
	segments   []*segment
}

func (f *FSM) meta() meta {
	return meta{f.params, f.nowMs, f.appliedSeq, f.leaseFloorMs, f.needSpace, f.leaderID, f.leaderAddr, f.leaderMooncakeAddr, f.term, f.expiryBounded}
}

// Snapshot captures the state. It must be called with Apply excluded (the
// caller's lock); the returned value is independent of later Applies.
func (f *FSM) Snapshot() *Snapshot {
	f.gen++
	return f.view(f.objects.Clone(), f.tombstones.Clone())
}

// view is the state as a Snapshot over the given object and tombstone
// trees; it changes nothing in f, so a reader may take one of the live
// trees under the read lock (Digest).
func (f *FSM) view(objects *btree.BTreeG[objItem], tombstones *btree.BTreeG[tombstone]) *Snapshot {
	s := &Snapshot{
		meta:       f.meta(),
		segments:   slices.Clone(f.segOrder),
		objects:    objects,
		tombstones: tombstones,
		ring:       f.Ring(),
		used:       f.used,
		discarded:  slices.Clone(f.discarded),
		// A copy: flushes mark queue entries dead through the map, which
		// later Applies change.
		deferDirect: f.deferral.direct,
		deferred:    f.deferral.live(),
	}
	for _, sg := range f.segOrder {
		if sg.draining {
			s.draining = append(s.draining, drainRec{sg, sg.drainUntilMs})
		}
	}
	for key, old := range f.replaced {
		s.replaced = append(s.replaced, replacedRec{key, old})
	}
	slices.SortFunc(s.replaced, func(a, b replacedRec) int { return cmp.Compare(a.key, b.key) })
	for id, sess := range f.sessions {
		d, _ := f.deadlines.Deadline(id)
		// The session's own string, which its objects share (sessionIndex).
		s.sessions = append(s.sessions, sessionRec{sess.clientID, d, slices.Clone(sess.segments)})
	}
	slices.SortFunc(s.sessions, func(a, b sessionRec) int { return cmp.Compare(a.clientID, b.clientID) })
	for id, addr := range f.members {
		s.members = append(s.members, memberRec{id, addr})
	}
	slices.SortFunc(s.members, func(a, b memberRec) int { return cmp.Compare(a.id, b.id) })
	return s
}

// AppliedSeq is the last OpLog seq the snapshot covers.
func (s *Snapshot) AppliedSeq() uint64 { return s.meta.appliedSeq }

// Write streams the snapshot into w as a MOONSNAP file. h supplies what the
// state does not know (Raft index and term, cluster, node, time); the
// counts and applied seq are filled in here.
func (s *Snapshot) Write(w io.Writer, h snapshots.Header) error {
	h.AppliedSeq = s.meta.appliedSeq
	h.Segments = uint64(len(s.segments))
	h.Sessions = uint64(len(s.sessions))
	h.Objects = uint64(s.objects.Len())
	h.Bytes = s.used
	sw, err := snapshots.NewWriter(w, h)
	if err != nil {
		return err
	}
	if err := s.writeSections(sw, true); err != nil {
		return err
	}
	return sw.Close()
}

// Digest is the SHA-256 of the canonical encoding of the whole state: equal
// on two nodes exactly when their states are equal.
func (f *FSM) Digest() [32]byte {
	// The live trees, not clones: Digest runs under the read lock, beside
	// other readers, and must not write (Clone writes the tree it clones).
	return f.view(f.objects, f.tombstones).Digest()
}

// Digest is the state's digest (FSM.Digest) as the snapshot captured it. A
// pass over every object, it needs no lock: taking the snapshot is what
// excludes Apply, and that is cheap.
func (s *Snapshot) Digest() [32]byte {
	w := snapshots.NewDigestWriter()
	// A digest writer has no underlying writer, so neither call can fail.
	_ = s.writeSections(w, false)
	_ = w.Close()
	return w.Digest()
}

// writeSections writes the state's sections; packed, the objects go into
// "objects.v2", as in a file, else into "objects", as for the digest.
func (s *Snapshot) writeSections(w *snapshots.Writer, packed bool) error {
	var e enc
	rec := func() error {
		err := w.Record(e.b)
		e.b = e.b[:0]
		return err
	}
	segIndex := newPtrIndex[segment, uint64](len(s.segments))
	for i, sg := range s.segments {
		segIndex.put(sg, uint64(i))
	}
	var err error
	section := func(name string, body func() error) {
		if err == nil {
			err = w.Section(name)
		}
		if err == nil {
			err = body()
		}
	}
	section("meta", func() error {
		m := &s.meta
		m.params.encode(&e)
		e.i64(m.nowMs)
		e.u64(m.appliedSeq)
		e.i64(m.leaseFloorMs)
		e.bool(m.needSpace)
		e.str(m.leaderID)
		e.str(m.leaderAddr)
		e.u64(m.term)
		// Without either: the earlier format, byte for byte.
		if m.leaderMooncakeAddr != "" || m.expiryBounded {
			e.str(m.leaderMooncakeAddr)
		}
		if m.expiryBounded {
			e.bool(true)
		}
		return rec()
	})
	section("segments", func() error {
		for _, sg := range s.segments {
			e.str(sg.clientID)
			spec := sg.spec()
			spec.encode(&e, spec.hasTransport()) // without: the earlier format, byte for byte
			if err := rec(); err != nil {
				return err
			}
		}
		return nil
	})
	section("sessions", func() error {
		for _, ss := range s.sessions {
			e.str(ss.clientID)
			e.i64(ss.deadlineMs)
			e.u64(uint64(len(ss.segments)))
			for _, sg := range ss.segments {
				e.u64(segIndex.at(sg))
			}
			if err := rec(); err != nil {
				return err
			}
		}
		return nil
	})
	objects, owners := "objects", sessionIndex{}
	if packed {
		objects, owners = "objects.v2", newSessionIndex(s.sessions)
	}
	section(objects, func() error {
		var (
			werr error
			prev string
		)
		ascendAhead(s.objects, func(it objItem) bool {
			if packed {
				encodePackedObject(&e, prev, it.key, it.obj, owners, segIndex)
			} else {
				encodeObject(&e, it.key, it.obj, segIndex)
			}
			prev = it.key
			werr = rec()
			return werr == nil
		})
		return werr
	})
	section("tombstones", func() error {
		var werr error
		s.tombstones.Ascend(func(t tombstone) bool {
			e.str(t.key)
			e.u64(t.keySeq)
			e.i64(t.removedAtMs)
			werr = rec()
			return werr == nil
		})
		return werr
	})
	optional := func(name string, n int, body func() error) {
		if n > 0 {
			section(name, body)
		}
	}
	section("ring", func() error {
		for _, run := range s.ring.runs {
			for i := range run {
				en := run[i].entry()
				e.u64(en.SequenceID)
				e.i64(en.TimestampMs)
				e.u64(uint64(en.OpType))
				e.str(en.Key)
				e.str(en.Payload)
				e.u64(uint64(en.Checksum))
				e.u64(uint64(en.PrefixHash))
				e.u64(en.KeySequenceID)
				e.str(string(en.Source))
				if err := rec(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	optional("draining", len(s.draining), func() error {
		for _, d := range s.draining {
			e.u64(segIndex.at(d.seg))
			e.i64(d.untilMs)
			if err := rec(); err != nil {
				return err
			}
		}
		return nil
	})
	optional("replaced", len(s.replaced), func() error {
		for _, r := range s.replaced {
			e.str(r.key)
			encodeReplicas(&e, r.replicas, segIndex)
			if err := rec(); err != nil {
				return err
			}
		}
		return nil
	})
	optional("discarded", len(s.discarded), func() error {
		for _, d := range s.discarded {
			e.i64(d.releaseMs)
			encodeReplicas(&e, d.replicas, segIndex)
			if err := rec(); err != nil {
				return err
			}
		}
		return nil
	})
	optional("members", len(s.members), func() error {
		for _, m := range s.members {
			e.str(m.id)
			e.str(m.grpcAddr)
			if err := rec(); err != nil {
				return err
			}
		}
		return nil
	})
	// Its first record is the direct count, the rest the waiting REMOVEs.
	optional("deferred", int(min(s.deferDirect, 1)), func() error {
		e.u64(s.deferDirect)
		if err := rec(); err != nil {
			return err
		}
		for _, r := range s.deferred {
			e.str(r.key)
			e.u64(r.keySeq)
			e.i64(r.atMs)
			e.str(string(r.src))
			if err := rec(); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}

func encodeObject(e *enc, key string, o *object, segIndex ptrIndex[segment, uint64]) {
	e.str(key)
	e.u64(o.size)
	e.str(o.clientID)
	encodeObjectRest(e, o, segIndex)
}

// encodePackedObject is encodeObject for "objects.v2": the key as the
// length of its longest common prefix with prev (the key before it) and the
// rest; the owner as 1 + its session's place in the sessions section, or
// 0 and its id when it has no session. A Mooncake client's id is a UUID of
// 33 bytes; keys sorted side by side share most of their bytes.
func encodePackedObject(e *enc, prev, key string, o *object, owners sessionIndex, segIndex ptrIndex[segment, uint64]) {
	shared := commonPrefix(prev, key)
	e.u64(uint64(shared))
	e.str(key[shared:])
	e.u64(o.size)
	if i, ok := owners.find(o.clientID); ok {
		e.u64(i + 1)
	} else {
		e.u64(0)
		e.str(o.clientID)
	}
	encodeObjectRest(e, o, segIndex)
}

// sessionIndex finds an object's owner among a snapshot's sessions. While
// its session lives an object's owner is the session's own string
// (sharedClientID), found by where its bytes lie, a pointer's hash,
// instead of by its 33 bytes hashed and compared: those were a quarter of
// writing the objects of 10,000 clients. Another string equal to a
// session's, an owner whose session came after its object, is found by
// its bytes.
type sessionIndex struct {
	byData ptrIndex[byte, sessionPlace]
	byID   map[string]uint64
}

// sessionPlace is a session's place and the length of its id.
type sessionPlace struct{ index, idLen uint32 }

func newSessionIndex(sessions []sessionRec) sessionIndex {
	x := sessionIndex{newPtrIndex[byte, sessionPlace](len(sessions)), make(map[string]uint64, len(sessions))}
	for i, ss := range sessions {
		x.byData.put(unsafe.StringData(ss.clientID), sessionPlace{uint32(i), uint32(len(ss.clientID))})
		x.byID[ss.clientID] = uint64(i)
	}
	return x
}

// find returns the place of id's session. Strings are immutable and the
// snapshot keeps every session's alive, so a string whose bytes lie where a
// session's do, as many of them, is that session's id.
func (x sessionIndex) find(id string) (uint64, bool) {
	if p, ok := x.byData.get(unsafe.StringData(id)); ok && int(p.idLen) == len(id) {
		return uint64(p.index), true
	}
	i, ok := x.byID[id]
	return i, ok
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// encodeObjectRest is what both encodings of an object share after its
// key, size and owner.
func encodeObjectRest(e *enc, o *object, segIndex ptrIndex[segment, uint64]) {
	e.i64(o.putStartMs)
	e.i64(o.leaseMs)
	e.bool(o.softPin)
	e.i64(o.softPinMs)
	e.u64(o.keySeq)
	encodeReplicas(e, o.replicas, segIndex)
}

func encodeReplicas(e *enc, rs []replica, segIndex ptrIndex[segment, uint64]) {
	e.u64(uint64(len(rs)))
	for _, r := range rs {
		e.u64(uint64(r.status))
		e.u64(uint64(len(r.buffers)))
		for _, b := range r.buffers {
			e.u64(segIndex.at(b.seg))
			e.u64(b.offset)
			e.u64(b.length)
		}
	}
}
