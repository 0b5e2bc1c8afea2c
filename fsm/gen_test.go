package fsm

import (
	"fmt"
	"math/rand/v2"

	"github.com/moonraft/moonraft/lease"
)

// chooser is the randomness a command generator draws from: a seeded PRNG
// for the determinism test, the fuzzer's bytes for FuzzApplyStream.
type chooser interface {
	IntN(n int) int
}

// byteChooser turns fuzz input into choices; when it runs dry every choice
// is 0, so any input gives a finite, valid stream.
type byteChooser struct{ b []byte }

func (c *byteChooser) IntN(n int) int {
	if len(c.b) == 0 || n <= 1 {
		return 0
	}
	v := int(c.b[0])
	c.b = c.b[1:]
	if n > 256 && len(c.b) > 0 {
		v = v<<8 | int(c.b[0])
		c.b = c.b[1:]
	}
	return v % n
}

func (c *byteChooser) empty() bool { return len(c.b) == 0 }

// gen produces a random but plausible command stream: a few clients with a
// few segments each, a small key space so puts, reads, removes and
// evictions collide often, a clock that mostly crawls and sometimes jumps
// past lease, client and put-start timeouts, and the occasional Promote with
// other parameters (a small export ring to exercise fail-closed writes).
type gen struct {
	r   chooser
	now int64
}

const (
	genClients = 5
	genKeys    = 200
)

func newGen(r chooser) *gen { return &gen{r: r, now: 1_700_000_000_000} }

func (g *gen) client() string { return fmt.Sprintf("c%d", g.r.IntN(genClients)) }
func (g *gen) key() string {
	return fmt.Sprintf("p%d/k%d", g.r.IntN(4), g.r.IntN(genKeys))
}

func (g *gen) segSpec(client string) SegmentSpec {
	i := g.r.IntN(4)
	s := SegmentSpec{
		ID:   fmt.Sprintf("%s-s%d", client, i),
		Name: fmt.Sprintf("%s-seg%d", client, i),
		Base: uint64(i) << 32,
		Size: uint64(1+g.r.IntN(64)) << 10,
	}
	if i%2 == 1 { // a Mooncake client's segment
		s.Endpoint, s.Protocol = fmt.Sprintf("10.0.0.%d:15000", i), "tcp"
	}
	return s
}

// next returns the next command, looking at f (the state the command will
// be applied to) only to aim at keys and sequence numbers that exist.
func (g *gen) next(f *FSM) Command {
	switch g.r.IntN(10) {
	case 0, 1:
		g.now += int64(g.r.IntN(400))
	case 2:
		g.now += int64(g.r.IntN(20_000))
	case 3:
		if g.r.IntN(50) == 0 {
			g.now += int64(g.r.IntN(700_000))
		}
	}
	now := g.now
	switch op := g.r.IntN(100); {
	case op < 6:
		c := g.client()
		return &MountSegment{NowMs: now, ClientID: c, Segment: g.segSpec(c)}
	case op < 7:
		c := g.client()
		return &UnmountSegment{NowMs: now, ClientID: c, SegmentID: g.segSpec(c).ID}
	case op < 8:
		c := g.client()
		return &GracefulUnmount{NowMs: now, ClientID: c, SegmentID: g.segSpec(c).ID, GraceMs: int64(g.r.IntN(30_000))}
	case op < 9:
		c := g.client()
		return &RemountSegments{NowMs: now, ClientID: c, Segments: []SegmentSpec{g.segSpec(c), g.segSpec(c)}}
	case op < 29:
		return g.putStart(f, now)
	case op < 35:
		// Mostly as leaders of this release propose it; sometimes as an
		// older leader did, refused while leased.
		return &UpsertStart{PutStart: *g.putStart(f, now), Copy: g.r.IntN(4) != 0}
	case op < 55:
		key, client := g.pending(f)
		return &PutEnd{NowMs: now, Key: key, ClientID: client}
	case op < 58:
		key, client := g.pending(f)
		return &PutRevoke{NowMs: now, Key: key, ClientID: client}
	case op < 66:
		return &Remove{NowMs: now, Key: g.key(), Force: g.r.IntN(3) == 0}
	case op < 67:
		return &RemoveByRegex{NowMs: now, Regex: fmt.Sprintf("^p%d/k1", g.r.IntN(4)), Force: g.r.IntN(2) == 0}
	case op < 68:
		return &RemoveAll{NowMs: now, Force: g.r.IntN(2) == 0}
	case op < 70:
		key, client := g.key(), g.client()
		return &Batch{Cmds: []Command{
			&PutStart{NowMs: now, Key: key, SliceLengths: []uint64{uint64(1 + g.r.IntN(4096))}, ReplicaNum: 1, ClientID: client},
			&PutEnd{NowMs: now, Key: key, ClientID: client},
		}}
	case op < 71:
		up := &UpsertStart{PutStart: *g.putStart(f, now), Copy: true}
		return &Batch{Cmds: []Command{
			up,
			&PutEnd{NowMs: now, Key: up.Key, ClientID: up.ClientID},
			&Remove{NowMs: now, Key: g.key(), Force: g.r.IntN(2) == 0},
		}}
	case op < 72:
		return &DrainSegments{NowMs: now}
	case op < 73:
		m := &Member{ID: fmt.Sprintf("n%d", g.r.IntN(4))}
		if g.r.IntN(4) != 0 { // else forget it
			m.GRPCAddr = fmt.Sprintf("10.0.0.%d:7100", g.r.IntN(3))
		}
		return m
	case op < 75:
		return &ReleaseRemovals{NowMs: now, Max: uint64(g.r.IntN(8)), Direct: uint64(1 + g.r.IntN(4))}
	case op < 92:
		t := &Tick{NowMs: now, Evict: f.EvictionDue() || g.r.IntN(8) == 0}
		for i := g.r.IntN(20); i > 0; i-- {
			t.Renewals = append(t.Renewals, lease.Renewal{Key: g.key(), AtMs: now - int64(g.r.IntN(200))})
		}
		for i := g.r.IntN(genClients + 1); i > 0; i-- {
			t.Pings = append(t.Pings, lease.Ping{ClientID: g.client(), AtMs: now - int64(g.r.IntN(200))})
		}
		return t
	case op < 93:
		p := DefaultParams()
		p.LeaseTTLMs = int64(1000 + g.r.IntN(9000))
		p.ClientTTLMs = int64(5000 + g.r.IntN(20000))
		p.HighWatermarkPPM = uint64(500_000 + g.r.IntN(500_001))
		p.EvictionRatioPPM = uint64(10_000 + g.r.IntN(200_000))
		p.AllowEvictSoftPinned = g.r.IntN(2) == 0
		p.ExportRingCap = []uint64{50, 1000, 1_000_000}[g.r.IntN(3)]
		p.KeySeqRetainMs = int64(g.r.IntN(120_000))
		leader := g.r.IntN(3)
		c := &Promote{NowMs: now, LeaderID: fmt.Sprintf("n%d", leader), Term: uint64(g.r.IntN(100)), Params: p}
		if leader > 0 { // serves the Mooncake protocol too
			c.MooncakeAddr = fmt.Sprintf("10.0.0.%d:50051", leader)
		}
		return c
	default:
		seq := f.appliedSeq
		if first, ok := f.ring.front(); ok {
			seq = first.seq - 1 + uint64(g.r.IntN(f.ring.len()+1))
		}
		return &Exported{Seq: seq}
	}
}

// putStart is a PutStart of a random key; for a key that exists, half the
// time with the slices it has, so an upsert of it rewrites in place.
func (g *gen) putStart(f *FSM, now int64) *PutStart {
	key := g.key()
	slices := make([]uint64, 1+g.r.IntN(3))
	for i := range slices {
		slices[i] = uint64(1 + g.r.IntN(8<<10))
	}
	if o, ok := f.getObject(key); ok && g.r.IntN(2) == 0 {
		slices = slices[:0]
		for _, b := range o.replicas[0].buffers {
			slices = append(slices, b.length)
		}
	}
	pref := ""
	if g.r.IntN(4) == 0 {
		pref = g.segSpec(g.client()).Name
	}
	return &PutStart{NowMs: now, Key: key, SliceLengths: slices, ReplicaNum: uint32(1 + g.r.IntN(3)),
		SoftPin: g.r.IntN(3) == 0, PreferredSegment: pref, ClientID: g.client()}
}

// pending picks a PROCESSING object and, mostly, its writer.
func (g *gen) pending(f *FSM) (key, client string) {
	n := f.processing.len()
	if n == 0 || g.r.IntN(10) == 0 {
		return g.key(), g.client()
	}
	key = f.processing.sorted()[g.r.IntN(n)].key
	o, _ := f.getObject(key)
	client = o.clientID
	if g.r.IntN(10) == 0 {
		client = g.client()
	}
	return key, client
}

var _ chooser = (*rand.Rand)(nil)
