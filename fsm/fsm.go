// Package fsm is moonraft's replicated state: segments and their allocators,
// objects, client sessions, the key sequence map, the export ring and the
// bulk removals' deferred REMOVEs, with Apply for every command of the log
// (docs/ARCHITECTURE.md).
//
// The state is a pure function of the command stream: no clock (time comes
// in commands as NowMs and only moves forward), no randomness, no goroutines,
// no I/O besides the snapshot streams. Two FSMs fed the same commands have
// equal Digests; that is how followers are proven exact copies.
//
// An FSM is not safe for concurrent use: the caller serialises Apply and
// guards reads with a lock. Objects are copy-on-write (a mutation replaces
// the object rather than editing it) so a Snapshot taken under the lock can
// be written out while Apply goes on.
package fsm

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/internal/btree"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
)

// ReplicaStatus is Mooncake's replica state.
type ReplicaStatus uint8

// Replica states.
const (
	Processing ReplicaStatus = 1
	Complete   ReplicaStatus = 2
)

func (s ReplicaStatus) String() string {
	if s == Complete {
		return "COMPLETE"
	}
	return "PROCESSING"
}

type segment struct {
	id, name, clientID string
	base, size         uint64
	endpoint, protocol string // the transfer engine's, for Mooncake clients
	alloc              *allocator
	// draining: a graceful unmount is under way; no new allocations, and
	// DrainSegments unmounts it once idle or at drainUntilMs.
	draining     bool
	drainUntilMs int64
	// objs holds the keys of the objects with a buffer here, derived and
	// kept by putObject and forget: an unmount visits them, not every
	// object (nil until the first).
	objs *keySet
	part int // the part of a restore's finish that built objs
}

type buffer struct {
	seg            *segment
	offset, length uint64
}

type replica struct {
	status  ReplicaStatus
	buffers []buffer
}

// object is immutable once stored — mutations store a modified copy — with
// one exception: a renewal may extend the lease of an object made since
// the last Snapshot (gen == FSM.gen), which no snapshot shares.
//
// gen and softPin share a word: a single object (laidOut) is then 144
// bytes, a size class of Go's allocator, instead of 160.
type object struct {
	gen        uint32
	softPin    bool
	size       uint64
	clientID   string
	putStartMs int64
	leaseMs    int64
	softPinMs  int64
	keySeq     uint64 // key_sequence_id of the last OpLog entry of this key
	replicas   []replica
}

type objItem struct {
	key string
	obj *object
}

type discard struct {
	releaseMs int64
	replicas  []replica
}

type procItem struct {
	putStartMs int64
	key        string
}

type tombstone struct {
	key         string
	keySeq      uint64
	removedAtMs int64
}

type session struct {
	clientID string
	segments []*segment // sorted by id
}

// FSM is the replicated state machine.
type FSM struct {
	params       Params
	nowMs        int64
	appliedSeq   uint64
	leaseFloorMs int64 // Promote's lease for every object, without touching each
	needSpace    bool
	// expiryBounded: a Tick with ExpireMax has been applied, so sessions
	// past their deadline may wait several ticks for their expiry; their
	// segments take no new buffers meanwhile (open). Set by the first
	// bounded tick, which an older node halts at, so every node that
	// applies what follows knows the rule.
	expiryBounded      bool
	leaderID           string
	leaderAddr         string
	leaderMooncakeAddr string // "" when the leader serves no Mooncake protocol
	term               uint64
	// members: member id -> client (gRPC) address (Member commands).
	members map[string]string
	// gen counts Snapshots: objects of an older gen may be shared with one.
	// It wraps after 2^32 of them, 136 years at one a second, and an object
	// untouched all that time would then pass for unshared.
	gen uint32

	segments map[string]*segment
	segNames map[string]*segment
	segOrder []*segment // by id: the domain of segment choice
	capacity uint64
	used     uint64

	sessions  map[string]*session
	deadlines *lease.DeadlineHeap

	objects    *btree.BTreeG[objItem]
	tombstones *btree.BTreeG[tombstone]
	ring       fifo[ringEntry]
	deferral   deferral // bulk removals' REMOVEs waiting for the ring (deferred.go)
	// replaced holds the old replicas of a size-changing upsert in
	// progress, released at its UpsertEnd (or when the write goes).
	replaced map[string][]replica
	// discarded holds the buffers of writes an upsert preempted: their
	// writer may still be writing, so they return to the allocator only at
	// releaseMs (Mooncake's discarded_replicas_).
	discarded []discard

	// Derived indexes, rebuilt on restore and not part of the digest.
	// byKey (nil unless the leader's index is built, keyindex.go) finds an
	// object in one hash probe where the tree takes ~17 string
	// comparisons, each a cache miss; keyBuild is an index being built.
	byKey      map[string]*object
	keyBuild   *KeyIndexBuild
	processing procIndex
	tombQueue  fifo[tombstone] // in removal order: removedAtMs never decreases
	// trackSessions: session changes are recorded in sessionChanges for
	// TakeSessionChanges (sessionlog.go).
	trackSessions  bool
	sessionChanges []SessionChange
}

// New returns an empty state with the default parameters.
func New() *FSM {
	return &FSM{
		params:     DefaultParams(),
		segments:   map[string]*segment{},
		segNames:   map[string]*segment{},
		sessions:   map[string]*session{},
		deadlines:  lease.NewDeadlineHeap(),
		objects:    btree.NewG(btreeDegree, objLess),
		tombstones: btree.NewG(btreeDegree, func(a, b tombstone) bool { return a.key < b.key }),
		replaced:   map[string][]replica{},
		processing: newProcIndex(),
	}
}

// Result is what Apply returns: Err carries a Mooncake code for a rejected
// command, the other fields what a successful one produced.
type Result struct {
	Err      error
	Replicas []oplog.ReplicaDesc // PutStart: where to write
	Removed  uint64              // objects removed by Remove*, Unmount and Tick
	Evicted  uint64              // Tick: objects evicted
	Released uint64              // ReleaseRemovals: REMOVEs moved into the export ring
	Batch    []Result            // Batch: one result per command
}

// Code is the Mooncake code of the result (OK on success).
func (r Result) Code() errcode.Code { return errcode.Of(r.Err) }

func failed(code errcode.Code, format string, args ...any) Result {
	return Result{Err: errcode.New(code, format, args...)}
}

// Apply decodes and applies one log entry. It never panics on bad input: a
// corrupted entry or an unknown type comes back as an error result and the
// state is unchanged.
func (f *FSM) Apply(entry []byte) Result {
	c, err := Decode(entry)
	if err != nil {
		return Result{Err: err}
	}
	if c == nil {
		return Result{}
	}
	return f.ApplyCommand(c)
}

// ApplyCommand applies a decoded command.
func (f *FSM) ApplyCommand(c Command) Result {
	if d := &commands[c.Type()]; d.apply != nil {
		return d.apply(f, c)
	}
	return failed(errcode.InvalidParams, "command of type %T is not applicable", c)
}

// batch applies each command as if it were its own log entry.
func (f *FSM) batch(c *Batch) Result {
	out := make([]Result, len(c.Cmds))
	for i, cmd := range c.Cmds {
		if !Batchable(cmd) {
			out[i] = failed(errcode.InvalidParams, "%T cannot be batched", cmd)
			continue
		}
		out[i] = f.ApplyCommand(cmd)
	}
	return Result{Batch: out}
}

// advance moves command time forward; it never goes back, so a leader with
// a slower clock than its predecessor cannot shorten a lease.
func (f *FSM) advance(nowMs int64) {
	if nowMs > f.nowMs {
		f.nowMs = nowMs
	}
}

// exportFull reports whether client writes must be refused: the ring holds
// its bound of entries etcd has not acknowledged (fail closed).
func (f *FSM) exportFull() error {
	if f.params.ExportRingCap > 0 && uint64(f.ring.len()) >= f.params.ExportRingCap {
		return errcode.New(errcode.EtcdOperationError,
			"%d OpLog entries are waiting for etcd (the bound is %d): etcd is unreachable or takes them slower than they come; writes are refused until the export catches up (moonraft_export_ring_entries)",
			f.ring.len(), f.params.ExportRingCap)
	}
	return nil
}

func (f *FSM) getObject(key string) (*object, bool) {
	it, ok := f.findObject(key)
	return it.obj, ok
}

// putObject stores o, which must not be stored yet (a new object or a
// modified copy): it is of this snapshot generation.
func (f *FSM) putObject(key string, o *object) {
	old, had := f.storeObject(key, o)
	if !had || !sameSegments(old.obj, o) {
		if had {
			unindexSegments(key, old.obj)
		}
		indexSegments(key, o)
	}
}

// storeObject is putObject without the segments' key sets, which a restore
// builds at once when it has every object (restorer.finish).
func objLess(a, b objItem) bool { return a.key < b.key }

func (f *FSM) storeObject(key string, o *object) (old objItem, had bool) {
	o.gen = f.gen
	old, had = f.objects.ReplaceOrInsert(objItem{key, o})
	f.indexKey(key, objItem{key, o})
	if o.processing() {
		f.processing.set(key, o)
	} else {
		f.processing.remove(key)
	}
	return old, had
}

// indexSegments adds key to the object index of every segment o has a
// buffer on; unindexSegments takes it out.
func indexSegments(key string, o *object) {
	for _, r := range o.replicas {
		for _, b := range r.buffers {
			if b.seg.objs == nil {
				b.seg.objs = newKeySet(0, 0)
			}
			b.seg.objs.add(key)
		}
	}
}

func unindexSegments(key string, o *object) {
	for _, r := range o.replicas {
		for _, b := range r.buffers {
			b.seg.objs.remove(key)
		}
	}
}

// sameSegments: a and b have their buffers on the same segments, in the
// same order (a PutEnd's COMPLETE copy, a new lease), so the segments'
// indexes need no change.
func sameSegments(a, b *object) bool {
	if len(a.replicas) != len(b.replicas) {
		return false
	}
	for i := range a.replicas {
		ab, bb := a.replicas[i].buffers, b.replicas[i].buffers
		if len(ab) != len(bb) {
			return false
		}
		for j := range ab {
			if ab[j].seg != bb[j].seg {
				return false
			}
		}
	}
	return true
}

// leased reports whether o's read lease (or Promote's floor) still holds.
func (f *FSM) leased(o *object) bool {
	return lease.Active(f.effectiveLease(o), f.nowMs)
}

func (f *FSM) effectiveLease(o *object) int64 {
	return max(o.leaseMs, f.leaseFloorMs)
}

func (o *object) complete() bool {
	for i := range o.replicas {
		if o.replicas[i].status != Complete {
			return false
		}
	}
	return len(o.replicas) > 0
}

func (o *object) processing() bool {
	for i := range o.replicas {
		if o.replicas[i].status == Processing {
			return true
		}
	}
	return false
}

func (f *FSM) freeBuffers(rs []replica) {
	for i := range rs {
		for _, b := range rs[i].buffers {
			b.seg.alloc.release(b.offset, b.length)
			f.used -= b.length
		}
	}
}

// freeAll frees bufs as freeBuffers does, in segment and offset order and
// with neighbours merged first: a bulk removal's buffers freed one at a
// time, in the order their objects went, were each an update of an
// allocator's trees at a random place, most of an eviction's time.
func (f *FSM) freeAll(bufs []buffer) {
	slices.SortFunc(bufs, func(a, b buffer) int {
		if a.seg != b.seg {
			return strings.Compare(a.seg.id, b.seg.id)
		}
		return cmp.Compare(a.offset, b.offset)
	})
	for i := 0; i < len(bufs); {
		run := bufs[i]
		for i++; i < len(bufs) && bufs[i].seg == run.seg && bufs[i].offset == run.offset+run.length; i++ {
			run.length += bufs[i].length
		}
		run.seg.alloc.release(run.offset, run.length)
		f.used -= run.length
	}
}

// dropObject removes key. With op != 0 it exports the removal and bumps the
// key's sequence; the key's sequence survives in a tombstone either way.
func (f *FSM) dropObject(key string, o *object, op oplog.OpType, src oplog.Source) {
	f.dropObjectIn(key, o, op, src, nil)
}

// dropObjectIn is dropObject as part of bulk removal b (nil: none), whose
// REMOVE may be deferred (deferred.go).
func (f *FSM) dropObjectIn(key string, o *object, op oplog.OpType, src oplog.Source, b *bulk) {
	if b != nil && b.collect {
		for _, r := range o.replicas {
			b.freed = append(b.freed, r.buffers...)
		}
	} else {
		f.freeBuffers(o.replicas)
	}
	f.releaseReplaced(key, o.leaseMs)
	f.forget(key)
	seq := o.keySeq
	if op != 0 {
		seq++
		if op == oplog.OpRemove && b.defers(f) {
			f.deferRemove(key, seq, src)
		} else {
			f.emit(op, key, nil, seq, src)
		}
	}
	f.bury(key, seq)
}

// bury keeps a removed key's sequence so a later entry for the same key
// continues it (seed 004 §8); Tick forgets it after KeySeqRetainMs.
func (f *FSM) bury(key string, seq uint64) {
	if seq == 0 {
		return
	}
	t := tombstone{key, seq, f.nowMs}
	f.tombstones.ReplaceOrInsert(t)
	f.tombQueue.push(t)
}

// unbury takes the tombstone of a re-created key (keySeq 0 if none); its
// queue entry stays behind and is skipped at expiry.
func (f *FSM) unbury(key string) tombstone {
	t, _ := f.tombstones.Delete(tombstone{key: key})
	return t
}

func (f *FSM) expireTombstones() {
	for {
		q, ok := f.tombQueue.front()
		if !ok || q.removedAtMs+f.params.KeySeqRetainMs > f.nowMs {
			return
		}
		f.tombQueue.drop(1)
		// The key may have been re-created and removed again since; only
		// the tombstone this queue entry stands for is forgotten. One
		// whose REMOVE still waits is kept: its export buries it anew.
		if _, waiting := f.deferral.at[q.key]; waiting {
			continue
		}
		if t, ok := f.tombstones.Get(tombstone{key: q.key}); ok && t == q {
			f.tombstones.Delete(t)
		}
	}
}

// member records (or, with no address, forgets) a member's client address.
func (f *FSM) member(c *Member) Result {
	if c.ID == "" {
		return failed(errcode.InvalidParams, "a member needs an id")
	}
	if c.GRPCAddr == "" {
		delete(f.members, c.ID)
		return Result{}
	}
	if f.members == nil {
		f.members = map[string]string{}
	}
	f.members[c.ID] = c.GRPCAddr
	return Result{}
}

// MemberAddrs returns the client address of every member that recorded one.
func (f *FSM) MemberAddrs() map[string]string {
	return maps.Clone(f.members)
}
