package node

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestCatchUpLines: a node trailing the commit index by catchUpMin entries
// or more says so after catchUpAfter, with its rate and the time left,
// then every catchUpEvery, and says when it has caught up; trailing by
// less, or briefly, it says nothing.
func TestCatchUpLines(t *testing.T) {
	start := time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)
	at := func(secs float64) time.Time { return start.Add(time.Duration(secs * float64(time.Second))) }
	type obs struct {
		secs            float64
		applied, commit uint64
		msg             string
		args            []any
	}
	cases := []struct {
		name string
		obs  []obs
	}{
		{"a busy node trailing by less than catchUpMin", []obs{
			{1, 100, 1000, "", nil},
			{2, 900, 1900, "", nil},
			{3, 1900, 2900, "", nil},
		}},
		{"a restart applying its log", []obs{
			{1, 1000, 41000, "", nil},
			{1.5, 5000, 41000, "", nil},
			{2, 9000, 41000, "catching up with the log", []any{"applied", uint64(9000), "committed", uint64(41000), "behind", uint64(32000), "entries_per_sec", int64(8000), "eta", 4 * time.Second}},
			{3, 17000, 42000, "", nil},
			{7, 33000, 43000, "catching up with the log", []any{"applied", uint64(33000), "committed", uint64(43000), "behind", uint64(10000), "entries_per_sec", int64(4800), "eta", 2 * time.Second}},
			{8, 43000, 43500, "caught up with the log", []any{"applied", uint64(43000), "entries", uint64(42000), "took", 7 * time.Second, "since_start", 8 * time.Second}},
			{9, 43500, 43500, "", nil},
		}},
		{"trailing for less than catchUpAfter", []obs{
			{1, 0, 5000, "", nil},
			{1.5, 5000, 5000, "", nil},
			{3, 5000, 9000, "", nil},
		}},
		{"stalled: no rate, no time left", []obs{
			{1, 0, 5000, "", nil},
			{2, 0, 5000, "catching up with the log", []any{"applied", uint64(0), "committed", uint64(5000), "behind", uint64(5000), "entries_per_sec", int64(0)}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &catchUp{started: start}
			for _, o := range tc.obs {
				msg, args := c.observe(at(o.secs), o.applied, o.commit)
				assert.Equal(t, o.msg, msg, "at %g s", o.secs)
				assert.Equal(t, o.args, args, "at %g s", o.secs)
			}
		})
	}
}
