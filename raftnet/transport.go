// Package raftnet is the Raft network of a node: stream layers over TCP
// and mutual TLS for hashicorp/raft's NetworkTransport, and the guarded
// transport that closes two of hashicorp/raft's hazards (heartbeats beside
// the main loop, and the pipeline deadlock).
package raftnet

import (
	"sync"

	"github.com/hashicorp/raft"
)

// Transport is Raft's network transport with two of hashicorp/raft's
// hazards closed.
//
// Heartbeats go through Raft's main loop. The transport's heartbeat fast
// path runs raft's appendEntries on the connection's goroutine, and a
// heartbeat of a newer term there makes the node a follower and raises its
// term beside a main loop that may still be leading (hashicorp/raft#695,
// unfixed in v1.8.0): a deposed leader then stamps the entries it is
// dispatching with the new leader's term, a follower takes them for the
// new leader's own and keeps them, and the states part
// (docs/RELIABILITY.md, finding 18). Without a handler every heartbeat is
// an RPC like any other, taken up by the main loop between its other work.
//
// Append pipelines are guarded against hashicorp/raft's pipeline deadlock
// (hashicorp/raft#612, finding 16). When a follower rejects an append (its
// log store failed: a full or failing disk), raft's pipeline decoder stops
// reading responses; the sender may then send once more, and with the
// transport's default of two RPCs in flight that send waits forever for a
// decoder that is gone, while the transport's own decoder waits for a
// reader of the response before it. Heartbeats go on, so the follower
// never calls the election that would heal it: it gets no entry again
// until the leader changes. The guard reads every response and, once one
// has failed, refuses further sends, so raft closes the pipeline and goes
// back to its ordinary replication, which probes and backs off.
type Transport struct{ *raft.NetworkTransport }

// NewTransport is raft.NewNetworkTransportWithConfig, guarded.
func NewTransport(cfg *raft.NetworkTransportConfig) *Transport {
	return &Transport{raft.NewNetworkTransportWithConfig(cfg)}
}

// SetHeartbeatHandler installs no handler: see Transport.
func (Transport) SetHeartbeatHandler(func(raft.RPC)) {}

func (t Transport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	g := &guardedPipeline{inner: p, out: make(chan raft.AppendFuture), failed: make(chan struct{}),
		closed: make(chan struct{}), relayed: make(chan struct{})}
	go g.relay()
	return g, nil
}

type guardedPipeline struct {
	inner   raft.AppendPipeline
	out     chan raft.AppendFuture
	failed  chan struct{} // closed once a response failed
	closed  chan struct{} // closed by Close
	relayed chan struct{} // closed when relay returns

	failOnce, closeOnce sync.Once
}

// relay hands raft each response up to the first failed one and drops the
// rest, so the transport's decoder never waits for a reader that is gone.
// It ends with Close.
func (p *guardedPipeline) relay() {
	defer close(p.relayed)
	in := p.inner.Consumer()
	for {
		select {
		case f := <-in:
			select {
			case <-p.failed:
				continue
			default:
			}
			if f.Error() != nil || !f.Response().Success {
				p.failOnce.Do(func() { close(p.failed) })
			}
			select {
			case p.out <- f:
			case <-p.closed:
				return
			}
		case <-p.closed:
			return
		}
	}
}

// AppendEntries sends through the pipeline unless a response has failed:
// raft then stops the pipeline at this error.
func (p *guardedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	select {
	case <-p.failed:
		return nil, raft.ErrPipelineShutdown
	default:
	}
	return p.inner.AppendEntries(args, resp)
}

func (p *guardedPipeline) Consumer() <-chan raft.AppendFuture { return p.out }

func (p *guardedPipeline) Close() error {
	p.closeOnce.Do(func() { close(p.closed) })
	err := p.inner.Close()
	<-p.relayed
	return err
}
