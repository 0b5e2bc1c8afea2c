package fsm

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"

	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/require"
)

// TestDeterminism feeds the same seeded stream of 100,000 commands to two
// FSMs, and from the middle on to a third restored from a snapshot of the
// first. The second and third keep the leader's key index (IndexKeys); the
// second drops it every 200 commands and builds it again as a new leader
// does (StartKeyIndex, Build, FinishKeyIndex), with commands applied
// between each step, so that commands meet a build in progress. Every 997 commands the
// second is snapshotted, and the snapshot written 300 commands later (as
// Raft persists one while applies go on) must restore to the state of its
// moment. At every
// checkpoint all of them have equal digests, equal OpLog output and hold
// every invariant, the index matching the object tree among them. The stream must exercise every command
// with both outcomes, or the test proves little: that is checked too.
func TestDeterminism(t *testing.T) {
	const (
		total      = 100_000
		checkEvery = 5_000
		restoreAt  = 50_000
	)
	rng := rand.New(rand.NewPCG(20261121, 1))
	g := newGen(rng)
	a, b := New(), New()
	build := b.StartKeyIndex()
	var c *FSM
	var outA, outB, outC []oplog.Entry
	collect := func(f *FSM, out *[]oplog.Entry, seqBefore uint64) {
		for _, e := range entries(f) {
			if e.SequenceID > seqBefore {
				*out = append(*out, e)
			}
		}
	}
	type outcome struct{ ok, failed int }
	seen := map[CmdType]*outcome{}
	var evicted, removed uint64
	var (
		pendSnap   *Snapshot // b's, taken at pendAt, not yet written
		pendDigest [32]byte
		pendAt     int
	)
	partial := 0 // commands applied to b with its key index being built
	for i := 1; i <= total; i++ {
		cmd := g.next(a)
		entry := Encode(cmd)
		seqA, seqB := a.appliedSeq, b.appliedSeq
		ra := a.Apply(entry)
		if b.keyBuild != nil {
			partial++
		}
		rb := b.Apply(entry)
		switch i % 200 {
		case 50:
			require.NoError(t, build.Build(context.Background()))
		case 120:
			require.True(t, b.FinishKeyIndex(build))
		}
		if i%997 == 0 && pendSnap == nil {
			pendSnap, pendDigest, pendAt = b.Snapshot(), a.Digest(), i
		}
		if pendSnap != nil && i == pendAt+300 {
			var buf bytes.Buffer
			require.NoError(t, pendSnap.Write(&buf, snapshots.Header{RaftIndex: uint64(pendAt)}))
			d := New()
			_, err := d.Restore(&buf)
			require.NoError(t, err)
			require.Equal(t, pendDigest, d.Digest(), "snapshot taken at %d, written at %d", pendAt, i)
			pendSnap = nil
		}
		require.Equal(t, ra, rb, "command %d (%T): results differ", i, cmd)
		collect(a, &outA, seqA)
		collect(b, &outB, seqB)
		if c != nil {
			seqC := c.appliedSeq
			require.Equal(t, ra, c.Apply(entry), "command %d: restored FSM differs", i)
			collect(c, &outC, seqC)
		}
		if i%200 == 0 {
			require.NoError(t, b.CheckInvariants(), "command %d", i)
			b.IndexKeys(false)
			build = b.StartKeyIndex()
		}
		o := seen[cmd.Type()]
		if o == nil {
			o = &outcome{}
			seen[cmd.Type()] = o
		}
		if ra.Err == nil {
			o.ok++
		} else {
			o.failed++
		}
		evicted += ra.Evicted
		removed += ra.Removed
		if i == restoreAt {
			var buf bytes.Buffer
			require.NoError(t, a.Snapshot().Write(&buf, snapshots.Header{RaftIndex: uint64(i)}))
			c = New()
			h, err := c.Restore(&buf)
			require.NoError(t, err)
			require.Equal(t, a.appliedSeq, h.AppliedSeq)
			c.IndexKeys(true)
			require.Len(t, c.byKey, c.objects.Len(), "the index of a restored state is built")
			outC = append([]oplog.Entry(nil), outA...)
		}
		if i%checkEvery == 0 {
			require.NoError(t, a.CheckInvariants(), "command %d", i)
			require.NoError(t, b.CheckInvariants(), "command %d", i)
			da := a.Digest()
			require.Equal(t, da, b.Digest(), "digest at command %d", i)
			require.Equal(t, outA, outB, "OpLog output at command %d", i)
			if c != nil {
				require.NoError(t, c.CheckInvariants())
				require.Equal(t, da, c.Digest(), "restored digest at command %d", i)
				require.Equal(t, outA, outC, "restored OpLog output at command %d", i)
			}
		}
	}
	for _, typ := range []CmdType{CmdMountSegment, CmdUnmountSegment, CmdRemountSegments, CmdPutStart, CmdPutEnd,
		CmdPutRevoke, CmdRemove, CmdRemoveByRegex, CmdRemoveAll, CmdTick, CmdPromote, CmdExported, CmdBatch,
		CmdUpsertStart, CmdUpsertStartCopy, CmdGracefulUnmount, CmdDrainSegments, CmdMember} {
		o := seen[typ]
		require.NotNil(t, o, "%v never generated", typ)
		require.Positive(t, o.ok, "%v never succeeded", typ)
	}
	for _, typ := range []CmdType{CmdMountSegment, CmdUnmountSegment, CmdPutStart, CmdPutEnd, CmdPutRevoke, CmdRemove,
		CmdUpsertStart, CmdGracefulUnmount} {
		require.Positive(t, seen[typ].failed, "%v never failed", typ)
	}
	require.Positive(t, evicted, "no eviction happened")
	require.Greater(t, partial, total/10, "the key index was rarely being built (%d objects at the end)", a.objects.Len())
	require.Greater(t, removed, evicted, "no other removal happened")
	sources := map[oplog.Source]int{}
	for i, e := range outA {
		require.Equal(t, uint64(i+1), e.SequenceID, "OpLog sequence ids are gapless from 1")
		require.NoError(t, e.Verify())
		sources[e.Source]++
	}
	for _, src := range []oplog.Source{oplog.SourceRemove, oplog.SourceRemoveByRegex, oplog.SourceRemoveAll,
		oplog.SourceUnmountSegment, oplog.SourceClientExpired, oplog.SourceEvict, oplog.SourceDiscard} {
		require.Positive(t, sources[src], "no REMOVE with source %q", src)
	}
	t.Logf("entries %d, evicted %d, removed %d, objects at end %d, sources %v", len(outA), evicted, removed, a.objects.Len(), sources)
}
