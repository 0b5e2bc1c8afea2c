package lease

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTableMatchesAMap runs random merges, removals and sweeps on a table
// and on a map side by side. The hashes come from a small space, shifted
// past the shard's bits as Renew's are not, so that distinct keys share a
// hash, runs of slots wrap around the end, and removals shift long runs.
func TestTableMatchesAMap(t *testing.T) {
	for _, space := range []uint64{1, 7, 64, 1 << 20} {
		t.Run(fmt.Sprintf("hashes=%d", space), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(space, 3))
			hashOf := func(k string) uint64 {
				var h uint64
				for _, c := range k {
					h = h*31 + uint64(c)
				}
				return (h % space) << 5 // 0 among them: the empty mark must not be a key's hash
			}
			var tb table
			want := map[string]promise{}
			check := func(step int) {
				require.Equal(t, len(want), tb.n, "step %d", step)
				for k, p := range want {
					got, ok := tb.get(hashOf(k), k)
					require.True(t, ok, "step %d: %q lost", step, k)
					require.Equal(t, p, got, "step %d: %q", step, k)
				}
				seen := map[string]promise{}
				tb.each(func(k string, p promise) { seen[k] = p })
				require.Equal(t, want, seen, "step %d", step)
			}
			for step := range 4000 {
				k := fmt.Sprintf("key-%d", rng.IntN(300))
				switch op := rng.IntN(20); {
				case op < 12:
					p := promise{atMs: rng.Int64N(100), loggedMs: rng.Int64N(100), untilMs: rng.Int64N(100)}
					tb.merge(hashOf(k), k, p)
					old, ok := want[k]
					if ok {
						p = promise{atMs: max(old.atMs, p.atMs), loggedMs: max(old.loggedMs, p.loggedMs), untilMs: max(old.untilMs, p.untilMs)}
					}
					want[k] = p
				case op < 19:
					tb.remove(hashOf(k), k)
					delete(want, k)
				default:
					drop := rng.IntN(3)
					tb.keep(func(k string) bool { return len(k)%3 != drop })
					for k := range want {
						if len(k)%3 == drop {
							delete(want, k)
						}
					}
				}
				if _, ok := tb.get(hashOf("absent"), "absent"); ok {
					t.Fatalf("step %d: a key never merged is found", step)
				}
				if step%50 == 0 || space == 1 {
					check(step)
				}
			}
			check(-1)
		})
	}
}
