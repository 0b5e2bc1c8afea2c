package fsm

import (
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/moonraft/moonraft/internal/btree"
	"github.com/moonraft/moonraft/snapshots"
)

// Parallel runs tasks, possibly at once, and returns once all have run.
// A restore hands it tasks that touch disjoint data, so the state it
// builds is the same however they run; fsm starts no goroutine itself
// (the node passes a Parallel that does).
type Parallel func(tasks ...func())

func inTurn(tasks ...func()) {
	for _, t := range tasks {
		t()
	}
}

// The objects go through in steps of groupBatches batches of objectBatch
// records: a batch is small enough that a task waiting for a CPU holds
// up little of a step, a step long enough that its start and end cost
// nothing beside it.
const (
	objectBatch  = 512
	groupBatches = 32
)

// objWorker is what one of a restore's tasks owns: the buffers of the
// objects it decoded and, by segment, the keys it counted (both merged in
// finish).
type objWorker struct {
	scratch singleObject // the object being decoded
	// bufs is every buffer read, what the allocators are rebuilt from, in
	// chunks of usedChunk (no copying as it grows); segKeys counts, by
	// segment, the keys its key set will hold and their bytes, so that
	// each set is made at its final size.
	bufs    [][]usedBuf
	nbufs   int
	segKeys []keyCount
}

// objBatch is a run of object records. Their keys are read in turn (a
// packed key extends the one before it), the rest decoded by one task,
// the objects added to the tree in turn.
type objBatch struct {
	first int // the section's records before it
	keys  []string
	ends  []int  // where each record's rest ends in data
	data  []byte // each record after its key
	items []objItem
	err   error // the failure that stopped the decoding, at items[len(items)]
}

func (b *objBatch) reset(first int) {
	b.first, b.keys, b.ends, b.data, b.items, b.err = first, b.keys[:0], b.ends[:0], b.data[:0], b.items[:0], nil
}

// objReader reads a section's object records for the batches.
type objReader struct {
	sr      *snapshots.Reader
	section string
	packed  bool
	lastKey string
	read    int // records read
	// name and data are a record read and not taken: the section's first,
	// handed in, or the first of the next section, handed back.
	name string
	data []byte
	have bool
	err  error // io.EOF or the failure that ended the reading
}

func (r *objReader) ended() bool { return r.err != nil || (r.have && r.name != r.section) }

// fill reads up to n records into b, fewer if the section ends.
func (r *objReader) fill(b *objBatch, n int) {
	b.reset(r.read)
	for len(b.keys) < n && !r.ended() {
		if !r.have {
			if r.name, r.data, r.err = r.sr.Next(); r.err != nil {
				return
			}
			r.have = true
			continue
		}
		d := newDec(r.data, "snapshot record", r.section)
		key, err := r.key(&d)
		if err != nil {
			r.err = err
			return
		}
		b.keys = append(b.keys, key)
		b.data = append(b.data, r.data[len(r.data)-d.Remaining():]...)
		b.ends = append(b.ends, len(b.data))
		r.have = false
		r.read++
	}
}

// key reads an object record's key; a packed one (encodePackedObject) in
// its canonical form, sharing the longest prefix with the key before.
func (r *objReader) key(d *dec) (string, error) {
	if !r.packed {
		key := d.str()
		return key, d.err()
	}
	shared, rest := d.u64(), d.bytes()
	if d.err() != nil {
		return "", d.err()
	}
	prev := r.lastKey
	if shared > uint64(len(prev)) || shared < uint64(len(prev)) && len(rest) > 0 && prev[shared] == rest[0] {
		return "", corrupt("object after %q shares %d bytes with it (not canonical)", prev, shared)
	}
	r.lastKey = prev[:shared] + string(rest)
	return r.lastKey, nil
}

// objectSection reads the object section whose first record is name,
// data. Its work goes in steps, each running at once the reading of a
// group of batches, the decoding of the group read the step before, and
// the adding of the group decoded the step before that (runUnits). It
// returns the first record of the next section, or the reader's io.EOF
// or error; a failure is the first in the file's order.
func (rs *restorer) objectSection(sr *snapshots.Reader, name string, data []byte) (string, []byte, error) {
	if err := rs.enter(name); err != nil {
		return "", nil, err
	}
	if name == "objects.v2" && rs.f.objects.Len() > 0 {
		return "", nil, corrupt("objects in both sections objects and objects.v2")
	}
	r := &objReader{sr: sr, section: name, packed: name == "objects.v2", name: name, data: data, have: true}
	rs.objects = btree.NewBuilder(btreeDegree, objLess)
	for _, w := range rs.workers {
		w.segKeys = make([]keyCount, len(rs.segs))
	}
	var groups [3][]*objBatch // reading, decoding, adding
	for g := range groups {
		for range groupBatches {
			groups[g] = append(groups[g], &objBatch{})
		}
	}
	var addErr error
	for {
		reading, decoding, adding := groups[0], groups[1], groups[2]
		var units []func(*objWorker)
		if !r.ended() {
			units = append(units, func(*objWorker) {
				for _, b := range reading {
					r.fill(b, rs.batch)
				}
			})
		}
		if len(adding[0].keys) > 0 {
			units = append(units, func(*objWorker) {
				for _, b := range adding {
					if addErr = rs.addBatch(b); addErr != nil {
						return
					}
				}
			})
		}
		for _, b := range decoding {
			if len(b.keys) > 0 {
				units = append(units, func(w *objWorker) { rs.decodeBatch(b, w, r.section) })
			}
		}
		if len(units) == 0 || addErr != nil {
			break
		}
		rs.runUnits(units)
		for _, b := range adding {
			b.reset(0)
		}
		groups[0], groups[1], groups[2] = adding, reading, decoding
	}
	rs.records = r.read
	if addErr != nil {
		return "", nil, addErr
	}
	if r.err != nil {
		return "", nil, r.err
	}
	return r.name, r.data, nil
}

// runUnits runs units in one task a worker, each task taking the next
// unit until none is left: a task that waits for a CPU holds up the unit
// it has, not a share of the step. The reading and the adding come
// first, being one unit each.
func (rs *restorer) runUnits(units []func(*objWorker)) {
	var next atomic.Int64
	tasks := make([]func(), len(rs.workers))
	for i, w := range rs.workers {
		tasks[i] = func() {
			for u := next.Add(1) - 1; u < int64(len(units)); u = next.Add(1) - 1 {
				units[u](w)
			}
		}
	}
	rs.par(tasks...)
}

// decodeBatch decodes b's records of section with w; only w and b change.
func (rs *restorer) decodeBatch(b *objBatch, w *objWorker, section string) {
	start := 0
	for i, key := range b.keys {
		d := newDec(b.data[start:b.ends[i]], "snapshot record", section)
		start = b.ends[i]
		o, err := rs.object(&d, key, section == "objects.v2", w, b.first+i+1)
		if err == nil {
			err = d.done()
		}
		if err != nil {
			b.err = err
			return
		}
		b.items = append(b.items, objItem{key, o})
	}
}

// addBatch adds b's objects to the tree, in the order of the file.
func (rs *restorer) addBatch(b *objBatch) error {
	for _, it := range b.items {
		// Stored as storeObject stores one, the tree built without a
		// search per object, which takes objects in key order only; the
		// segments' key sets are built in finish.
		if !rs.objects.Add(it) {
			return corrupt("objects out of order at %q", it.key)
		}
		if it.obj.processing() {
			rs.f.processing.set(it.key, it.obj)
		}
	}
	return b.err
}

// object decodes the rest of an object record, the record-th of its
// section, after its key: laid out as PutEnd lays a single object out,
// or with its own replica list. It reads the state the sections before
// built and changes only w.
func (rs *restorer) object(d *dec, key string, packed bool, w *objWorker, record int) (*object, error) {
	o := &w.scratch.o
	*o = object{}
	o.size = d.u64()
	if err := rs.objectOwner(d, o, packed); err != nil {
		return nil, err
	}
	o.putStartMs = d.i64()
	o.leaseMs = d.i64()
	o.softPin = d.bool()
	o.softPinMs = d.i64()
	o.keySeq = d.u64()
	var err error
	first := w.nbufs
	if o.replicas, err = rs.replicas(d, func() string { return "object " + strconv.Quote(key) }, o.size, w, true); err != nil {
		return nil, err
	}
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if len(o.replicas) == 0 || len(o.replicas) > MaxReplicas {
		return nil, corrupt("object %q has %d replicas", key, len(o.replicas))
	}
	w.countKey(key, w.nbufs-first, record)
	if o.single() {
		o = o.laidOut(o.replicas[0].status)
	} else {
		c := *o
		c.replicas = slices.Clone(o.replicas)
		o = &c
	}
	o.gen = rs.f.gen
	return o, nil
}

// endObjects makes the objects read so far the state's tree: at the end
// of the objects section, before a later section looks objects up.
func (rs *restorer) endObjects() {
	if rs.objects != nil {
		rs.f.objects = rs.objects.Tree()
		rs.objects = nil
	}
}

func isObjects(section string) bool { return section == "objects" || section == "objects.v2" }
