package fsm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPtrIndex(t *testing.T) {
	for _, n := range []int{0, 1, 7, 1000, 10_000} {
		segs := make([]*segment, n)
		x := newPtrIndex[segment, uint64](n)
		for i := range segs {
			segs[i] = &segment{}
			x.put(segs[i], uint64(i))
		}
		for i, sg := range segs {
			v, ok := x.get(sg)
			require.True(t, ok, "%d of %d", i, n)
			require.Equal(t, uint64(i), v)
		}
		v, ok := x.get(&segment{})
		assert.False(t, ok, "a pointer it was not given, of %d", n)
		assert.Zero(t, v)
		assert.Zero(t, x.at(&segment{}))
		_, ok = x.get(nil)
		assert.False(t, ok, "nil, of %d", n)
		if n > 0 {
			x.put(segs[0], 42)
			assert.Equal(t, uint64(42), x.at(segs[0]), "put again replaces")
		}
	}
	_, ok := ptrIndex[segment, uint64]{}.get(&segment{})
	assert.False(t, ok, "the zero index holds nothing")
}
