package fsm

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
	"github.com/stretchr/testify/require"
)

// TestLeaseInvariant runs a long random stream and checks the lease
// invariant at the state-machine level: once a Tick has applied a read
// lease renewal for a key, no unforced removal and no eviction removes that
// key before the lease it promised has ended.
func TestLeaseInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 2))
	g := newGen(rng)
	f := New()
	promised := map[string]int64{}
	checked := 0
	for i := 0; i < 60_000; i++ {
		cmd := g.next(f)
		if tk, ok := cmd.(*Tick); ok {
			for _, r := range tk.Renewals {
				if o, ok := f.getObject(r.Key); ok && o.complete() {
					promised[r.Key] = max(promised[r.Key], r.AtMs+f.params.LeaseTTLMs)
				}
			}
		}
		forced := forcedRemoval(cmd)
		seq := f.appliedSeq
		f.Apply(Encode(cmd))
		for _, e := range entries(f) {
			if e.SequenceID <= seq || e.OpType != oplog.OpRemove {
				continue
			}
			switch e.Source {
			case oplog.SourceEvict, oplog.SourceRemove, oplog.SourceRemoveByRegex, oplog.SourceRemoveAll:
				if e.Source == oplog.SourceEvict || !forced {
					checked++
					require.LessOrEqual(t, promised[e.Key], e.TimestampMs,
						"command %d: %s removed %q at %d inside a lease promised until %d", i, e.Source, e.Key, e.TimestampMs, promised[e.Key])
				}
			}
			delete(promised, e.Key)
		}
	}
	require.Greater(t, checked, 1000, "the stream must remove leased-then-expired keys often")
}

// forcedRemoval reports whether cmd is a removal that ignores leases.
func forcedRemoval(cmd Command) bool {
	switch c := cmd.(type) {
	case *Remove:
		return c.Force
	case *RemoveByRegex:
		return c.Force
	case *RemoveAll:
		return c.Force
	}
	return false
}

// TestLeasedBuffersStayPut runs a long random stream and checks the rule
// behind copy-on-write upserts (issue 42): a buffer a read lease covers is
// neither rewritten (a PROCESSING replica on it) nor freed nor given to
// another object until the lease ends, whatever upserts, removals and
// evictions come meanwhile. Only a forced removal or the segment going
// (an unmount, an expiry) takes it earlier. The promotion's lease floor
// covers every complete object.
func TestLeasedBuffersStayPut(t *testing.T) {
	type promise struct {
		key   string
		r     replica // its buffers: a replica that lost one to a gone segment is gone whole
		until int64
	}
	type owner struct {
		key      string
		b        buffer
		complete bool
		held     bool // an upsert's old replicas, or discarded ones
	}
	g := newGen(rand.New(rand.NewPCG(4, 2)))
	f := New()
	var promised []promise
	promise1 := func(key string, o *object, until int64) {
		for _, r := range o.replicas {
			promised = append(promised, promise{key, r, until})
		}
	}
	checked, held := 0, 0
	var next []Command // upserts of a key just leased, ahead of the stream
	for i := 0; i < 60_000; i++ {
		var cmd Command
		if len(next) > 0 {
			cmd, next = next[0], next[1:]
		} else {
			cmd = g.next(f)
		}
		forced := forcedRemoval(cmd)
		f.Apply(Encode(cmd))
		switch c := cmd.(type) {
		case *Tick:
			for _, r := range c.Renewals {
				if o, ok := f.getObject(r.Key); ok && o.complete() {
					promise1(r.Key, o, r.AtMs+f.params.LeaseTTLMs)
					if len(next) == 0 && i%2 == 0 {
						up := &UpsertStart{PutStart: PutStart{NowMs: f.nowMs, Key: r.Key, SliceLengths: []uint64{o.size}, ReplicaNum: 1, ClientID: o.clientID}, Copy: true}
						next = append(next, up)
						if i%4 == 0 { // else left to the stream: revoked, taken over, reclaimed
							next = append(next, &PutEnd{NowMs: f.nowMs, Key: r.Key, ClientID: o.clientID})
						}
					}
				}
			}
		case *Promote:
			f.objects.Ascend(func(it objItem) bool {
				if it.obj.complete() {
					promise1(it.key, it.obj, f.leaseFloorMs)
				}
				return true
			})
		}
		if forced { // its REMOVEs may wait past the command (deferred.go): look at the keys
			promised = slices.DeleteFunc(promised, func(p promise) bool {
				_, ok := f.getObject(p.key)
				return !ok
			})
		}
		promised = slices.DeleteFunc(promised, func(p promise) bool {
			return !lease.Active(p.until, f.nowMs) || slices.ContainsFunc(p.r.buffers, func(b buffer) bool { return f.segments[b.seg.id] != b.seg })
		})
		if len(promised) == 0 {
			continue
		}
		owners := map[*segment][]owner{}
		add := func(key string, rs []replica, held bool) {
			for _, r := range rs {
				for _, b := range r.buffers {
					owners[b.seg] = append(owners[b.seg], owner{key, b, r.status == Complete, held})
				}
			}
		}
		f.objects.Ascend(func(it objItem) bool {
			add(it.key, it.obj.replicas, false)
			return true
		})
		for key, rs := range f.replaced {
			add(key, rs, true)
		}
		for _, d := range f.discarded {
			add("", d.replicas, true)
		}
		for _, p := range promised {
			for _, pb := range p.r.buffers {
				found := false
				for _, o := range owners[pb.seg] {
					if o.b.offset >= pb.offset+pb.length || pb.offset >= o.b.offset+o.b.length {
						continue
					}
					found = true
					require.True(t, o.held || (o.key == p.key && o.complete && o.b == pb),
						"command %d (%T): [%d,+%d) on %s, leased to a reader of %q until %d (now %d), is now %q's (complete %v)",
						i, cmd, pb.offset, pb.length, pb.seg.id, p.key, p.until, f.nowMs, o.key, o.complete)
					if o.held {
						held++
					}
				}
				require.True(t, found, "command %d (%T): [%d,+%d) on %s, leased to a reader of %q until %d (now %d), was freed",
					i, cmd, pb.offset, pb.length, pb.seg.id, p.key, p.until, f.nowMs)
				checked++
			}
		}
	}
	require.Greater(t, checked, 10_000, "the stream must hold leases often")
	require.Greater(t, held, 1_000, "the stream must copy leased objects often")
}
