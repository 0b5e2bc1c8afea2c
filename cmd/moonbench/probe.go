package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/moonraft/moonraft/client"
)

// probe is one writer of put pairs, recording each call's start, latency
// and outcome.
type probe struct {
	stop context.CancelFunc
	done chan struct{}
	mu   sync.Mutex
	obs  []probeObs
}

type probeObs struct {
	at  time.Time
	lat time.Duration
	err error
}

// startProbe starts a probe on a connection of its own, as a client
// apart from the load's would be.
func (s *scaleRun) startProbe(ctx context.Context, name string) (*probe, error) {
	cl, err := client.Dial(client.Config{Endpoints: s.lc.endpoints(), MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(ctx)
	p := &probe{stop: stop, done: make(chan struct{})}
	owner := s.clients[0].id
	go func() {
		defer close(p.done)
		defer cl.Close()
		for i := 0; ctx.Err() == nil; i++ {
			key := fmt.Sprintf("scale-%s/%d-%d", name, time.Now().UnixNano(), i)
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			at := time.Now()
			_, err := cl.PutStart(cctx, key, []uint64{scaleObject}, client.ReplicateConfig{ReplicaNum: 1}, owner)
			if err == nil {
				err = cl.PutEnd(cctx, key, owner)
			}
			cancel()
			if ctx.Err() != nil {
				return
			}
			p.mu.Lock()
			p.obs = append(p.obs, probeObs{at, time.Since(at), err})
			p.mu.Unlock()
			if err != nil {
				time.Sleep(10 * time.Millisecond)
			} else {
				s.filled.Add(1)
			}
		}
	}()
	return p, nil
}

// firstAnsweredAfter is how long after t the first write sent after t was
// answered, in ms (0: none yet). One sent before may have been answered
// by the old leader just before it died.
func (p *probe) firstAnsweredAfter(t time.Time) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range p.obs {
		if o.err == nil && o.at.After(t) {
			return float64(o.at.Add(o.lat).Sub(t).Microseconds()) / 1000
		}
	}
	return 0
}

// probeCall is one of the probe's put pairs around a kill: when it was
// sent and answered, in ms from the kill, and the error it ended with.
type probeCall struct {
	SentMs  float64 `json:"sent_ms"`
	EndedMs float64 `json:"ended_ms"`
	Error   string  `json:"error,omitempty"`
}

// callsAround is the probe's put pairs that ended after t, up to the first
// sent after t that was answered: where a failover's time went on the
// client's side.
func (p *probe) callsAround(t time.Time) []probeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	ms := func(at time.Time) float64 { return float64(at.Sub(t).Microseconds()) / 1000 }
	var out []probeCall
	for _, o := range p.obs {
		if !o.at.Add(o.lat).After(t) {
			continue
		}
		c := probeCall{SentMs: ms(o.at), EndedMs: ms(o.at.Add(o.lat))}
		if o.err != nil {
			c.Error = o.err.Error()
		}
		out = append(out, c)
		if o.err == nil && o.at.After(t) {
			break
		}
	}
	return out
}

// written is how many put pairs the probe has had answered OK.
func (p *probe) written() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n uint64
	for _, o := range p.obs {
		if o.err == nil {
			n++
		}
	}
	return n
}

func (p *probe) finish() []probeObs {
	p.stop()
	<-p.done
	return p.obs
}
