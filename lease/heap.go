package lease

// DeadlineHeap is an indexed min-heap of (deadline, id) pairs, ordered by
// deadline and then by id, so the order is total and every node pops the
// same ids in the same order. It replaces the notes' 1 s full scan of client
// sessions (seed 002): the FSM pops only what has expired. Not safe for
// concurrent use.
type DeadlineHeap struct {
	items []*heapItem
	index map[string]*heapItem
}

// heapItem knows its own position, so moving items while sifting does not
// touch the map (that is what made a map of positions slow).
type heapItem struct {
	id       string
	deadline int64
	pos      int
}

// NewDeadlineHeap returns an empty heap.
func NewDeadlineHeap() *DeadlineHeap {
	return &DeadlineHeap{index: make(map[string]*heapItem)}
}

func (h *DeadlineHeap) less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	if a.deadline != b.deadline {
		return a.deadline < b.deadline
	}
	return a.id < b.id
}

func (h *DeadlineHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].pos = i
	h.items[j].pos = j
}

func (h *DeadlineHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *DeadlineHeap) down(i int) {
	n := len(h.items)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if r := c + 1; r < n && h.less(r, c) {
			c = r
		}
		if !h.less(c, i) {
			return
		}
		h.swap(i, c)
		i = c
	}
}

// Set inserts id with the deadline, or moves it to the new deadline.
// O(log n).
func (h *DeadlineHeap) Set(id string, deadlineMs int64) {
	if it, ok := h.index[id]; ok {
		it.deadline = deadlineMs
		h.up(it.pos)
		h.down(it.pos)
		return
	}
	it := &heapItem{id: id, deadline: deadlineMs, pos: len(h.items)}
	h.items = append(h.items, it)
	h.index[id] = it
	h.up(it.pos)
}

// Remove deletes id and reports whether it was there. O(log n).
func (h *DeadlineHeap) Remove(id string) bool {
	it, ok := h.index[id]
	if !ok {
		return false
	}
	h.removeAt(it.pos)
	return true
}

func (h *DeadlineHeap) removeAt(i int) *heapItem {
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	it := h.items[last]
	h.items[last] = nil
	h.items = h.items[:last]
	delete(h.index, it.id)
	if i != last {
		h.up(i)
		h.down(i)
	}
	return it
}

// Deadline returns id's deadline.
func (h *DeadlineHeap) Deadline(id string) (int64, bool) {
	it, ok := h.index[id]
	if !ok {
		return 0, false
	}
	return it.deadline, true
}

// Peek returns the entry with the earliest deadline (smallest id on a tie)
// without removing it.
func (h *DeadlineHeap) Peek() (id string, deadlineMs int64, ok bool) {
	if len(h.items) == 0 {
		return "", 0, false
	}
	return h.items[0].id, h.items[0].deadline, true
}

// Pop removes and returns the entry Peek would return.
func (h *DeadlineHeap) Pop() (id string, deadlineMs int64, ok bool) {
	if len(h.items) == 0 {
		return "", 0, false
	}
	it := h.removeAt(0)
	return it.id, it.deadline, true
}

// Len returns the number of entries.
func (h *DeadlineHeap) Len() int {
	return len(h.items)
}

// Clone returns an independent copy (for FSM snapshots).
func (h *DeadlineHeap) Clone() *DeadlineHeap {
	c := &DeadlineHeap{
		items: make([]*heapItem, len(h.items)),
		index: make(map[string]*heapItem, len(h.index)),
	}
	for i, it := range h.items {
		cp := *it
		c.items[i] = &cp
		c.index[cp.id] = &cp
	}
	return c
}
