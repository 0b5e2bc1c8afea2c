package fsm

import "github.com/moonraft/moonraft/oplog"

// ringEntry is an OpLog entry as the export ring keeps it. A PUT_END made
// here keeps its object (objects are never changed once in the tree) and
// builds its payload and checksum only when read: every node keeps the
// ring, but only the leader's exporter and snapshots read it.
type ringEntry struct {
	seq, keySeq uint64
	tsMs        int64
	op          oplog.OpType
	src         oplog.Source
	key         string
	obj         *object      // a PUT_END made here: the payload is built from it
	restored    *oplog.Entry // an entry restored from a snapshot, as it was
}

func (r *ringEntry) entry() oplog.Entry {
	if r.restored != nil {
		return *r.restored
	}
	var payload string
	if r.obj != nil {
		payload = oplog.EncodePutEndPayload(oplog.PutEndPayload{Size: r.obj.size, Replicas: r.obj.descriptors()})
	}
	return oplog.NewEntry(r.seq, r.tsMs, r.op, r.key, payload, r.keySeq, r.src)
}

// Pending is a run of OpLog entries not yet exported, oldest first. It
// shares the ring's memory, so it is cheap to take under the state's lock;
// Entries builds the entries and can run outside it.
type Pending struct {
	runs [][]ringEntry
	n    int
}

func pendingOf(runs [][]ringEntry) Pending {
	p := Pending{runs: runs}
	for _, r := range runs {
		p.n += len(r)
	}
	return p
}

// Len is the number of entries.
func (p Pending) Len() int { return p.n }

// OldestMs is the command time of the oldest entry; ok is false for none.
func (p Pending) OldestMs() (ms int64, ok bool) {
	if p.n == 0 {
		return 0, false
	}
	return p.runs[0][0].tsMs, true
}

// Entries returns the entries, newly built.
func (p Pending) Entries() []oplog.Entry {
	out := make([]oplog.Entry, 0, p.n)
	for _, run := range p.runs {
		for i := range run {
			out = append(out, run[i].entry())
		}
	}
	return out
}

// Ring returns the OpLog entries not yet acknowledged as exported.
func (f *FSM) Ring() Pending { return pendingOf(f.ring.view(0, f.ring.len())) }

// RingAfter returns up to max ring entries with seq > after.
func (f *FSM) RingAfter(after uint64, max int) Pending {
	first, ok := f.ring.front()
	if !ok {
		return Pending{}
	}
	skip := 0
	if after >= first.seq {
		skip = int(after - first.seq + 1)
	}
	if skip >= f.ring.len() {
		return Pending{}
	}
	return pendingOf(f.ring.view(skip, max))
}

// emit produces the next OpLog entry for key; a PUT_END's payload comes
// from obj. A REMOVE of key still deferred goes first.
func (f *FSM) emit(op oplog.OpType, key string, obj *object, keySeq uint64, src oplog.Source) {
	f.flushDeferred(key)
	f.appliedSeq++
	if f.params.ExportRingCap > 0 {
		f.ring.push(ringEntry{seq: f.appliedSeq, keySeq: keySeq, tsMs: f.nowMs, op: op, src: src, key: key, obj: obj})
	}
}
