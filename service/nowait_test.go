package service

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

type parentKey struct{}

// TestNoWaitMarksItsContextAndWhatDerivesFromIt: a backend finds the mark
// through contexts derived from a NoWait one (a read adds its own cancel
// or deadline), the read learns it gave up, and values of the parent stay
// visible.
func TestNoWaitMarksItsContextAndWhatDerivesFromIt(t *testing.T) {
	parent := context.WithValue(context.Background(), parentKey{}, "v")
	assert.False(t, MustNotWait(parent), "an ordinary context may wait")

	nctx := NoWait(parent)
	assert.False(t, nctx.Waited(), "nothing asked yet")
	assert.Equal(t, "v", nctx.Value(parentKey{}), "the parent's values pass through")

	child, cancel := context.WithCancel(nctx)
	defer cancel()
	assert.True(t, MustNotWait(child), "a context derived from a NoWait one must not wait")
	assert.True(t, nctx.Waited(), "the read learns it would have waited")

	other := NoWait(parent)
	assert.False(t, other.Waited(), "each NoWait context has its own mark")
}
