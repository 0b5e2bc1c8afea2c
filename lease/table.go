package lease

// table holds a shard's promises by key: open addressing with linear
// probing, each slot keeping its key's hash. Renew hashes a key while the
// read that renews it has the key's bytes in cache, so a merge touches one
// slot per key, where a map[string] would hash the key's bytes again (a
// cache miss by then) and reach its slot a miss later: the merge was 16 %
// of the leader's CPU in master_bench's BatchGet (2026-11-26).
type table struct {
	slots []slot // a power of two long and at most 3/4 full; nil when empty
	n     int
}

type slot struct {
	hash uint64 // 0: the slot is empty (a key's hash is never 0: see slotHash)
	key  string
	p    promise
}

const minSlots = 64

// slotHash is h as a slot keeps it: never 0, which marks an empty slot.
func slotHash(h uint64) uint64 {
	if h == 0 {
		return 1
	}
	return h
}

// home is where a key of hash h starts its probe. The shard took the low
// bits of h, which are the same for all of its keys.
func (t *table) home(h uint64) int {
	return int((h >> 5) & uint64(len(t.slots)-1))
}

// find returns the index of key's slot, or of the empty slot where it
// would go, and whether key is there.
func (t *table) find(h uint64, key string) (int, bool) {
	mask := len(t.slots) - 1
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.hash == 0 {
			return i, false
		}
		if s.hash == h && s.key == key {
			return i, true
		}
	}
}

// merge folds p into key's promise: per time the latest.
func (t *table) merge(h uint64, key string, p promise) {
	h = slotHash(h)
	if 4*(t.n+1) > 3*len(t.slots) {
		t.grow()
	}
	i, ok := t.find(h, key)
	s := &t.slots[i]
	if !ok {
		*s = slot{hash: h, key: key, p: p}
		t.n++
		return
	}
	s.p = promise{atMs: max(s.p.atMs, p.atMs), loggedMs: max(s.p.loggedMs, p.loggedMs), untilMs: max(s.p.untilMs, p.untilMs)}
}

func (t *table) grow() {
	old := t.slots
	t.slots = make([]slot, max(minSlots, 2*len(old)))
	for _, s := range old {
		if s.hash != 0 {
			i, _ := t.find(s.hash, s.key)
			t.slots[i] = s
		}
	}
}

// get returns key's promise.
func (t *table) get(h uint64, key string) (promise, bool) {
	if t.n == 0 {
		return promise{}, false
	}
	i, ok := t.find(slotHash(h), key)
	return t.slots[i].p, ok
}

// remove takes key out. The slots after it in its run move back, each to
// the first free slot its probe passes (backward-shift deletion), so no
// probe meets an empty slot before its key.
func (t *table) remove(h uint64, key string) {
	if t.n == 0 {
		return
	}
	i, ok := t.find(slotHash(h), key)
	if !ok {
		return
	}
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].hash != 0; j = (j + 1) & mask {
		// The slot at j may fill the hole at i unless its home lies in
		// (i, j]: its probe would then not pass i.
		if home := t.home(t.slots[j].hash); (j-home)&mask >= (j-i)&mask {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
}

// each calls f with every key and its promise, in no order.
func (t *table) each(f func(key string, p promise)) {
	for _, s := range t.slots {
		if s.hash != 0 {
			f(s.key, s.p)
		}
	}
}

// keep removes every key for which f reports false.
func (t *table) keep(f func(key string) bool) {
	old := t.slots
	*t = table{}
	for _, s := range old {
		if s.hash != 0 && f(s.key) {
			t.merge(s.hash, s.key, s.p)
		}
	}
}
