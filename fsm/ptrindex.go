package fsm

import (
	"math/bits"
	"unsafe"
)

// ptrIndex maps pointers to values: a snapshot's places of its segments
// and sessions, looked up for every object it writes. An open-addressed
// table hashed by address, no larger than it must be: at 10,000 segments
// a Go map's lookup took 60 ns of a write's 340 ns an object, most of it
// the map's own work, not the memory it reads.
type ptrIndex[K, V any] struct {
	slots []ptrSlot[K, V]
	shift uint // 64 - log2(len(slots))
}

type ptrSlot[K, V any] struct {
	key *K
	val V
}

// newPtrIndex returns an index sized for n pointers (at a load of at most
// three quarters, as a keySet).
func newPtrIndex[K, V any](n int) ptrIndex[K, V] {
	size := tableSize(n)
	return ptrIndex[K, V]{slots: make([]ptrSlot[K, V], size), shift: uint(64 - bits.TrailingZeros(uint(size)))}
}

// home is where a probe for k starts: the address's Fibonacci hash, whose
// top bits depend on all of its bits, the low ones an allocation's
// alignment leaves at zero among them.
func (x ptrIndex[K, V]) home(k *K) int {
	return int(uint64(uintptr(unsafe.Pointer(k))) * 0x9e3779b97f4a7c15 >> x.shift)
}

// put sets k's value; k is not nil, and the index holds fewer pointers
// than it was sized for.
func (x ptrIndex[K, V]) put(k *K, v V) {
	mask := len(x.slots) - 1
	i := x.home(k)
	for x.slots[i].key != nil && x.slots[i].key != k {
		i = (i + 1) & mask
	}
	x.slots[i] = ptrSlot[K, V]{k, v}
}

// get returns k's value, or the zero value and false.
func (x ptrIndex[K, V]) get(k *K) (V, bool) {
	var zero V
	if len(x.slots) == 0 {
		return zero, false
	}
	mask := len(x.slots) - 1
	for i := x.home(k); ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.key == k && k != nil {
			return s.val, true
		}
		if s.key == nil {
			return zero, false
		}
	}
}

// at is k's value, the zero value if it has none.
func (x ptrIndex[K, V]) at(k *K) V {
	v, _ := x.get(k)
	return v
}
