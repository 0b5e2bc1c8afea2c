package node

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// handover tracks the leadership transfer this node runs, so a write that
// Raft refused during it can wait for its outcome instead of failing: a
// planned handover (SIGTERM, moonctl leader transfer) then costs clients a
// pause of milliseconds, not errors.
type handover struct {
	mu   sync.Mutex
	done chan struct{} // closed when the running transfer ends; nil: none runs
}

// begin marks a transfer as running; end marks it over.
func (h *handover) begin() (end func()) {
	ch := make(chan struct{})
	h.mu.Lock()
	h.done = ch
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		if h.done == ch {
			h.done = nil
		}
		h.mu.Unlock()
		close(ch)
	}
}

// running tells whether a transfer runs.
func (h *handover) running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done != nil
}

// wait returns once the running transfer ended, or ctx did. With none
// running it pauses a millisecond: Raft goes on refusing for a moment
// after a transfer (it clears its flag after answering it).
func (h *handover) wait(ctx context.Context) error {
	h.mu.Lock()
	ch := h.done
	h.mu.Unlock()
	var pause <-chan time.Time
	if ch == nil {
		pause = time.After(time.Millisecond)
	}
	select {
	case <-ch:
	case <-pause:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// refusedUnlogged tells whether Raft refused a proposal before it logged
// it because this node is not the leader or is handing leadership over.
func refusedUnlogged(err error) bool {
	return errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipTransferInProgress)
}
