package fsm

import (
	"bytes"
	"testing"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/require"
)

// h wraps an FSM for tests: every command goes through Encode and Apply, as
// it would from the Raft log, and invariants are checked after each one.
type h struct {
	t   testing.TB
	f   *FSM
	now int64
}

func newH(t testing.TB) *h {
	return &h{t: t, f: New(), now: 1_000_000}
}

func (x *h) apply(c Command) Result {
	x.t.Helper()
	r := x.f.Apply(Encode(c))
	require.NoError(x.t, x.f.CheckInvariants(), "after %T", c)
	return r
}

func (x *h) ok(c Command) Result {
	x.t.Helper()
	r := x.apply(c)
	require.NoError(x.t, r.Err, "%T", c)
	return r
}

func (x *h) code(want errcode.Code, c Command) {
	x.t.Helper()
	r := x.apply(c)
	require.Equal(x.t, want, r.Code(), "%T: %v", c, r.Err)
}

func (x *h) mount(client, id string, base, size uint64) {
	x.t.Helper()
	x.ok(&MountSegment{NowMs: x.now, ClientID: client, Segment: SegmentSpec{ID: id, Name: "name-" + id, Base: base, Size: size}})
}

func (x *h) putStart(key, client string, sizes ...uint64) Result {
	x.t.Helper()
	return x.apply(&PutStart{NowMs: x.now, Key: key, SliceLengths: sizes, ReplicaNum: 1, ClientID: client})
}

func (x *h) put(key, client string, sizes ...uint64) {
	x.t.Helper()
	require.NoError(x.t, x.putStart(key, client, sizes...).Err)
	x.ok(&PutEnd{NowMs: x.now, Key: key, ClientID: client})
}

func (x *h) tick(renewals ...lease.Renewal) Result {
	x.t.Helper()
	return x.ok(&Tick{NowMs: x.now, Renewals: renewals, Evict: x.f.EvictionDue()})
}

// keepAlive ticks with a ping from client, so long time jumps do not expire
// it, marking the tick to evict when due as the leader does.
func (x *h) keepAlive(client string) Result {
	x.t.Helper()
	return x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: client, AtMs: x.now}}, Evict: x.f.EvictionDue()})
}

func (x *h) exists(key string) bool {
	_, ok := x.f.getObject(key)
	return ok
}

// roundTrip restores a snapshot of f into a fresh FSM.
func roundTrip(t testing.TB, f *FSM) *FSM {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, f.Snapshot().Write(&buf, snapshots.Header{ClusterID: "test"}))
	g := New()
	_, err := g.Restore(&buf)
	require.NoError(t, err)
	require.NoError(t, g.CheckInvariants())
	return g
}

// entries returns f's export ring as the exporter reads it.
func entries(f *FSM) []oplog.Entry { return f.Ring().Entries() }
