package fsm

import (
	"encoding/binary"
	"iter"
	"math/bits"
)

// keySet is a set of keys that holds no pointer per key: their bytes sit in
// one arena and an open-addressed table holds their offsets. A segment
// keeps the keys of its objects in one (segment.objs) for an unmount to
// visit. As a map[string]struct{} that index cost 55–90 bytes and a
// pointer per object, a pointer the collector followed to a random place
// in the heap at every collection: a quarter to two fifths of the
// collector's work on a follower's state (BenchmarkGCPerObject). Here a
// key costs its length and ~15 bytes, and the collector marks two
// allocations a segment.
type keySet struct {
	// arena holds each key as its uvarint length, then its bytes; removed
	// keys' bytes stay until they are over half of it (compactIfSparse).
	arena []byte
	// slots is the table, linear probing: 0 is empty, else the key's
	// arena offset plus one (slotOff) with its hash's low 24 bits above
	// (slotTag), which a probe compares before it reads the arena.
	slots []uint64
	n     int // keys held
	dead  int // arena bytes of removed keys
}

const (
	slotOffBits  = 40 // arena offsets up to 1 TiB
	slotOffMask  = 1<<slotOffBits - 1
	keySetMinCap = 8
	// keySetMinCompact: an arena smaller than this is not compacted, so
	// a small set does not compact at every other removal.
	keySetMinCompact = 4096
)

// keyHash is FNV-1a with MurmurHash3's final mix, so that the low bits a
// probe starts from depend on every byte of the key.
func keyHash(key string) uint64 {
	h := fnv64a(key)
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

func slotOff(v uint64) int    { return int(v&slotOffMask) - 1 }
func slotTag(v uint64) uint64 { return v >> slotOffBits }
func hashTag(h uint64) uint64 { return h & (1<<(64-slotOffBits) - 1) }
func makeSlot(off int, h uint64) uint64 {
	return hashTag(h)<<slotOffBits | uint64(off+1)
}

// newKeySet returns a set sized to hold n keys of arenaBytes (entryLen
// each) without growing.
func newKeySet(n, arenaBytes int) *keySet {
	s := &keySet{}
	s.resize(tableSize(n))
	s.arena = make([]byte, 0, arenaBytes)
	return s
}

// tableSize is the table size that holds n keys under the load limit (3/4).
func tableSize(n int) int {
	need := (n*4 + 2) / 3
	if need < keySetMinCap {
		return keySetMinCap
	}
	return 1 << bits.Len(uint(need-1))
}

func (s *keySet) len() int {
	if s == nil {
		return 0
	}
	return s.n
}

// arenaKey is the key whose entry starts at off in arena, not copied: it
// must not outlive the next change to the set.
func arenaKey(arena []byte, off int) []byte {
	l, w := binary.Uvarint(arena[off:])
	return arena[off+w : off+w+int(l)]
}

// find returns the slot of key, or of the empty slot where it would go.
func (s *keySet) find(key string, h uint64) (int, bool) {
	mask := len(s.slots) - 1
	tag := hashTag(h)
	for i := int(h) & mask; ; i = (i + 1) & mask {
		v := s.slots[i]
		if v == 0 {
			return i, false
		}
		if slotTag(v) == tag && string(arenaKey(s.arena, slotOff(v))) == key {
			return i, true
		}
	}
}

func (s *keySet) has(key string) bool {
	if s == nil || s.n == 0 {
		return false
	}
	_, ok := s.find(key, keyHash(key))
	return ok
}

// add puts key in the set; adding a key it holds changes nothing.
func (s *keySet) add(key string) { s.addHashed(key, keyHash(key)) }

// addHashed is add with key's hash h already taken.
func (s *keySet) addHashed(key string, h uint64) {
	i, ok := s.find(key, h)
	if ok {
		return
	}
	if (s.n+1)*4 > len(s.slots)*3 {
		s.resize(len(s.slots) * 2)
		i, _ = s.find(key, h)
	}
	off := len(s.arena)
	s.arena = binary.AppendUvarint(s.arena, uint64(len(key)))
	s.arena = append(s.arena, key...)
	s.slots[i] = makeSlot(off, h)
	s.n++
}

// remove takes key out of the set, if it is there.
func (s *keySet) remove(key string) {
	if s == nil || s.n == 0 {
		return
	}
	i, ok := s.find(key, keyHash(key))
	if !ok {
		return
	}
	s.dead += entryLen(len(key))
	s.n--
	// Backward-shift deletion: the keys after i in its run move back
	// where their probe from home passes i, so no probe ever stops at a
	// hole before its key and the table needs no tombstones.
	mask := len(s.slots) - 1
	for j := i; ; {
		j = (j + 1) & mask
		v := s.slots[j]
		if v == 0 {
			break
		}
		if !cyclicIn(s.home(v), i, j) {
			s.slots[i] = v
			i = j
		}
	}
	s.slots[i] = 0
	s.compactIfSparse()
}

// cyclicIn reports whether slot h lies in (i, j], going round the table.
func cyclicIn(h, i, j int) bool {
	if i < j {
		return i < h && h <= j
	}
	return h > i || h <= j
}

func entryLen(keyLen int) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], uint64(keyLen)) + keyLen
}

// home is the table slot a probe for slot value v's key starts at: from
// the tag while the table is small enough for it, else from the key.
func (s *keySet) home(v uint64) int {
	mask := len(s.slots) - 1
	if mask < 1<<(64-slotOffBits) {
		return int(slotTag(v)) & mask
	}
	return int(keyHash(string(arenaKey(s.arena, slotOff(v))))) & mask
}

// resize moves the keys into a table of size slots (a power of two), and
// their bytes into a new arena without the removed ones.
func (s *keySet) resize(size int) {
	old, oldArena := s.slots, s.arena
	s.slots = make([]uint64, size)
	s.arena = make([]byte, 0, len(oldArena)-s.dead)
	s.dead = 0
	mask := size - 1
	for _, v := range old {
		if v == 0 {
			continue
		}
		key := arenaKey(oldArena, slotOff(v))
		h := keyHash(string(key))
		i := int(h) & mask
		for s.slots[i] != 0 {
			i = (i + 1) & mask
		}
		s.slots[i] = makeSlot(len(s.arena), h)
		s.arena = binary.AppendUvarint(s.arena, uint64(len(key)))
		s.arena = append(s.arena, key...)
	}
}

// compactIfSparse drops the removed keys' bytes once they are over half of
// the arena, and halves the table once it is under an eighth full, so a
// set that shrank gives its memory back.
func (s *keySet) compactIfSparse() {
	switch {
	case len(s.slots) > keySetMinCap && s.n*8 < len(s.slots):
		s.resize(tableSize(s.n))
	case len(s.arena) >= keySetMinCompact && s.dead*2 > len(s.arena):
		s.resize(len(s.slots))
	}
}

// all yields copies of the keys, in no particular order.
func (s *keySet) all() iter.Seq[string] {
	return func(yield func(string) bool) {
		if s == nil {
			return
		}
		for _, v := range s.slots {
			if v != 0 && !yield(string(arenaKey(s.arena, slotOff(v)))) {
				return
			}
		}
	}
}

// keySetFiller adds keys to many sets, as a restore fills every segment's:
// it reads the slot each key's probe starts at, and the end of the set's
// arena, a batch of keySetFillLen adds ahead of the adds. With thousands
// of segments each add is a cache miss in a set of its own; the batch's
// reads, independent of each other, overlap instead of waiting one after
// another (as ascendAhead's do).
type keySetFiller struct {
	adds []keySetAdd
	// touched sums the words read ahead; nothing reads the sum.
	touched uint64
}

type keySetAdd struct {
	set *keySet
	key string
	h   uint64
}

const keySetFillLen = 32

func newKeySetFiller() *keySetFiller {
	return &keySetFiller{adds: make([]keySetAdd, 0, keySetFillLen)}
}

// add adds key to s, at the latest at the next flush.
func (f *keySetFiller) add(s *keySet, key string) {
	f.adds = append(f.adds, keySetAdd{s, key, keyHash(key)})
	if len(f.adds) == keySetFillLen {
		f.flush()
	}
}

// flush makes every add so far.
func (f *keySetFiller) flush() {
	for _, a := range f.adds {
		f.touched += a.set.slots[int(a.h)&(len(a.set.slots)-1)]
		if n := len(a.set.arena); n > 0 {
			f.touched += uint64(a.set.arena[n-1])
		}
	}
	for _, a := range f.adds {
		a.set.addHashed(a.key, a.h)
	}
	f.adds = f.adds[:0]
}
