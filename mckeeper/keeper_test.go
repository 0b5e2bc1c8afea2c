package mckeeper

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestSilences: the silence before a remount is the longest gap between
// pings answered OK in the window before it, the running one included;
// short gaps and those that ended before the window do not count. The
// time since the last ping answered OK tells a silence that ended from one
// still running.
func TestSilences(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	for _, c := range []struct {
		name string
		oks  []float64 // when pings answered OK were sent, in seconds
		at   float64
		want time.Duration
		// since is from the last ping answered OK to at.
		since time.Duration
	}{
		{"none answered", nil, 5, 0, 0},
		{"every second", []float64{0, 1, 2, 3}, 4.2, 1200 * time.Millisecond, 1200 * time.Millisecond},
		{"running", []float64{0, 1}, 13, 12 * time.Second, 12 * time.Second},
		{"an answer just before", []float64{0, 1, 13}, 14, 12 * time.Second, time.Second},
		{"two gaps", []float64{0, 8, 9, 20, 21}, 22, 11 * time.Second, time.Second},
		{"ended before the window", []float64{0, 12, 13, 43, 44}, 44.5, 30 * time.Second, 500 * time.Millisecond},
		{"out of the window", append([]float64{0, 15}, everySecond(16, 47)...), 47.5, 500 * time.Millisecond, 500 * time.Millisecond},
		{"short gaps are not kept", []float64{0, 1.5, 3, 4}, 4.5, 500 * time.Millisecond, 500 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s silences
			for _, ok := range c.oks {
				s.ok(at(ok))
			}
			assert.Equal(t, c.want, s.longest(at(c.at)))
			assert.Equal(t, c.since, s.since(at(c.at)))
		})
	}
}

// everySecond is from, from+1, …, to.
func everySecond(from, to int) []float64 {
	var out []float64
	for s := from; s <= to; s++ {
		out = append(out, float64(s))
	}
	return out
}
