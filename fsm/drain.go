package fsm

import (
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// gracefulUnmount is Mooncake's GracefulUnmountSegment: the segment takes
// no new allocation from now on and stays readable; DrainSegments unmounts
// it once no object on it is leased or being written, or GraceMs from now
// at the latest. Asking again while it drains keeps the first deadline.
func (f *FSM) gracefulUnmount(c *GracefulUnmount) Result {
	f.advance(c.NowMs)
	s, err := f.ownedSegment(c.ClientID, c.SegmentID)
	if err != nil {
		return Result{Err: err}
	}
	if c.GraceMs < 0 {
		return failed(errcode.InvalidParams, "grace period is %d ms; it must not be negative", c.GraceMs)
	}
	if !s.draining {
		s.draining = true
		s.drainUntilMs = f.nowMs + c.GraceMs
	}
	return Result{}
}

// Draining reports whether a segment is draining: the leader then proposes
// DrainSegments now and then.
func (f *FSM) Draining() bool {
	for _, s := range f.segOrder {
		if s.draining {
			return true
		}
	}
	return false
}

// drainSegments unmounts the draining segments that are idle or past their
// deadline. It scans every object once, as an unmount does.
func (f *FSM) drainSegments(c *DrainSegments) Result {
	f.advance(c.NowMs)
	if err := f.exportFull(); err != nil {
		return Result{Err: err}
	}
	busy := f.busySegments()
	var done []*segment
	for _, s := range f.segOrder {
		if s.draining && (f.nowMs >= s.drainUntilMs || !busy[s]) {
			done = append(done, s)
		}
	}
	if len(done) == 0 {
		return Result{}
	}
	return Result{Removed: f.dropSegments(done, oplog.SourceUnmountSegment, &bulk{})}
}

// busySegments are the draining segments holding a buffer that a reader
// may read (a leased object) or a writer may write (a PROCESSING object, a
// discarded write, the old replicas of an upsert).
func (f *FSM) busySegments() map[*segment]bool {
	busy := map[*segment]bool{}
	mark := func(rs []replica) {
		for _, r := range rs {
			for _, b := range r.buffers {
				if b.seg.draining {
					busy[b.seg] = true
				}
			}
		}
	}
	f.objects.Ascend(func(it objItem) bool {
		if it.obj.processing() || f.leased(it.obj) {
			mark(it.obj.replicas)
		}
		return true
	})
	for _, old := range f.replaced {
		mark(old)
	}
	for _, d := range f.discarded {
		mark(d.replicas)
	}
	return busy
}

// Segment states, as Mooncake's SegmentStatus (segment.h) numbers them.
const (
	SegmentOK                   = "OK"
	SegmentGracefullyUnmounting = "GRACEFULLY_UNMOUNTING"
)

// SegmentStatus is QuerySegmentStatus's answer.
type SegmentStatus struct {
	SegmentInfo
	State        string // SegmentOK or SegmentGracefullyUnmounting
	DrainUntilMs int64  // while draining: the latest unmount time
	Objects      int    // objects with a buffer on the segment
}

// SegmentStatus looks a segment up by id, or by name when byName is set.
// It counts the segment's objects by scanning them all: an admin query.
func (f *FSM) SegmentStatus(ref string, byName bool) (SegmentStatus, error) {
	s, ok := f.segments[ref]
	if byName {
		s, ok = f.segNames[ref]
	}
	if !ok {
		what := "id"
		if byName {
			what = "name"
		}
		return SegmentStatus{}, errcode.New(errcode.SegmentNotFound, "no segment with %s %q is mounted", what, ref)
	}
	return f.segmentStatuses([]*segment{s})[0], nil
}

// SegmentStatuses describes every mounted segment, by id, in one scan.
func (f *FSM) SegmentStatuses() []SegmentStatus {
	return f.segmentStatuses(f.segOrder)
}

func (f *FSM) segmentStatuses(segs []*segment) []SegmentStatus {
	out := make([]SegmentStatus, len(segs))
	at := make(map[*segment]int, len(segs))
	for i, s := range segs {
		at[s] = i
		out[i] = SegmentStatus{SegmentInfo: segmentInfo(s), State: SegmentOK}
		if s.draining {
			out[i].State, out[i].DrainUntilMs = SegmentGracefullyUnmounting, s.drainUntilMs
		}
	}
	seen := map[*segment]bool{}
	f.objects.Ascend(func(it objItem) bool {
		clear(seen)
		for _, r := range it.obj.replicas {
			for _, b := range r.buffers {
				if i, ok := at[b.seg]; ok && !seen[b.seg] {
					seen[b.seg] = true
					out[i].Objects++
				}
			}
		}
		return true
	})
	return out
}
