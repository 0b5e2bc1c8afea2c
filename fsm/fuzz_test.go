package fsm

import (
	"bytes"
	"testing"

	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/require"
)

func commandSeeds() [][]byte {
	return [][]byte{
		Encode(&MountSegment{NowMs: 1, ClientID: "c", Segment: SegmentSpec{ID: "s", Name: "n", Base: 0, Size: 1 << 20}}),
		Encode(&PutStart{NowMs: 2, Key: "k", SliceLengths: []uint64{10, 20}, ReplicaNum: 2, SoftPin: true, ClientID: "c"}),
		Encode(&PutEnd{NowMs: 3, Key: "k", ClientID: "c"}),
		Encode(&Tick{NowMs: 4, Renewals: []lease.Renewal{{Key: "k", AtMs: 4}}, Pings: []lease.Ping{{ClientID: "c", AtMs: 4}}, Evict: true}),
		Encode(&Tick{NowMs: 4, ExpireMax: 3}),
		Encode(&Promote{NowMs: 5, LeaderID: "n1", Term: 2, Params: DefaultParams()}),
		Encode(&Promote{NowMs: 5, LeaderID: "n1", Term: 2, Params: DefaultParams(), MooncakeAddr: "m:1", SessionGraceMs: 10_000}),
		Encode(&RemountSegments{NowMs: 6, ClientID: "c", Segments: []SegmentSpec{{ID: "s", Name: "n", Size: 1}}}),
		Encode(&RemoveByRegex{NowMs: 7, Regex: "^k", Force: true}),
		Encode(&Exported{Seq: 1}),
		Encode(&UpsertStart{PutStart: PutStart{NowMs: 8, Key: "k", SliceLengths: []uint64{10}, ReplicaNum: 1, ClientID: "c"}, Copy: true}),
		Encode(&Batch{Cmds: []Command{&PutStart{NowMs: 8, Key: "b", SliceLengths: []uint64{1}, ReplicaNum: 1, ClientID: "c"}, &PutEnd{NowMs: 8, Key: "b", ClientID: "c"}}}),
		{0x80 | 42, 1, 2},
		{},
	}
}

// FuzzDecodeCommand: the decoder never panics on any bytes, and whatever it
// accepts re-encodes to a command that decodes the same.
func FuzzDecodeCommand(f *testing.F) {
	for _, s := range commandSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Decode(b)
		if err != nil || c == nil {
			return
		}
		again, err := Decode(Encode(c))
		require.NoError(t, err)
		require.Equal(t, c, again)
	})
}

// FuzzApplyStream turns the fuzzer's bytes into a command stream (through
// the same generator as the determinism test) and applies it to two FSMs:
// invariants hold after every command, the FSMs agree, and a snapshot of
// the result restores to the same digest.
func FuzzApplyStream(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 3, 1, 2, 0, 30, 4, 0, 0, 40, 1, 1, 0, 0, 60})
	f.Add(bytes.Repeat([]byte{7, 31, 200, 3, 90, 11, 5}, 40))
	f.Fuzz(func(t *testing.T, b []byte) {
		src := &byteChooser{b: b}
		g := newGen(src)
		x, y := New(), New()
		for i := 0; i < 500 && (i == 0 || !src.empty()); i++ {
			e := Encode(g.next(x))
			require.Equal(t, x.Apply(e), y.Apply(e))
			require.NoError(t, x.CheckInvariants())
		}
		require.Equal(t, x.Digest(), y.Digest())
		var buf bytes.Buffer
		require.NoError(t, x.Snapshot().Write(&buf, snapshots.Header{}))
		z := New()
		_, err := z.Restore(&buf)
		require.NoError(t, err)
		require.Equal(t, x.Digest(), z.Digest())
	})
}

// FuzzRestore: any bytes given to Restore either restore a state that holds
// every invariant, or are refused with the old state untouched; never a
// panic. A restore in parallel, in batches of two records, does the same.
func FuzzRestore(f *testing.F) {
	x := newH(f)
	x.mount("c1", "s1", 0, 1000)
	x.put("a", "c1", 10, 5)
	x.put("gone", "c1", 3)
	x.ok(&Remove{NowMs: x.now, Key: "gone", Force: true})
	require.NoError(f, x.putStart("b", "c1", 7).Err)
	var buf bytes.Buffer
	require.NoError(f, x.f.Snapshot().Write(&buf, snapshots.Header{ClusterID: "c"}))
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:buf.Len()/2])
	f.Fuzz(func(t *testing.T, b []byte) {
		s := New()
		before := s.Digest()
		_, err := s.Restore(bytes.NewReader(b))
		p := New()
		_, perr := p.restore(bytes.NewReader(b), 3, inGoroutines, 2)
		require.Equal(t, err, perr, "in parallel")
		if err != nil {
			require.Equal(t, before, s.Digest())
			return
		}
		require.NoError(t, s.CheckInvariants())
		require.Equal(t, s.Digest(), p.Digest(), "in parallel")
	})
}
