package lease_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/lease"
)

// model is the brute-force heap: a map, scanned for the minimum.
type model map[string]int64

func (m model) min() (string, int64, bool) {
	var id string
	var d int64
	ok := false
	for k, v := range m {
		if !ok || v < d || (v == d && k < id) {
			id, d, ok = k, v, true
		}
	}
	return id, d, ok
}

func TestDeadlineHeapAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := lease.NewDeadlineHeap()
	m := model{}
	for op := range 10000 {
		// Few ids and few deadlines, so updates and ties are common.
		id := fmt.Sprintf("client-%02d", rng.IntN(64))
		switch r := rng.IntN(10); {
		case r < 6:
			d := int64(rng.IntN(200))
			h.Set(id, d)
			m[id] = d
		case r < 8:
			_, inModel := m[id]
			require.Equal(t, inModel, h.Remove(id), "op %d", op)
			delete(m, id)
		default:
			wid, wd, wok := m.min()
			gid, gd, gok := h.Pop()
			require.Equal(t, []any{wid, wd, wok}, []any{gid, gd, gok}, "op %d", op)
			delete(m, wid)
		}
		require.Equal(t, len(m), h.Len(), "op %d", op)
		wid, wd, wok := m.min()
		gid, gd, gok := h.Peek()
		require.Equal(t, []any{wid, wd, wok}, []any{gid, gd, gok}, "op %d", op)
		d, ok := h.Deadline(id)
		md, mok := m[id]
		require.Equal(t, []any{md, mok}, []any{d, ok}, "op %d", op)
	}
	// Draining gives everything in (deadline, id) order.
	type pair struct {
		id string
		d  int64
	}
	var want []pair
	for id, d := range m {
		want = append(want, pair{id, d})
	}
	sort.Slice(want, func(i, j int) bool {
		return want[i].d < want[j].d || (want[i].d == want[j].d && want[i].id < want[j].id)
	})
	var got []pair
	for {
		id, d, ok := h.Pop()
		if !ok {
			break
		}
		got = append(got, pair{id, d})
	}
	assert.Equal(t, want, got)
}

func TestDeadlineHeapTies(t *testing.T) {
	h := lease.NewDeadlineHeap()
	for _, id := range []string{"d", "b", "e", "a", "c"} {
		h.Set(id, 100)
	}
	h.Set("z", 50)
	h.Set("y", 150)
	var order []string
	for h.Len() > 0 {
		id, _, _ := h.Pop()
		order = append(order, id)
	}
	assert.Equal(t, []string{"z", "a", "b", "c", "d", "e", "y"}, order)
}

func TestDeadlineHeapUpdate(t *testing.T) {
	h := lease.NewDeadlineHeap()
	h.Set("a", 10)
	h.Set("b", 20)
	h.Set("c", 30)
	h.Set("a", 40) // later: moves down
	id, d, ok := h.Peek()
	assert.Equal(t, []any{"b", int64(20), true}, []any{id, d, ok})
	h.Set("c", 5) // earlier: moves up
	id, d, ok = h.Peek()
	assert.Equal(t, []any{"c", int64(5), true}, []any{id, d, ok})
	assert.Equal(t, 3, h.Len())
	assert.True(t, h.Remove("c"))
	assert.False(t, h.Remove("c"))
	_, ok = h.Deadline("c")
	assert.False(t, ok)

	empty := lease.NewDeadlineHeap()
	id, d, ok = empty.Peek()
	assert.Equal(t, []any{"", int64(0), false}, []any{id, d, ok})
	id, d, ok = empty.Pop()
	assert.Equal(t, []any{"", int64(0), false}, []any{id, d, ok})
	assert.False(t, empty.Remove("x"))
	assert.Zero(t, empty.Len())
}

func TestDeadlineHeapClone(t *testing.T) {
	h := lease.NewDeadlineHeap()
	for i := range 20 {
		h.Set(fmt.Sprintf("c%02d", i), int64(100-i))
	}
	c := h.Clone()
	h.Set("c00", 1)
	h.Remove("c19")
	h.Pop()
	c.Set("new", 0)

	d, ok := c.Deadline("c00")
	assert.True(t, ok)
	assert.Equal(t, int64(100), d)
	_, ok = c.Deadline("c19")
	assert.True(t, ok)
	_, ok = h.Deadline("new")
	assert.False(t, ok)
	assert.Equal(t, 21, c.Len())
	assert.Equal(t, 18, h.Len())

	id, _, _ := c.Pop()
	assert.Equal(t, "new", id)
	id, d, _ = c.Pop()
	assert.Equal(t, "c19", id)
	assert.Equal(t, int64(81), d)
	assert.Equal(t, 0, lease.NewDeadlineHeap().Clone().Len())
}

func BenchmarkDeadlineHeapSet(b *testing.B) {
	const n = 100_000
	ids := make([]string, n)
	h := lease.NewDeadlineHeap()
	for i := range ids {
		ids[i] = fmt.Sprintf("client-%06d", i)
		h.Set(ids[i], int64(i))
	}
	rng := rand.New(rand.NewPCG(3, 4))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		// A ping moves one session's deadline forward, as the FSM does.
		h.Set(ids[rng.IntN(n)], int64(n+i))
		i++
	}
}
