package node

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGate: reads of a key wait while its removal is in flight, reads of
// other keys do not, and an all-keys removal holds every read.
func TestGate(t *testing.T) {
	g := newGate()
	ctx := context.Background()
	endK := g.closeKey("k")

	ran := false
	require.NoError(t, g.readKeys(ctx, []string{"other"}, func() { ran = true }))
	assert.True(t, ran, "other keys are not held")

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, g.readKeys(short, []string{"k"}, func() { t.Fatal("read ran during its key's removal") }), context.DeadlineExceeded)
	assert.ErrorIs(t, g.readAll(short, func() { t.Fatal("regex read ran during a removal") }), context.DeadlineExceeded)
	assert.ErrorIs(t, g.readKeys(short, []string{"other", "k"}, func() { t.Fatal("batch read ran during the removal of one of its keys") }), context.DeadlineExceeded)
	require.NoError(t, g.readKeys(ctx, []string{"other", "more"}, func() {}), "a batch without the key is not held")

	done := make(chan struct{})
	go func() {
		assert.NoError(t, g.readKeys(ctx, []string{"k"}, func() {}))
		close(done)
	}()
	endK()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("read not released when the removal ended")
	}

	endAll := g.closeAll()
	short2, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	assert.Error(t, g.readKeys(short2, []string{"other"}, func() {}))
	endAll()
	require.NoError(t, g.readAll(ctx, func() {}))
}
