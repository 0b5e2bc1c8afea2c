package fsm

import (
	"fmt"
	"testing"

	"github.com/moonraft/moonraft/internal/btree"
	"github.com/stretchr/testify/assert"
)

// TestAscendAhead: every object in key order, as Ascend gives them, across
// batch boundaries, and none after fn says stop.
func TestAscendAhead(t *testing.T) {
	for _, tc := range []struct{ n, stopAfter int }{
		{0, -1}, {1, -1}, {readAheadLen - 1, -1}, {readAheadLen, -1}, {readAheadLen + 1, -1}, {200, -1},
		{200, 0}, {200, readAheadLen - 1}, {200, readAheadLen}, {200, 199},
	} {
		t.Run(fmt.Sprintf("%d objects, stop after %d", tc.n, tc.stopAfter), func(t *testing.T) {
			tree := btree.NewG(btreeDegree, func(a, b objItem) bool { return a.key < b.key })
			for i := range tc.n {
				tree.ReplaceOrInsert(objItem{benchKey(i), &object{size: uint64(i), replicas: []replica{{buffers: []buffer{{length: 1}}}}}})
			}
			var want, got []objItem
			tree.Ascend(func(it objItem) bool {
				want = append(want, it)
				return len(want)-1 != tc.stopAfter
			})
			ascendAhead(tree, func(it objItem) bool {
				got = append(got, it)
				return len(got)-1 != tc.stopAfter
			})
			assert.Equal(t, want, got)
		})
	}
}
