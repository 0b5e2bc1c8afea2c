package fsm

import (
	"math/rand/v2"
	"testing"

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
		forced := false
		switch c := cmd.(type) {
		case *Remove:
			forced = c.Force
		case *RemoveByRegex:
			forced = c.Force
		case *RemoveAll:
			forced = c.Force
		}
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
