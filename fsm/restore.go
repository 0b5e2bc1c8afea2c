package fsm

import (
	"cmp"
	"errors"
	"io"
	"slices"
	"strconv"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/internal/btree"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/snapshots"
)

// Restore replaces the state with the snapshot read from r. The new state is
// built aside and validated — checksum, canonical order, every invariant —
// and swapped in only if all of it holds; on error f is unchanged.
func (f *FSM) Restore(r io.Reader) (snapshots.Header, error) {
	return f.restore(r, 1, nil, objectBatch)
}

// RestoreParallel is Restore from a snapshot whose header sr has read (its
// counts size what the caller prepares), with the work split into tasks
// that par runs: the objects' decoding in width tasks at once, and the
// segments' allocators and key sets in width parts. The state is the same
// as Restore's; par nil runs the tasks in turn.
func (f *FSM) RestoreParallel(sr *snapshots.Reader, width int, par Parallel) error {
	return f.restoreFrom(sr, width, par, objectBatch)
}

// restore is Restore with batch object records a decoding unit.
func (f *FSM) restore(r io.Reader, width int, par Parallel, batch int) (snapshots.Header, error) {
	sr, err := snapshots.NewReader(r)
	if err != nil {
		return snapshots.Header{}, err
	}
	if err := f.restoreFrom(sr, width, par, batch); err != nil {
		return snapshots.Header{}, err
	}
	return sr.Header(), nil
}

// restoreFrom is RestoreParallel with batch object records a decoding unit.
func (f *FSM) restoreFrom(sr *snapshots.Reader, width int, par Parallel, batch int) error {
	sr.SkipDigest()
	if par == nil {
		par = inTurn
	}
	nf, err := readState(sr, max(width, 1), par, batch)
	if err != nil {
		return err
	}
	*f = *nf
	return nil
}

// restorer builds a state from snapshot records, section by section.
type restorer struct {
	f       *FSM
	par     Parallel
	batch   int                     // object records decoded at once, a unit of a step
	section int                     // index in sectionOrder of the current section
	records int                     // records seen in the current section
	objects *btree.Builder[objItem] // while the objects section is read; then f.objects
	segs    []*segment
	// owners are the sessions' client ids in the order of the sessions
	// section, segSizes the sizes of segs: each object reads one of each,
	// and a dense array of thousands stays in the cache where the
	// sessions and segments themselves, each elsewhere in memory, do not.
	owners   []string
	segSizes []uint64
	// workers are the restore's tasks' own, one each (runUnits); the
	// first also serves the buffers of the sections after the objects.
	workers  []*objWorker
	sessOf   map[*segment]string
	lastTomb string
}

func readState(sr *snapshots.Reader, width int, par Parallel, batch int) (*FSM, error) {
	rs := &restorer{f: New(), par: par, batch: batch, section: -1, sessOf: map[*segment]string{}}
	for range width {
		rs.workers = append(rs.workers, &objWorker{})
	}
	name, data, err := sr.Next()
	for err == nil {
		if isObjects(name) {
			name, data, err = rs.objectSection(sr, name, data)
			continue
		}
		if err = rs.record(name, data); err != nil {
			return nil, err
		}
		name, data, err = sr.Next()
	}
	if !errors.Is(err, io.EOF) {
		return nil, err
	}
	if err := rs.finish(); err != nil {
		return nil, err
	}
	return rs.f, nil
}

func corrupt(format string, args ...any) error {
	return errcode.New(errcode.FileReadFail, "snapshot state: "+format, args...)
}

func (rs *restorer) record(name string, data []byte) error {
	if err := rs.enter(name); err != nil {
		return err
	}
	dd := newDec(data, "snapshot record", name)
	d := &dd
	var err error
	switch name {
	case "meta":
		err = rs.meta(d)
	case "segments":
		err = rs.segment(d)
	case "sessions":
		err = rs.session(d)
	case "tombstones":
		err = rs.tombstone(d)
	case "ring":
		err = rs.ringEntry(d)
	case "draining":
		err = rs.draining(d)
	case "replaced":
		err = rs.replacedRec(d)
	case "discarded":
		err = rs.discardRec(d)
	case "members":
		err = rs.memberRec(d)
	case "deferred":
		err = rs.deferredRec(d)
	}
	if err == nil {
		err = d.done()
	}
	return err
}

// enter counts a record of section name, which must be the current
// section or one after it in the canonical order.
func (rs *restorer) enter(name string) error {
	if !slices.Contains(sectionOrder, name) {
		return errcode.New(errcode.InvalidVersion,
			"snapshot section %q is unknown to this build: the snapshot was written by a newer moonraft; restore it with that release", name)
	}
	if rs.section < 0 || sectionOrder[rs.section] != name {
		// The reader only shows records, so an empty section is simply
		// skipped; the ones that appear must keep the canonical order.
		next := rs.section + 1
		for next < len(sectionOrder) && sectionOrder[next] != name {
			next++
		}
		if next == len(sectionOrder) || (rs.section < 0 && name != "meta") {
			return corrupt("unexpected section %q (sections are %v, in that order, meta first)", name, sectionOrder)
		}
		rs.endObjects()
		rs.section, rs.records = next, 0
	}
	rs.records++
	return nil
}

func (rs *restorer) meta(d *dec) error {
	if rs.records > 1 {
		return corrupt("more than one meta record")
	}
	f := rs.f
	f.params.decode(d)
	f.nowMs = d.i64()
	f.appliedSeq = d.u64()
	f.leaseFloorMs = d.i64()
	f.needSpace = d.bool()
	f.leaderID = d.str()
	f.leaderAddr = d.str()
	f.term = d.u64()
	if d.Remaining() > 0 {
		f.leaderMooncakeAddr = d.str()
		if d.Remaining() > 0 {
			if f.expiryBounded = d.bool(); !f.expiryBounded && d.err() == nil {
				return corrupt("meta record: bounded expiry written as false (not canonical)")
			}
		}
		if d.err() == nil && !f.expiryBounded && f.leaderMooncakeAddr == "" {
			return corrupt("meta record: an empty Mooncake address without bounded expiry (not canonical)")
		}
	}
	if d.err() != nil {
		return d.err()
	}
	return f.params.Validate()
}

func (rs *restorer) segment(d *dec) error {
	clientID := d.str()
	var spec SegmentSpec
	spec.decode(d, false)
	if d.Remaining() > 0 { // a segment with a transport endpoint
		spec.Endpoint, spec.Protocol = d.str(), d.str()
	}
	if d.err() != nil {
		return d.err()
	}
	if err := validateSegment(&spec); err != nil {
		return err
	}
	if err := validateID("client id", clientID); err != nil {
		return err
	}
	if n := len(rs.segs); n > 0 && rs.segs[n-1].id >= spec.ID {
		return corrupt("segments out of order at %q", spec.ID)
	}
	if _, dup := rs.f.segNames[spec.Name]; dup {
		return corrupt("segment name %q used twice", spec.Name)
	}
	s := &segment{id: spec.ID, name: spec.Name, clientID: clientID, base: spec.Base, size: spec.Size,
		endpoint: spec.Endpoint, protocol: spec.Protocol}
	rs.segs = append(rs.segs, s)
	rs.segSizes = append(rs.segSizes, s.size)
	rs.f.segNames[s.name] = s // names are checked here; the rest is wired in finish
	return nil
}

// usedBuf is a buffer read from the snapshot, by its segment's index in
// restorer.segs.
type usedBuf struct {
	seg int
	r   freeRange
}

const usedChunk = 4096

func (w *objWorker) addBuf(b usedBuf) {
	if n := len(w.bufs); n == 0 || len(w.bufs[n-1]) == usedChunk {
		w.bufs = append(w.bufs, make([]usedBuf, 0, usedChunk))
	}
	last := &w.bufs[len(w.bufs)-1]
	*last = append(*last, b)
	w.nbufs++
}

// keyCount is what a segment's key set will hold: keys, and their arena
// bytes; last is the objects record that counted last, so that an object
// with several buffers in the segment counts once.
type keyCount struct{ keys, bytes, last int }

// segIndex reads a segment's index in restorer.segs; -1 on error.
func (rs *restorer) segIndex(d *dec) int {
	i := d.u64()
	if d.err() != nil {
		return -1
	}
	if i >= uint64(len(rs.segs)) {
		d.Fail("segment index %d of %d", i, len(rs.segs))
		return -1
	}
	return int(i)
}

func (rs *restorer) segRef(d *dec) *segment {
	if i := rs.segIndex(d); i >= 0 {
		return rs.segs[i]
	}
	return nil
}

func (rs *restorer) session(d *dec) error {
	f := rs.f
	id := d.str()
	deadline := d.i64()
	segs := make([]*segment, d.count(1))
	for i := range segs {
		segs[i] = rs.segRef(d)
	}
	if d.err() != nil {
		return d.err()
	}
	if _, dup := f.sessions[id]; dup {
		return corrupt("session %q appears twice", id)
	}
	for i, s := range segs {
		if s.clientID != id || rs.sessOf[s] != "" || (i > 0 && segs[i-1].id >= s.id) {
			return corrupt("session %q lists segment %q wrongly (owner %q)", id, s.id, s.clientID)
		}
		rs.sessOf[s] = id
	}
	sess := &session{clientID: id, segments: segs}
	f.sessions[id] = sess
	rs.owners = append(rs.owners, id)
	f.deadlines.Set(id, deadline)
	return nil
}

// objectOwner reads the id of the client that put o. A live client's id is
// its session's string, not a copy per object.
func (rs *restorer) objectOwner(d *dec, o *object, packed bool) error {
	if packed {
		if ref := d.u64(); ref > 0 {
			if ref > uint64(len(rs.owners)) {
				d.Fail("session %d of %d", ref, len(rs.owners))
				return d.err()
			}
			o.clientID = rs.owners[ref-1]
			return nil
		}
	}
	id := d.bytes() // the lookup converts without copying
	if sess := rs.f.sessions[string(id)]; sess != nil {
		if packed {
			return corrupt("object owner %q written out, not as its session (not canonical)", id)
		}
		o.clientID = sess.clientID
	} else {
		o.clientID = string(id)
	}
	return nil
}

// replicas reads a replica list (encodeReplicas) whose buffers all lie in
// their segments, each replica holding size bytes (0: any), and records
// the buffers as used in w; what names the list in an error. With
// scratch, a single replica (and its buffer, if it has one) is decoded
// into w's scratch arrays, which the caller copies out.
func (rs *restorer) replicas(d *dec, what func() string, size uint64, w *objWorker, scratch bool) ([]replica, error) {
	n := d.count(2)
	var reps []replica
	if scratch && n == 1 {
		reps = w.scratch.r[:]
	} else {
		reps = make([]replica, n)
	}
	for i := range reps {
		r := &reps[i]
		r.status = ReplicaStatus(d.u64())
		if nb := d.count(3); scratch && n == 1 && nb == 1 {
			r.buffers = w.scratch.b[:]
		} else {
			r.buffers = make([]buffer, nb)
		}
		var sum uint64
		outside := -1 // the segment of the first buffer not inside it
		for j := range r.buffers {
			b := &r.buffers[j]
			seg := rs.segIndex(d)
			b.offset = d.u64()
			b.length = d.u64()
			sum += b.length
			if d.err() == nil {
				b.seg = rs.segs[seg]
				if outside < 0 && (b.length == 0 || b.offset+b.length < b.offset || b.offset+b.length > rs.segSizes[seg]) {
					outside = seg
				}
				w.addBuf(usedBuf{seg, freeRange{b.offset, b.length}})
			}
		}
		if d.err() != nil {
			return nil, d.err()
		}
		if (r.status != Processing && r.status != Complete) || len(r.buffers) == 0 || (size != 0 && sum != size) {
			return nil, corrupt("%s has a malformed replica", what())
		}
		if outside >= 0 {
			return nil, corrupt("%s has a buffer outside segment %q", what(), rs.segs[outside].id)
		}
	}
	return reps, d.err()
}

// countKey counts key, of the record-th object record, in the key set of
// each segment that its object's buffers, the last n read, lie in.
func (w *objWorker) countKey(key string, n, record int) {
	size := entryLen(len(key))
	for i := len(w.bufs) - 1; n > 0; i-- {
		chunk := w.bufs[i]
		for j := len(chunk) - 1; j >= 0 && n > 0; j, n = j-1, n-1 {
			if c := &w.segKeys[chunk[j].seg]; c.last != record {
				c.keys, c.bytes, c.last = c.keys+1, c.bytes+size, record
			}
		}
	}
}

func (rs *restorer) draining(d *dec) error {
	s := rs.segRef(d)
	until := d.i64()
	if d.err() != nil {
		return d.err()
	}
	if s.draining {
		return corrupt("segment %q is listed as draining twice", s.id)
	}
	s.draining, s.drainUntilMs = true, until
	return nil
}

func (rs *restorer) replacedRec(d *dec) error {
	key := d.str()
	o, ok := rs.f.getObject(key)
	if d.err() == nil && (!ok || !o.processing() || rs.f.replaced[key] != nil) {
		return corrupt("replaced replicas of %q, which is not an upsert in progress", key)
	}
	old, err := rs.replicas(d, func() string { return "replaced replicas of " + strconv.Quote(key) }, 0, rs.workers[0], false)
	if err != nil {
		return err
	}
	if len(old) == 0 {
		return corrupt("replaced replicas of %q: none", key)
	}
	rs.f.replaced[key] = old
	return nil
}

func (rs *restorer) discardRec(d *dec) error {
	release := d.i64()
	reps, err := rs.replicas(d, func() string { return "a discarded write" }, 0, rs.workers[0], false)
	if err != nil {
		return err
	}
	if len(reps) == 0 {
		return corrupt("a discarded write without replicas")
	}
	rs.f.discarded = append(rs.f.discarded, discard{release, reps})
	return nil
}

func (rs *restorer) deferredRec(d *dec) error {
	df := &rs.f.deferral
	if rs.records == 1 {
		if df.direct = d.u64(); d.err() == nil && df.direct == 0 {
			return corrupt("deferred removals with a direct count of 0")
		}
		return d.err()
	}
	r := deferredRemoval{key: d.str(), keySeq: d.u64(), atMs: d.i64(), src: oplog.Source(d.str())}
	if d.err() != nil {
		return d.err()
	}
	if _, dup := df.at[r.key]; dup || r.keySeq == 0 {
		return corrupt("deferred removal of %q recorded twice or with sequence 0", r.key)
	}
	if df.at == nil {
		df.at = map[string]uint64{}
	}
	df.at[r.key] = uint64(len(df.queue))
	df.queue = append(df.queue, r)
	return nil
}

func (rs *restorer) memberRec(d *dec) error {
	id, addr := d.str(), d.str()
	if d.err() != nil {
		return d.err()
	}
	if id == "" || addr == "" {
		return corrupt("a member without an id or an address")
	}
	if _, dup := rs.f.members[id]; dup {
		return corrupt("member %q recorded twice", id)
	}
	if rs.f.members == nil {
		rs.f.members = map[string]string{}
	}
	rs.f.members[id] = addr
	return nil
}

func (rs *restorer) tombstone(d *dec) error {
	t := tombstone{key: d.str(), keySeq: d.u64(), removedAtMs: d.i64()}
	if d.err() != nil {
		return d.err()
	}
	if t.key <= rs.lastTomb && rs.f.tombstones.Len() > 0 {
		return corrupt("tombstones out of order at %q", t.key)
	}
	if _, live := rs.f.getObject(t.key); live || t.keySeq == 0 {
		return corrupt("tombstone for %q conflicts with a live object or has sequence 0", t.key)
	}
	rs.lastTomb = t.key
	rs.f.tombstones.ReplaceOrInsert(t)
	return nil
}

func (rs *restorer) ringEntry(d *dec) error {
	e := oplog.Entry{
		SequenceID:  d.u64(),
		TimestampMs: d.i64(),
		OpType:      oplog.OpType(d.u64()),
		Key:         d.str(),
		Payload:     d.str(),
		Checksum:    uint32(d.u64()),
	}
	e.PrefixHash = uint32(d.u64())
	e.KeySequenceID = d.u64()
	e.Source = oplog.Source(d.str())
	if d.err() != nil {
		return d.err()
	}
	if err := e.Verify(); err != nil {
		return err
	}
	f := rs.f
	if last, ok := f.ring.back(); ok && e.SequenceID != last.seq+1 {
		return corrupt("export ring has a gap before seq %d", e.SequenceID)
	}
	f.ring.push(ringEntry{seq: e.SequenceID, restored: &e})
	return nil
}

// usedBySegment sorts the buffers the workers read by segment (not yet by
// offset): one slice of them all, cut by segment, instead of a slice a
// segment grown one append at a time.
func (rs *restorer) usedBySegment() [][]freeRange {
	start := make([]int, len(rs.segs)+1)
	n := 0
	for _, w := range rs.workers {
		for _, chunk := range w.bufs {
			for _, b := range chunk {
				start[b.seg+1]++
			}
		}
		n += w.nbufs
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	all := make([]freeRange, n)
	next := slices.Clone(start)
	for _, w := range rs.workers {
		for _, chunk := range w.bufs {
			for _, b := range chunk {
				all[next[b.seg]] = b.r
				next[b.seg]++
			}
		}
	}
	used := make([][]freeRange, len(rs.segs))
	for i := range used {
		used[i] = all[start[i]:start[i+1]:start[i+1]]
	}
	return used
}

// keysBySegment sums what the workers counted for each segment's key set.
func (rs *restorer) keysBySegment() []keyCount {
	keys := make([]keyCount, len(rs.segs))
	for _, w := range rs.workers {
		for i, c := range w.segKeys {
			keys[i].keys += c.keys
			keys[i].bytes += c.bytes
		}
	}
	return keys
}

// finish wires segments to their sessions and allocators and checks what
// spans sections.
func (rs *restorer) finish() error {
	if rs.section < 0 {
		return corrupt("no meta record")
	}
	rs.endObjects()
	f := rs.f
	parts := len(rs.workers)
	for i, s := range rs.segs {
		if rs.sessOf[s] == "" {
			return corrupt("segment %q belongs to no session", s.id)
		}
		s.part = i % parts
	}
	used, keys := rs.usedBySegment(), rs.keysBySegment()
	failed := make([]int, parts) // by part, the first segment that failed
	tasks := make([]func(), parts)
	for p := range tasks {
		failed[p] = len(rs.segs)
		tasks[p] = func() {
			if i, ok := rs.buildSegments(p, parts, used, keys); !ok {
				failed[p] = i
			}
		}
	}
	rs.par(tasks...)
	if i := slices.Min(failed); i < len(rs.segs) {
		return corrupt("buffers overlap in segment %q", rs.segs[i].id)
	}
	for _, s := range rs.segs {
		f.segments[s.id] = s
		f.capacity += s.size
		f.used += s.size - s.alloc.free
	}
	f.segOrder = rs.segs
	if last, ok := f.ring.back(); ok && last.seq != f.appliedSeq {
		return corrupt("export ring ends at seq %d but applied seq is %d", last.seq, f.appliedSeq)
	}
	byTime := make([]tombstone, 0, f.tombstones.Len())
	f.tombstones.Ascend(func(t tombstone) bool {
		byTime = append(byTime, t)
		return true
	})
	slices.SortStableFunc(byTime, func(a, b tombstone) int { return cmp.Compare(a.removedAtMs, b.removedAtMs) })
	for _, t := range byTime {
		f.tombQueue.push(t)
	}
	return nil
}

// buildSegments builds the allocators and the key sets of part p of the
// segments (the i-th is in part i mod parts); it stops at the first
// segment whose buffers overlap, which it returns.
func (rs *restorer) buildSegments(p, parts int, used [][]freeRange, keys []keyCount) (int, bool) {
	for i := p; i < len(rs.segs); i += parts {
		s := rs.segs[i]
		slices.SortFunc(used[i], func(a, b freeRange) int { return cmp.Compare(a.off, b.off) })
		a, ok := rebuildAllocator(s.size, used[i])
		if !ok {
			return i, false
		}
		s.alloc = a
		if keys[i].keys > 0 {
			// Made at its final size: filled one insert at a time, the
			// key sets spent more time growing than being filled.
			s.objs = newKeySet(keys[i].keys, keys[i].bytes)
		}
	}
	fill := newKeySetFiller()
	ascendAhead(rs.f.objects, func(it objItem) bool {
		for _, r := range it.obj.replicas {
			for _, b := range r.buffers {
				if b.seg.part == p {
					fill.add(b.seg.objs, it.key)
				}
			}
		}
		return true
	})
	fill.flush()
	return 0, true
}
