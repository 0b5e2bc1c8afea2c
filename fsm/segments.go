package fsm

import (
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
)

func validateSegment(s *SegmentSpec) error {
	if err := validateID("segment id", s.ID); err != nil {
		return err
	}
	if s.Name == "" || len(s.Name) > maxSegmentName || !utf8.ValidString(s.Name) {
		return errcode.New(errcode.InvalidParams, "segment %q: name must be 1..%d bytes of UTF-8", s.ID, maxSegmentName)
	}
	if s.Size == 0 {
		return errcode.New(errcode.InvalidParams, "segment %q: size is zero", s.ID)
	}
	if s.Base+s.Size < s.Base {
		return errcode.New(errcode.InvalidParams, "segment %q: base %#x + size %d overflows the address space", s.ID, s.Base, s.Size)
	}
	if len(s.Endpoint) > MaxIDLen || len(s.Protocol) > MaxIDLen || !utf8.ValidString(s.Endpoint) || !utf8.ValidString(s.Protocol) {
		return errcode.New(errcode.InvalidParams, "segment %q: endpoint and protocol must be at most %d bytes of UTF-8", s.ID, MaxIDLen)
	}
	return nil
}

func overlaps(a, b *SegmentSpec) bool {
	return a.Base < b.Base+b.Size && b.Base < a.Base+a.Size
}

func (s *segment) spec() SegmentSpec {
	return SegmentSpec{ID: s.id, Name: s.name, Base: s.base, Size: s.size, Endpoint: s.endpoint, Protocol: s.protocol}
}

// checkMount reports whether client may mount spec: a new segment whose id
// and name are free and whose range does not overlap the client's other
// segments (they share one address space), or exactly the segment it already
// mounted. others are segments of the same request not yet mounted.
func (f *FSM) checkMount(clientID string, spec *SegmentSpec, others []SegmentSpec) (exists bool, err error) {
	if err := validateSegment(spec); err != nil {
		return false, err
	}
	if s, ok := f.segments[spec.ID]; ok {
		if s.clientID != clientID || s.spec() != *spec {
			return false, errcode.New(errcode.SegmentAlreadyExists,
				"segment %q is already mounted by client %q with a different name, range or endpoint", spec.ID, s.clientID)
		}
		return true, nil
	}
	if s, ok := f.segNames[spec.Name]; ok {
		return false, errcode.New(errcode.SegmentAlreadyExists, "segment name %q is already used by segment %q", spec.Name, s.id)
	}
	if sess, ok := f.sessions[clientID]; ok {
		for _, s := range sess.segments {
			if sp := s.spec(); overlaps(&sp, spec) {
				return false, errcode.New(errcode.InvalidParams,
					"segment %q [%#x, %#x) overlaps segment %q of the same client", spec.ID, spec.Base, spec.Base+spec.Size, s.id)
			}
		}
	}
	for i := range others {
		o := &others[i]
		if o.ID == spec.ID || o.Name == spec.Name || overlaps(o, spec) {
			return false, errcode.New(errcode.InvalidParams, "segments %q and %q of one request collide (id, name or range)", o.ID, spec.ID)
		}
	}
	return false, nil
}

// touchSession creates the client's session or extends it, as a ping would.
func (f *FSM) touchSession(clientID string) *session {
	s, ok := f.sessions[clientID]
	if !ok {
		s = &session{clientID: clientID}
		f.sessions[clientID] = s
		f.sessionChanged(clientID, true)
	}
	d, _ := f.deadlines.Deadline(clientID)
	f.deadlines.Set(clientID, lease.Extend(d, f.nowMs, f.params.ClientTTLMs))
	return s
}

func (f *FSM) addSegment(sess *session, spec SegmentSpec) {
	s := &segment{id: spec.ID, name: spec.Name, clientID: sess.clientID, base: spec.Base, size: spec.Size,
		endpoint: spec.Endpoint, protocol: spec.Protocol, alloc: newAllocator(spec.Size)}
	f.insertSegment(sess, s)
}

func cmpSegment(a, b *segment) int { return strings.Compare(a.id, b.id) }

func (f *FSM) insertSegment(sess *session, s *segment) {
	f.segments[s.id] = s
	f.segNames[s.name] = s
	i, _ := slices.BinarySearchFunc(f.segOrder, s, cmpSegment)
	f.segOrder = slices.Insert(f.segOrder, i, s)
	j, _ := slices.BinarySearchFunc(sess.segments, s, cmpSegment)
	sess.segments = slices.Insert(sess.segments, j, s)
	f.capacity += s.size
	f.used += s.size - s.alloc.free
}

func (f *FSM) mountSegment(c *MountSegment) Result {
	f.advance(c.NowMs)
	if err := validateID("client id", c.ClientID); err != nil {
		return Result{Err: err}
	}
	exists, err := f.checkMount(c.ClientID, &c.Segment, nil)
	if err != nil {
		return Result{Err: err}
	}
	sess := f.touchSession(c.ClientID)
	if !exists {
		f.addSegment(sess, c.Segment)
	}
	return Result{}
}

// remountSegments re-registers every segment a client holds after it was
// told NEED_REMOUNT; all or nothing.
func (f *FSM) remountSegments(c *RemountSegments) Result {
	f.advance(c.NowMs)
	if err := validateID("client id", c.ClientID); err != nil {
		return Result{Err: err}
	}
	fresh := make([]SegmentSpec, 0, len(c.Segments))
	for i := range c.Segments {
		exists, err := f.checkMount(c.ClientID, &c.Segments[i], fresh)
		if err != nil {
			return Result{Err: err}
		}
		if !exists {
			fresh = append(fresh, c.Segments[i])
		}
	}
	sess := f.touchSession(c.ClientID)
	for _, spec := range fresh {
		f.addSegment(sess, spec)
	}
	return Result{}
}

// ownedSegment finds segment id mounted by clientID.
func (f *FSM) ownedSegment(clientID, id string) (*segment, error) {
	s, ok := f.segments[id]
	if !ok {
		return nil, errcode.New(errcode.SegmentNotFound, "segment %q is not mounted", id)
	}
	if s.clientID != clientID {
		return nil, errcode.New(errcode.IllegalClient, "segment %q belongs to client %q, not %q", id, s.clientID, clientID)
	}
	return s, nil
}

func (f *FSM) unmountSegment(c *UnmountSegment) Result {
	f.advance(c.NowMs)
	s, err := f.ownedSegment(c.ClientID, c.SegmentID)
	if err != nil {
		return Result{Err: err}
	}
	if err := f.exportFull(); err != nil {
		return Result{Err: err}
	}
	return Result{Removed: f.dropSegments([]*segment{s}, oplog.SourceUnmountSegment, &bulk{})}
}

// dropSegments unmounts segs: replicas with a buffer on one of them go, and
// objects left without replicas are removed and exported with src, as part
// of bulk removal b. It visits the objects on segs only (segment.objs).
func (f *FSM) dropSegments(segs []*segment, src oplog.Source, b *bulk) (removed uint64) {
	gone := make(map[*segment]bool, len(segs))
	for _, s := range segs {
		gone[s] = true
	}
	type change struct {
		key string
		obj *object
	}
	var changes []change
	// Each segment's object index names what to visit, in key order for
	// a deterministic order of REMOVEs.
	keys := map[string]struct{}{}
	for _, s := range segs {
		for k := range s.objs.all() {
			keys[k] = struct{}{}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		o, _ := f.getObject(k)
		changes = append(changes, change{k, o})
	}
	for _, ch := range changes {
		var keep, lost []replica
		for _, r := range ch.obj.replicas {
			if slices.ContainsFunc(r.buffers, func(buf buffer) bool { return gone[buf.seg] }) {
				lost = append(lost, r)
			} else {
				keep = append(keep, r)
			}
		}
		if len(keep) == 0 {
			f.dropObjectIn(ch.key, ch.obj, oplog.OpRemove, src, b)
			removed++
			continue
		}
		f.freeBuffers(lost)
		n := *ch.obj
		n.replicas = keep
		f.putObject(ch.key, &n)
	}
	f.dropHeldOn(gone)
	for _, s := range segs {
		f.capacity -= s.size
		delete(f.segments, s.id)
		delete(f.segNames, s.name)
		i, _ := slices.BinarySearchFunc(f.segOrder, s, cmpSegment)
		f.segOrder = slices.Delete(f.segOrder, i, i+1)
		if sess, ok := f.sessions[s.clientID]; ok {
			j, _ := slices.BinarySearchFunc(sess.segments, s, cmpSegment)
			sess.segments = slices.Delete(sess.segments, j, j+1)
		}
	}
	return removed
}
