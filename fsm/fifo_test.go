package fsm

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flat is every entry of q, oldest first, through a view.
func flat(q *fifo[int]) []int {
	return slices.Concat(q.view(0, q.len())...)
}

// TestFifo pushes and drops by a script and checks the queue against a
// plain slice after every step, across block boundaries.
func TestFifo(t *testing.T) {
	tests := []struct {
		name  string
		steps []int // > 0 pushes that many, < 0 drops that many
	}{
		{"empty", nil},
		{"within one block", []int{10, -3, 5, -12}},
		{"drop more than held", []int{5, -9, 3}},
		{"across blocks", []int{fifoMinBlock*3 + 7, -fifoMinBlock, -1, 200, -fifoMinBlock * 2}},
		{"to the largest blocks and back to empty", []int{3 * fifoMaxBlock, -(3*fifoMaxBlock - 1), 5000, -5001, 70}},
		{"drain and refill", []int{100, -100, 100, -50, 100, -150}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q fifo[int]
			var want []int
			next := 0
			for i, s := range tt.steps {
				if s > 0 {
					for range s {
						q.push(next)
						want = append(want, next)
						next++
					}
				} else {
					q.drop(-s)
					want = want[min(-s, len(want)):]
				}
				require.Equal(t, len(want), q.len(), "step %d", i)
				require.True(t, slices.Equal(want, flat(&q)), "step %d: want %v, have %v", i, want, flat(&q))
				front, ok := q.front()
				back, okBack := q.back()
				require.Equal(t, len(want) > 0, ok, "step %d", i)
				require.Equal(t, ok, okBack, "step %d", i)
				if ok {
					assert.Equal(t, want[0], front, "step %d", i)
					assert.Equal(t, want[len(want)-1], back, "step %d", i)
				}
				for _, b := range q.blocks {
					assert.LessOrEqual(t, cap(b), fifoMaxBlock, "step %d", i)
				}
			}
		})
	}
}

func TestFifoView(t *testing.T) {
	var q fifo[int]
	for i := range 1000 {
		q.push(i)
	}
	tests := []struct {
		name    string
		from, n int
		want    []int
	}{
		{"all", 0, 1000, seq(0, 1000)},
		{"middle", 100, 300, seq(100, 400)},
		{"past the end", 990, 50, seq(990, 1000)},
		{"at the end", 1000, 5, nil},
		{"none", 3, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, slices.Concat(q.view(tt.from, tt.n)...))
		})
	}

	// A view outlives the queue moving on: what it shows is never
	// overwritten, and appending to it cannot reach the queue.
	v := q.view(0, q.len())
	q.drop(q.len())
	for i := range 500 {
		q.push(-i)
	}
	v[len(v)-1] = append(v[len(v)-1], 12345)
	assert.Equal(t, seq(0, 1000), slices.Concat(v...)[:1000])
	assert.Equal(t, 0, flat(&q)[0])
	back, _ := q.back()
	assert.Equal(t, -499, back)
}

func seq(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}
