package fsm

import (
	"cmp"
	"slices"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
)

// Reads are plain functions of the state. A read that grants a lease does
// not change the state: it returns the Grant, and the leader batches the
// renewal into the next Tick so every node applies it.

// Grant is the read lease a read hands out.
type Grant struct {
	Renewal   lease.Renewal // to record in the leader's batcher
	CurrentMs int64         // the lease deadline the key holds now
	UntilMs   int64         // the deadline the client may rely on
	SoftPin   bool          // the object is soft-pinned
}

func (f *FSM) grant(key string, o *object, nowMs int64) Grant {
	cur := f.effectiveLease(o)
	return Grant{
		Renewal:   lease.Renewal{Key: key, AtMs: nowMs},
		CurrentMs: cur,
		UntilMs:   lease.Extend(cur, nowMs, f.params.LeaseTTLMs),
		SoftPin:   o.softPin,
	}
}

// KeyRead is the answer of a read of one key.
type KeyRead struct {
	Replicas []oplog.ReplicaDesc // GetReplicaList: the complete replicas
	Found    bool                // a complete object was found, and leased
	Grant    Grant               // the lease granted, when Found
	Err      error               // GetReplicaList: why nothing was found; ExistKey: a bad key
}

// GetReplicaList returns the COMPLETE replicas of key and the lease the read
// grants, as of the leader's clock nowMs.
func (f *FSM) GetReplicaList(key string, nowMs int64) KeyRead {
	it, err := f.lookup(key)
	if err == nil && !it.obj.complete() {
		err = notReady(it)
	}
	if err != nil {
		return KeyRead{Err: err}
	}
	return KeyRead{Replicas: it.obj.descriptors(), Found: true, Grant: f.grant(it.key, it.obj, nowMs)}
}

// lookup finds key's object, or says why a read of key finds none.
func (f *FSM) lookup(key string) (objItem, error) {
	if err := validateKey(key); err != nil {
		return objItem{}, err
	}
	it, ok := f.findObject(key)
	if !ok {
		return objItem{}, errcode.New(errcode.ObjectNotFound, "key %q not found", key)
	}
	return it, nil
}

// notReady is why a read of an object still being written finds nothing.
func notReady(it objItem) error {
	return errcode.New(errcode.ReplicaIsNotReady, "key %q is still being written", it.key)
}

// GetReplicaLists is GetReplicaList of every key, keys[i] into out[i], for
// less per key: the descriptors of one-buffer objects share one
// allocation, and every key is looked up before any object is read, so
// that the objects' cache misses, each independent of the others, overlap.
func (f *FSM) GetReplicaLists(keys []string, nowMs int64, out []KeyRead) {
	if len(keys) == 1 {
		out[0] = f.GetReplicaList(keys[0], nowMs)
		return
	}
	var onStack [128]objItem // a batch up to master_bench's default looks up without allocating
	found := onStack[:min(len(keys), len(onStack))]
	if len(keys) > len(onStack) {
		found = make([]objItem, len(keys))
	}
	for i, k := range keys {
		it, err := f.lookup(k)
		if err != nil {
			out[i] = KeyRead{Err: err}
			continue
		}
		found[i] = it
	}
	singles := 0
	for i, it := range found {
		switch {
		case it.obj == nil:
		case !it.obj.complete():
			out[i] = KeyRead{Err: notReady(it)}
			found[i].obj = nil
		case it.obj.single():
			singles++
		}
	}
	slab := make([]singleDesc, singles)
	for i, it := range found {
		if it.obj == nil {
			continue
		}
		var rs []oplog.ReplicaDesc
		if it.obj.single() {
			rs = it.obj.singleDesc(&slab[0])
			slab = slab[1:]
		} else {
			rs = it.obj.descriptors()
		}
		out[i] = KeyRead{Replicas: rs, Found: true, Grant: f.grant(it.key, it.obj, nowMs)}
	}
}

// ExistKey reports whether key exists and is complete; if so it grants a
// lease like GetReplicaList (Mooncake renews on ExistKey too).
func (f *FSM) ExistKey(key string, nowMs int64) KeyRead {
	if err := validateKey(key); err != nil {
		return KeyRead{Err: err}
	}
	it, ok := f.findObject(key)
	if !ok || !it.obj.complete() {
		return KeyRead{}
	}
	return KeyRead{Found: true, Grant: f.grant(it.key, it.obj, nowMs)}
}

// ExistKeys is ExistKey of every key, keys[i] into out[i].
func (f *FSM) ExistKeys(keys []string, nowMs int64, out []KeyRead) {
	for i, k := range keys {
		out[i] = f.ExistKey(k, nowMs)
	}
}

// KeyReplicas is one object found by GetReplicaListByRegex.
type KeyReplicas struct {
	Key      string
	Replicas []oplog.ReplicaDesc
	Grant    Grant
}

// GetReplicaListByRegex returns every complete object whose key matches, in
// key order, each with the lease the read grants.
func (f *FSM) GetReplicaListByRegex(expr string, nowMs int64) ([]KeyReplicas, error) {
	re, err := compileRegex(expr)
	if err != nil {
		return nil, err
	}
	var out []KeyReplicas
	f.objects.Ascend(func(it objItem) bool {
		if it.obj.complete() && re.MatchString(it.key) {
			out = append(out, KeyReplicas{it.key, it.obj.descriptors(), f.grant(it.key, it.obj, nowMs)})
		}
		return true
	})
	return out, nil
}

// HasSession reports whether client has a live session (a Ping from a client
// without one is answered NEED_REMOUNT).
func (f *FSM) HasSession(clientID string) bool {
	_, ok := f.sessions[clientID]
	return ok
}

// Stats summarises the state for status and metrics.
type Stats struct {
	NowMs         int64
	AppliedSeq    uint64
	Segments      int
	Sessions      int
	Objects       int
	Processing    int
	UsedBytes     uint64
	CapacityBytes uint64
	RingLen       int
	LeaderID      string // the leader that last promoted itself
	LeaderAddr    string // its client address
	// LeaderMooncakeAddr is its Mooncake-protocol address ("" if none).
	LeaderMooncakeAddr string
	Term               uint64
	// KeyIndex: the key index covers every object (the leader's, once
	// filled after its promotion; docs/STATE_MACHINE.md).
	KeyIndex bool
}

// AppliedSeq is the sequence id of the last OpLog entry produced.
func (f *FSM) AppliedSeq() uint64 { return f.appliedSeq }

// Stats returns counters of the state.
func (f *FSM) Stats() Stats {
	return Stats{
		NowMs:              f.nowMs,
		AppliedSeq:         f.appliedSeq,
		Segments:           len(f.segments),
		Sessions:           len(f.sessions),
		Objects:            f.objects.Len(),
		Processing:         f.processing.len(),
		UsedBytes:          f.used,
		CapacityBytes:      f.capacity,
		RingLen:            f.ring.len(),
		LeaderID:           f.leaderID,
		LeaderAddr:         f.leaderAddr,
		LeaderMooncakeAddr: f.leaderMooncakeAddr,
		Term:               f.term,
		KeyIndex:           f.byKey != nil,
	}
}

// SegmentInfo describes one mounted segment and how much of it live
// buffers take.
type SegmentInfo struct {
	ID, Name, ClientID string
	Base, Size         uint64
	Endpoint, Protocol string // a Mooncake client's transfer engine
	Used               uint64 // bytes allocated to buffers (PROCESSING or COMPLETE)
}

// Segments lists the mounted segments by id (for per-segment metrics).
func (f *FSM) Segments() []SegmentInfo {
	out := make([]SegmentInfo, 0, len(f.segOrder))
	for _, s := range f.segOrder {
		out = append(out, segmentInfo(s))
	}
	return out
}

func segmentInfo(s *segment) SegmentInfo {
	return SegmentInfo{ID: s.id, Name: s.name, ClientID: s.clientID, Base: s.base, Size: s.size,
		Endpoint: s.endpoint, Protocol: s.protocol, Used: s.size - s.alloc.free}
}

// Params returns the parameters in force.
func (f *FSM) Params() Params { return f.params }

// eachExported calls fn for every object complete in the OpLog's view, in
// key order: the complete ones, and a resizing upsert's old value, which
// the OpLog still has, intact, until the upsert's PUT_END. Over the live
// trees, like Digest: it writes nothing, so the read lock does.
func (f *FSM) eachExported(fn func(key string, keySeq, size uint64, replicas []replica)) {
	f.view(f.objects, f.tombstones).eachExported(fn)
}

// eachExported is FSM.eachExported as the snapshot captured it.
func (s *Snapshot) eachExported(fn func(key string, keySeq, size uint64, replicas []replica)) {
	ascendAhead(s.objects, func(it objItem) bool {
		o := it.obj
		if o.complete() {
			fn(it.key, o.keySeq, o.size, o.replicas)
		} else if i, ok := slices.BinarySearchFunc(s.replaced, it.key, func(r replacedRec, k string) int { return cmp.Compare(r.key, k) }); ok {
			old := s.replaced[i].replicas
			var size uint64 // each replica holds all of it
			for _, b := range old[0].buffers {
				size += b.length
			}
			fn(it.key, o.keySeq, size, old)
		}
		return true
	})
}

// ObjectSetDigest hashes the complete objects as an etcd follower knows
// them — key, size and the key_sequence_id of their PUT_END — so a follower
// can prove it holds the leader's object set (oplog.ObjectSetHasher).
func (f *FSM) ObjectSetDigest() [32]byte { return f.view(f.objects, f.tombstones).ObjectSetDigest() }

// ObjectSetDigest is FSM.ObjectSetDigest as the snapshot captured it; like
// Digest, it needs no lock.
func (s *Snapshot) ObjectSetDigest() [32]byte {
	h := oplog.NewObjectSetHasher()
	s.eachExported(func(key string, keySeq, size uint64, _ []replica) { h.Add(key, size, keySeq) })
	return h.Sum()
}

// Lease returns key's read-lease and soft-pin deadlines (soft pin 0 when the
// object is not soft-pinned), for the lease_renewals/ export; ok is false
// when key holds no object (the renewal batcher forgets such keys).
func (f *FSM) Lease(key string) (leaseMs, softPinMs int64, ok bool) {
	o, ok := f.getObject(key)
	if !ok {
		return 0, 0, false
	}
	if o.softPin {
		softPinMs = o.softPinMs
	}
	return f.effectiveLease(o), softPinMs, true
}

// EachComplete calls fn for every object complete in the OpLog's view
// (eachExported) with what an etcd follower knows of it: size,
// key_sequence_id and the PUT_END payload. It seeds a follower from a
// snapshot file.
func (f *FSM) EachComplete(fn func(key string, keySeq uint64, p oplog.PutEndPayload)) {
	f.eachExported(func(key string, keySeq, size uint64, replicas []replica) {
		o := object{replicas: replicas}
		fn(key, keySeq, oplog.PutEndPayload{Size: size, Replicas: o.descriptors()})
	})
}
