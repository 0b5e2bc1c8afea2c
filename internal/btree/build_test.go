package btree

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func intLess(a, b int) bool { return a < b }

// check asserts t's invariants: its items in order, every leaf at one
// depth, every node but the root with minItems to maxItems items, an inner
// node with one child more than items; and its length. It returns the
// number of nodes.
func check(t *testing.T, tr *BTreeG[int]) int {
	t.Helper()
	var got []int
	leafDepth, nodes := -1, 0
	var walk func(n *node[int], depth int, root bool)
	walk = func(n *node[int], depth int, root bool) {
		nodes++
		if !root {
			require.GreaterOrEqual(t, len(n.items), tr.minItems(), "node at depth %d", depth)
		}
		require.LessOrEqual(t, len(n.items), tr.maxItems(), "node at depth %d", depth)
		if len(n.children) == 0 {
			if leafDepth < 0 {
				leafDepth = depth
			}
			require.Equal(t, leafDepth, depth, "every leaf at one depth")
			got = append(got, n.items...)
			return
		}
		require.Len(t, n.children, len(n.items)+1)
		for i, c := range n.children {
			walk(c, depth+1, false)
			if i < len(n.items) {
				got = append(got, n.items[i])
			}
		}
	}
	if tr.root != nil {
		walk(tr.root, 0, true)
	}
	require.True(t, slices.IsSorted(got) && len(slices.Compact(slices.Clone(got))) == len(got), "items in strict order")
	require.Equal(t, len(got), tr.Len())
	return nodes
}

// TestBuilder: a built tree holds what was added, in order, as a valid
// B-tree whose nodes are full but on the right edge, and goes on like one
// built by inserts: deletes, inserts, clones.
func TestBuilder(t *testing.T) {
	for _, degree := range []int{2, 3, 16} {
		max := 2*degree - 1
		for _, n := range []int{0, 1, 2, max - 1, max, max + 1, 2*max + 1, max * (max + 1), max*(max+1) + 1, 1000, 20_000} {
			b := NewBuilder(degree, intLess)
			for i := range n {
				require.True(t, b.Add(2*i))
			}
			if n > 0 {
				assert.False(t, b.Add(2*n-2), "an item not after the last is refused")
				assert.False(t, b.Add(2*n-3))
			}
			require.Equal(t, n, b.Len())
			tr := b.Tree()
			nodes := check(t, tr)
			if n > 0 {
				// Full nodes: about n/max of them (the right edge's may
				// hold half as many, a few more nodes).
				assert.LessOrEqual(t, nodes, n/max+2*(n/(max*max)+1)+4, "degree %d, %d items", degree, n)
			}
			for i := range n {
				_, ok := tr.Get(2 * i)
				require.True(t, ok, "item %d", 2*i)
			}
			// It goes on as a B-tree, its clone apart from it.
			clone := tr.Clone()
			want := map[int]bool{}
			for i := range n {
				want[2*i] = true
			}
			r := rand.New(rand.NewPCG(uint64(degree), uint64(n)))
			for range 3 * n {
				k := r.IntN(2*n + 2)
				if r.IntN(2) == 0 {
					tr.ReplaceOrInsert(k)
					want[k] = true
				} else {
					_, had := tr.Delete(k)
					require.Equal(t, want[k], had)
					delete(want, k)
				}
			}
			check(t, tr)
			assert.Equal(t, len(want), tr.Len())
			check(t, clone)
			var kept []int
			clone.Ascend(func(k int) bool { kept = append(kept, k); return true })
			require.Len(t, kept, n, "the clone is as built")
			for i, k := range kept {
				require.Equal(t, 2*i, k)
			}
		}
	}
}
