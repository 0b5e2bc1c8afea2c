package fsm

import (
	"regexp"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
)

func validatePutStart(c *PutStart) (total uint64, err error) {
	if err := validateKey(c.Key); err != nil {
		return 0, err
	}
	if err := validateID("client id", c.ClientID); err != nil {
		return 0, err
	}
	if c.ReplicaNum < 1 || c.ReplicaNum > MaxReplicas {
		return 0, errcode.New(errcode.InvalidParams, "replica_num is %d, it must be 1..%d", c.ReplicaNum, MaxReplicas)
	}
	if len(c.SliceLengths) == 0 || len(c.SliceLengths) > MaxSlices {
		return 0, errcode.New(errcode.InvalidParams, "%d slices, an object has 1..%d", len(c.SliceLengths), MaxSlices)
	}
	if len(c.PreferredSegment) > maxSegmentName {
		return 0, errcode.New(errcode.InvalidParams, "preferred segment name is over %d bytes", maxSegmentName)
	}
	for i, l := range c.SliceLengths {
		if l == 0 {
			return 0, errcode.New(errcode.InvalidParams, "slice %d has size 0: sizes must be positive", i)
		}
		if total+l < total {
			return 0, errcode.New(errcode.InvalidParams, "slice sizes overflow 64 bits")
		}
		total += l
	}
	return total, nil
}

func (f *FSM) putStart(c *PutStart) Result {
	f.advance(c.NowMs)
	total, err := validatePutStart(c)
	if err != nil {
		return Result{Err: err}
	}
	if err := f.exportFull(); err != nil {
		return Result{Err: err}
	}
	if o, ok := f.getObject(c.Key); ok {
		// A PROCESSING object older than the discard timeout is taken to be
		// abandoned by its writer and may be replaced (Mooncake's rule).
		if !o.processing() || o.putStartMs+f.params.PutStartDiscardMs > f.nowMs {
			return failed(errcode.ObjectAlreadyExists, "key %q already exists", c.Key)
		}
		f.takeOver(c.Key, o, false)
	}
	tomb := f.unbury(c.Key)
	keySeq := tomb.keySeq
	replicas, ok := f.allocate(c, keySeq)
	if !ok {
		if keySeq != 0 {
			f.tombstones.ReplaceOrInsert(tomb) // as it was, so it expires on time
		}
		f.needSpace = true
		return failed(errcode.NoAvailableHandle,
			"no room for %d replica(s) of %d bytes in %d segment(s); eviction will run at the next tick",
			c.ReplicaNum, total, len(f.segOrder))
	}
	o := &object{size: total, clientID: f.sharedClientID(c.ClientID), putStartMs: f.nowMs, leaseMs: f.nowMs, softPin: c.SoftPin, keySeq: keySeq, replicas: replicas}
	f.putObject(c.Key, o)
	return Result{Replicas: o.descriptors()}
}

// sharedClientID returns the session's copy of id when there is one, so
// objects share one string per client.
func (f *FSM) sharedClientID(id string) string {
	if s, ok := f.sessions[id]; ok {
		return s.clientID
	}
	return id
}

// allocate places c.ReplicaNum replicas of c's slices. The segment order is
// a pure function of the key, its sequence and the mounted segments, so it
// spreads keys over segments without randomness; each replica starts one
// segment further on, and replicas avoid each other's segments while they
// can. The preferred segment, if mounted, takes the first replica.
func (f *FSM) allocate(c *PutStart, keySeq uint64) ([]replica, bool) {
	n := len(f.segOrder)
	if n == 0 {
		return nil, false
	}
	start := int((fnv64a(c.Key) + keySeq) % uint64(n))
	preferred := f.segNames[c.PreferredSegment]

	nr, ns := int(c.ReplicaNum), len(c.SliceLengths)
	bufs := make([]buffer, 0, nr*ns)
	replicas := make([]replica, nr)
	used := make(map[*segment]bool, nr)
	for r := range replicas {
		first := len(bufs)
		for _, l := range c.SliceLengths {
			s := f.chooseSegment(l, start+r, used, preferred, r == 0)
			if s == nil {
				f.freeBuffers([]replica{{buffers: bufs}})
				return nil, false
			}
			off, _ := s.alloc.alloc(l)
			f.used += l
			bufs = append(bufs, buffer{s, off, l})
		}
		replicas[r] = replica{status: Processing, buffers: bufs[first:len(bufs):len(bufs)]}
		for _, b := range replicas[r].buffers {
			used[b.seg] = true
		}
	}
	return replicas, true
}

// chooseSegment picks the segment for one slice: the preferred one if asked
// and it has room, else the first with room in rotation order from start,
// first among segments no other replica uses, then among all.
func (f *FSM) chooseSegment(size uint64, start int, avoid map[*segment]bool, preferred *segment, usePreferred bool) *segment {
	if usePreferred && preferred != nil && f.open(preferred) && preferred.alloc.largest() >= size {
		return preferred
	}
	n := len(f.segOrder)
	for pass := 0; pass < 2; pass++ {
		for i := 0; i < n; i++ {
			s := f.segOrder[(start+i)%n]
			if (pass == 1 || !avoid[s]) && f.open(s) && s.alloc.largest() >= size {
				return s
			}
		}
	}
	return nil
}

// open reports whether s takes new buffers: not while it drains, nor, once
// expiry is bounded (expiryBounded), while its session is past its deadline
// and waits for a tick to expire it, which would only remove the new
// object with the segment (RELIABILITY finding 24).
func (f *FSM) open(s *segment) bool {
	if s.draining {
		return false
	}
	if !f.expiryBounded {
		return true
	}
	d, ok := f.deadlines.Deadline(s.clientID)
	return !ok || lease.Active(d, f.nowMs)
}

// fnv64a is FNV-1a, inline because hash/fnv puts a hasher on the heap.
func fnv64a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

func (b buffer) desc() oplog.BufferDesc {
	return oplog.BufferDesc{SegmentID: b.seg.id, SegmentName: b.seg.name, Address: b.seg.base + b.offset, Size: b.length,
		Endpoint: b.seg.endpoint, Protocol: b.seg.protocol}
}

// singleDesc is the descriptor of a single object, in one allocation.
type singleDesc struct {
	r [1]oplog.ReplicaDesc
	b [1]oplog.BufferDesc
}

// singleDesc fills d with single o's descriptor.
func (o *object) singleDesc(d *singleDesc) []oplog.ReplicaDesc {
	r := &o.replicas[0]
	d.b[0] = r.buffers[0].desc()
	d.r[0] = oplog.ReplicaDesc{Status: r.status.String(), Buffers: d.b[:]}
	return d.r[:]
}

func (o *object) descriptors() []oplog.ReplicaDesc {
	if o.single() {
		return o.singleDesc(new(singleDesc)) // one allocation instead of two, on every read
	}
	out := make([]oplog.ReplicaDesc, len(o.replicas))
	for i, r := range o.replicas {
		bs := make([]oplog.BufferDesc, len(r.buffers))
		for j, b := range r.buffers {
			bs[j] = b.desc()
		}
		out[i] = oplog.ReplicaDesc{Status: r.status.String(), Buffers: bs}
	}
	return out
}

// lookupOwned finds key for a PutEnd/PutRevoke by clientID.
func (f *FSM) lookupOwned(key, clientID string) (*object, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if err := f.exportFull(); err != nil {
		return nil, err
	}
	o, ok := f.processing.get(key) // a PutEnd's usual case, without a tree descent
	if !ok {
		o, ok = f.getObject(key)
	}
	if !ok {
		return nil, errcode.New(errcode.ObjectNotFound, "key %q not found", key)
	}
	if o.clientID != clientID {
		return nil, errcode.New(errcode.IllegalClient, "key %q is being written by client %q, not %q", key, o.clientID, clientID)
	}
	return o, nil
}

func (f *FSM) putEnd(c *PutEnd) Result {
	f.advance(c.NowMs)
	o, err := f.lookupOwned(c.Key, c.ClientID)
	if err != nil {
		return Result{Err: err}
	}
	if !o.processing() {
		return Result{} // a retried PutEnd: already complete
	}
	n := o.withStatus(Complete)
	n.leaseMs = max(n.leaseMs, f.nowMs)
	if n.softPin {
		n.softPinMs = f.nowMs + f.params.SoftPinTTLMs
	}
	n.keySeq++
	f.putObject(c.Key, n)
	f.releaseReplaced(c.Key, o.leaseMs)
	f.emit(oplog.OpPutEnd, c.Key, n, n.keySeq, oplog.SourceNone)
	return Result{}
}

// withStatus returns a copy of o whose replicas, on the same buffers, all
// have status.
func (o *object) withStatus(status ReplicaStatus) *object {
	if o.single() {
		return o.laidOut(status)
	}
	n := new(object)
	*n = *o
	n.replicas = restatus(o.replicas, status)
	return n
}

// restatus returns copies of rs, on the same buffers, with status.
func restatus(rs []replica, status ReplicaStatus) []replica {
	out := make([]replica, len(rs))
	for i, r := range rs {
		out[i] = replica{status: status, buffers: r.buffers}
	}
	return out
}

// single reports whether o has one replica of one buffer, as nearly every
// object has.
func (o *object) single() bool {
	return len(o.replicas) == 1 && len(o.replicas[0].buffers) == 1
}

// singleObject is an object with its one replica of one buffer.
type singleObject struct {
	o object
	r [1]replica
	b [1]buffer
}

// laidOut returns a copy of a single o (its replica with status) in one
// allocation with its replica and buffer: a read of it then touches
// neighbouring memory, not three allocations, each a cache miss in a
// large state.
func (o *object) laidOut(status ReplicaStatus) *object {
	one := new(singleObject)
	one.o = *o
	one.b[0] = o.replicas[0].buffers[0]
	one.r[0] = replica{status: status, buffers: one.b[:]}
	one.o.replicas = one.r[:]
	return &one.o
}

func (f *FSM) putRevoke(c *PutRevoke) Result {
	f.advance(c.NowMs)
	o, err := f.lookupOwned(c.Key, c.ClientID)
	if err != nil {
		return Result{Err: err}
	}
	if !o.processing() {
		return failed(errcode.InvalidWrite, "key %q is complete: a finished put cannot be revoked, remove it instead", c.Key)
	}
	f.dropObject(c.Key, o, oplog.OpPutRevoke, oplog.SourceNone)
	return Result{Removed: 1}
}

func (f *FSM) remove(c *Remove) Result {
	f.advance(c.NowMs)
	if err := validateKey(c.Key); err != nil {
		return Result{Err: err}
	}
	if err := f.exportFull(); err != nil {
		return Result{Err: err}
	}
	o, ok := f.getObject(c.Key)
	if !ok {
		return failed(errcode.ObjectNotFound, "key %q not found", c.Key)
	}
	if !o.complete() {
		return failed(errcode.ReplicaIsNotReady, "key %q is still being written", c.Key)
	}
	if !c.Force && f.leased(o) {
		return failed(errcode.ObjectHasLease, "key %q is leased to a reader until %d ms (now %d); retry later or force",
			c.Key, f.effectiveLease(o), f.nowMs)
	}
	f.dropObject(c.Key, o, oplog.OpRemove, oplog.SourceRemove)
	return Result{Removed: 1}
}

func compileRegex(expr string) (*regexp.Regexp, error) {
	if len(expr) > MaxRegexLen {
		return nil, errcode.New(errcode.InvalidParams, "regex is %d bytes, the limit is %d", len(expr), MaxRegexLen)
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "regex does not compile: %v", err)
	}
	return re, nil
}

func (f *FSM) removeByRegex(c *RemoveByRegex) Result {
	f.advance(c.NowMs)
	re, err := compileRegex(c.Regex)
	if err != nil {
		return Result{Err: err}
	}
	return f.removeMatching(re.MatchString, c.Force, oplog.SourceRemoveByRegex)
}

func (f *FSM) removeAll(c *RemoveAll) Result {
	f.advance(c.NowMs)
	return f.removeMatching(func(string) bool { return true }, c.Force, oplog.SourceRemoveAll)
}

// removeMatching removes complete objects whose key matches, leaving leased
// ones unless forced and PROCESSING ones always.
func (f *FSM) removeMatching(match func(string) bool, force bool, src oplog.Source) Result {
	if err := f.exportFull(); err != nil {
		return Result{Err: err}
	}
	var victims []objItem
	f.objects.Ascend(func(it objItem) bool {
		if match(it.key) && it.obj.complete() && (force || !f.leased(it.obj)) {
			victims = append(victims, it)
		}
		return true
	})
	b := &bulk{collect: true, freed: make([]buffer, 0, len(victims))}
	for _, it := range victims {
		f.dropObjectIn(it.key, it.obj, oplog.OpRemove, src, b)
	}
	f.freeAll(b.freed)
	return Result{Removed: uint64(len(victims))}
}
