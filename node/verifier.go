package node

import (
	"context"
	"sync"

	"github.com/hashicorp/raft"
)

// verifier shares VerifyLeader rounds between concurrent readers: callers
// that arrive while a round runs wait for the next one, which starts after
// they arrived, so each read is still confirmed by a round that began after
// it — what linearizability needs — at one quorum round trip for the lot.
type verifier struct {
	r       *raft.Raft
	mu      sync.Mutex
	waiting []chan error
	running bool
}

func (v *verifier) verify(ctx context.Context) error {
	ch := make(chan error, 1)
	v.mu.Lock()
	v.waiting = append(v.waiting, ch)
	if !v.running {
		v.running = true
		go v.run()
	}
	v.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run serves rounds until nobody waits; VerifyLeader returns on shutdown, so
// it cannot outlive the Raft instance.
func (v *verifier) run() {
	for {
		v.mu.Lock()
		batch := v.waiting
		v.waiting = nil
		if len(batch) == 0 {
			v.running = false
			v.mu.Unlock()
			return
		}
		v.mu.Unlock()
		err := v.r.VerifyLeader().Error()
		for _, ch := range batch {
			ch <- err
		}
	}
}
