package fsm

import (
	"testing"

	"github.com/moonraft/moonraft/lease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSessionChanges: a tracking state records the sessions it has as
// begun and then each session's start and end once, so a set kept from
// them is the state's sessions; an untracked one records nothing.
func TestSessionChanges(t *testing.T) {
	x := newH(t)
	x.mount("c0", "s0", 0, 1000)
	assert.Empty(t, x.f.TakeSessionChanges(), "untracked")

	x.f.TrackSessions(true)
	set := map[string]bool{}
	step := func(want ...SessionChange) {
		t.Helper()
		got := x.f.TakeSessionChanges()
		assert.Equal(t, want, got)
		for _, c := range got {
			if c.Live {
				set[c.ClientID] = true
			} else {
				delete(set, c.ClientID)
			}
		}
		assert.Equal(t, len(set), x.f.Stats().Sessions, "the set is the state's sessions")
		for id := range set {
			assert.True(t, x.f.HasSession(id), "the set is the state's sessions: %s", id)
		}
	}
	step(SessionChange{"c0", true})
	x.mount("c1", "s1", 1000, 1000)
	x.mount("c2", "s2", 2000, 1000)
	step(SessionChange{"c1", true}, SessionChange{"c2", true})
	x.mount("c1", "s3", 3000, 1000)
	step()
	x.apply(&MountSegment{NowMs: x.now, ClientID: "c3", Segment: SegmentSpec{ID: "s1", Name: "again", Base: 0, Size: 10}})
	step()

	ttl := x.f.params.ClientTTLMs
	x.now += ttl / 2
	x.ok(&Tick{NowMs: x.now, Pings: []lease.Ping{{ClientID: "c2", AtMs: x.now}, {ClientID: "nobody", AtMs: x.now}}})
	step()
	x.now += ttl/2 + 1
	x.tick()
	step(SessionChange{"c0", false}, SessionChange{"c1", false})
	x.mount("c1", "s1", 1000, 1000)
	step(SessionChange{"c1", true})

	x.f.TrackSessions(false)
	x.now += 2 * ttl
	x.tick()
	assert.Empty(t, x.f.TakeSessionChanges())
	require.Zero(t, x.f.Stats().Sessions)
}
