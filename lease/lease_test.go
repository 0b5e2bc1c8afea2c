package lease_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/moonraft/moonraft/lease"
)

func TestExtend(t *testing.T) {
	tests := []struct {
		name              string
		deadline, at, ttl int64
		want              int64
	}{
		{"no lease yet", 0, 1000, 5000, 6000},
		{"extends", 6000, 2000, 5000, 7000},
		{"never shortens", 9000, 2000, 5000, 9000},
		{"equal", 7000, 2000, 5000, 7000},
		{"zero ttl", 100, 50, 0, 100},
		{"zero ttl past", 10, 50, 0, 50},
		{"soft pin ttl", 0, 1704110400123, 30 * 60 * 1000, 1704112200123},
		{"saturates", 0, math.MaxInt64 - 10, 5000, math.MaxInt64},
		{"saturates below", math.MinInt64, math.MinInt64 + 10, -5000, math.MinInt64},
		{"negative ttl", 100, 50, -10, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, lease.Extend(tt.deadline, tt.at, tt.ttl))
		})
	}
}

func TestActive(t *testing.T) {
	tests := []struct {
		name          string
		deadline, now int64
		want          bool
	}{
		{"before", 1000, 999, true},
		{"at the deadline", 1000, 1000, false},
		{"after", 1000, 1001, false},
		{"no lease", 0, 0, false},
		{"far future", math.MaxInt64, 1704110400123, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, lease.Active(tt.deadline, tt.now))
		})
	}
}
