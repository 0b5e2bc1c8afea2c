package fsm

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkKeySet asserts s holds exactly want.
func checkKeySet(t *testing.T, s *keySet, want map[string]struct{}) {
	t.Helper()
	require.Equal(t, len(want), s.len())
	require.Equal(t, slices.Sorted(maps.Keys(want)), slices.Sorted(s.all()))
	for k := range want {
		require.True(t, s.has(k), "key %q", k)
	}
}

func TestKeySet(t *testing.T) {
	tests := []struct {
		name string
		ops  []string // "+k" adds k, "-k" removes it
		want []string
	}{
		{"empty", nil, nil},
		{"add", []string{"+a", "+b"}, []string{"a", "b"}},
		{"add twice", []string{"+a", "+a"}, []string{"a"}},
		{"remove", []string{"+a", "+b", "-a"}, []string{"b"}},
		{"remove absent", []string{"+a", "-b"}, []string{"a"}},
		{"remove from empty", []string{"-a"}, nil},
		{"add after remove", []string{"+a", "-a", "+a"}, []string{"a"}},
		{"empty key and long key", []string{"+", "+" + strings.Repeat("x", 300)}, []string{"", strings.Repeat("x", 300)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newKeySet(0, 0)
			for _, op := range tt.ops {
				if op[0] == '+' {
					s.add(op[1:])
				} else {
					s.remove(op[1:])
				}
			}
			want := map[string]struct{}{}
			for _, k := range tt.want {
				want[k] = struct{}{}
			}
			checkKeySet(t, s, want)
			require.False(t, s.has("absent"))
		})
	}
}

// TestKeySetModel runs random adds and removes against a map, through
// growth, shrinking and compaction, with keys that collide in the table.
func TestKeySetModel(t *testing.T) {
	for _, size := range []int{0, 100, 5000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(size), 7))
			s, want := newKeySet(size, 0), map[string]struct{}{}
			keys := make([]string, 3000)
			for i := range keys {
				keys[i] = fmt.Sprintf("obj/%d/%s", i, strings.Repeat("k", rng.IntN(40)))
			}
			for round := 0; round < 6; round++ {
				// Alternate filling and draining, so the arena compacts
				// and the table grows and shrinks.
				addBias := 0.8
				if round%2 == 1 {
					addBias = 0.15
				}
				for i := 0; i < 4000; i++ {
					k := keys[rng.IntN(len(keys))]
					if rng.Float64() < addBias {
						s.add(k)
						want[k] = struct{}{}
					} else {
						s.remove(k)
						delete(want, k)
					}
				}
				checkKeySet(t, s, want)
				require.LessOrEqual(t, s.dead*2, max(len(s.arena), keySetMinCompact), "removed keys' bytes are compacted away")
			}
			for k := range want {
				s.remove(k)
			}
			checkKeySet(t, s, map[string]struct{}{})
			require.Equal(t, keySetMinCap, len(s.slots), "an emptied set gives its table back")
		})
	}
}

// TestKeySetFiller: adds through a filler, batched across sets, leave each
// set as adds one at a time would: a key added twice within a batch (an
// object with two slices on one segment) is held once, a set too small for
// its keys grows in the middle of a batch, and the last, partial batch is
// made by flush.
func TestKeySetFiller(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	sets := []*keySet{newKeySet(0, 0), newKeySet(500, 0), newKeySet(2000, 20000)}
	want := make([]map[string]struct{}, len(sets))
	for i := range want {
		want[i] = map[string]struct{}{}
	}
	fill := newKeySetFiller()
	adds := 0
	for i := 0; i < 3*keySetFillLen*50+7; i++ {
		k := fmt.Sprintf("obj/%d", rng.IntN(2500))
		j := rng.IntN(len(sets))
		for range 1 + rng.IntN(2) {
			fill.add(sets[j], k)
			adds++
		}
		want[j][k] = struct{}{}
	}
	require.NotZero(t, adds%keySetFillLen, "the last batch is partial")
	fill.flush()
	for i, s := range sets {
		checkKeySet(t, s, want[i])
	}
}

// TestKeySetHome: a key's home slot, which removal moves keys back
// towards, is the one its probe starts at, in a small table (from the tag)
// and past 2^24 slots (from the key, as the tag is too short to name it).
func TestKeySetHome(t *testing.T) {
	for _, size := range []int{64, 1 << 25} {
		s := &keySet{slots: make([]uint64, size)} // untouched pages stay unallocated
		for i := 0; i < 40; i++ {
			k := fmt.Sprint("home/", i)
			s.add(k)
			slot, ok := s.find(k, keyHash(k))
			require.True(t, ok)
			require.Equal(t, int(keyHash(k))&(size-1), s.home(s.slots[slot]), "key %q, %d slots", k, size)
		}
	}
}

func TestTableSize(t *testing.T) {
	for _, tt := range []struct{ n, want int }{{0, 8}, {6, 8}, {7, 16}, {12, 16}, {13, 32}, {1000, 2048}} {
		require.Equal(t, tt.want, tableSize(tt.n), "n=%d", tt.n)
		require.LessOrEqual(t, tt.n*4, tableSize(tt.n)*3, "n=%d within the load limit", tt.n)
	}
}
