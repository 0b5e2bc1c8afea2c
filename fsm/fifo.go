package fsm

// Block lengths of a fifo: each new block is as long as the queue, within
// these bounds, so a queue that empties and refills every few entries does
// not allocate a large block each time.
const (
	fifoMinBlock = 64
	fifoMaxBlock = 4096
)

// fifo is a queue kept in blocks. It grows a block at a time and lets a
// block go once all its entries are dropped: a queue of millions never
// reallocates and copies what it holds, a pause every node would take at
// the same entry of the log. Entries are never overwritten, so a view of
// the queue stays valid while the queue moves on.
type fifo[T any] struct {
	blocks [][]T // the queue is blocks[0][head:], then the other blocks
	head   int
	n      int
}

func (q *fifo[T]) len() int { return q.n }

func (q *fifo[T]) push(v T) {
	last := len(q.blocks) - 1
	if last < 0 || len(q.blocks[last]) == cap(q.blocks[last]) {
		q.blocks = append(q.blocks, make([]T, 0, min(max(q.n, fifoMinBlock), fifoMaxBlock)))
		last++
	}
	q.blocks[last] = append(q.blocks[last], v)
	q.n++
}

// front returns the oldest entry; ok is false when the queue is empty.
func (q *fifo[T]) front() (v T, ok bool) {
	if q.n == 0 {
		return v, false
	}
	return q.blocks[0][q.head], true
}

// back returns the newest entry; ok is false when the queue is empty.
func (q *fifo[T]) back() (v T, ok bool) {
	if q.n == 0 {
		return v, false
	}
	b := q.blocks[len(q.blocks)-1]
	return b[len(b)-1], true
}

// drop removes the oldest n entries (all of them if n ≥ len).
func (q *fifo[T]) drop(n int) {
	n = min(n, q.n)
	q.n -= n
	n += q.head
	for len(q.blocks) > 0 && n >= len(q.blocks[0]) {
		n -= len(q.blocks[0])
		q.blocks[0] = nil
		q.blocks = q.blocks[1:]
	}
	q.head = n
}

// view returns up to n entries from the i-th oldest on, as runs that share
// the queue's memory; appending to a run cannot reach the queue's.
func (q *fifo[T]) view(i, n int) [][]T {
	n = min(n, q.n-i)
	var runs [][]T
	i += q.head
	for _, b := range q.blocks {
		if n <= 0 {
			break
		}
		if i >= len(b) {
			i -= len(b)
			continue
		}
		j := min(len(b), i+n)
		runs = append(runs, b[i:j:j])
		n -= j - i
		i = 0
	}
	return runs
}
