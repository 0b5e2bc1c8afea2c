// Package lease holds moonraft's lease arithmetic (read leases, soft pins,
// client session deadlines), the min-heap of deadlines used for client
// expiry, and the leader-side batcher that gathers read-lease renewals and
// client pings between two Tick commands.
//
// All times are int64 milliseconds: Unix ms on the leader's clock, which the
// FSM only ever sees inside commands. Deciding what to evict is the FSM's
// job, not this package's.
package lease

import "math"

// Extend returns max(deadlineMs, atMs+ttlMs): a renewal never shortens a
// lease. The sum saturates instead of wrapping, so absurd inputs give an
// endless lease rather than an expired one.
func Extend(deadlineMs, atMs, ttlMs int64) int64 {
	return max(deadlineMs, addSat(atMs, ttlMs))
}

// Active reports whether a lease with this deadline still holds at nowMs:
// the deadline itself is already past.
func Active(deadlineMs, nowMs int64) bool {
	return deadlineMs > nowMs
}

func addSat(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}
