// Package raftnet is the Raft network of a node: stream layers over TCP
// and mutual TLS for hashicorp/raft's NetworkTransport, and the guarded
// transport that closes two of hashicorp/raft's hazards (heartbeats that
// change a term beside the main loop, and the pipeline deadlock), lets
// the first candidate after a leader's death win (elections.go) and holds
// an append to a peer that is starting again (redial.go).
package raftnet

import (
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// Transport is Raft's network transport with two of hashicorp/raft's
// hazards closed.
//
// Heartbeats that could change anything go through Raft's main loop. The
// transport's heartbeat fast path runs raft's appendEntries on the
// connection's goroutine, and a heartbeat of a newer term there makes the
// node a follower and raises its term beside a main loop that may still be
// leading (hashicorp/raft#695, unfixed in v1.8.0): a deposed leader then
// stamps the entries it is dispatching with the new leader's term, a
// follower takes them for the new leader's own and keeps them, and the
// states part (docs/RELIABILITY.md, finding 18). So only a heartbeat that
// FastHeartbeats' test passes — one of the current term, to a follower —
// takes the fast path: it changes nothing but when the follower last heard
// from its leader, and is answered at once instead of after the log write
// the main loop is in (finding 10). Every other heartbeat is an RPC like
// any other, taken up by the main loop between its other work.
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
type Transport struct {
	*raft.NetworkTransport
	rpcs    chan raft.RPC // what raft's main loop reads
	done    chan struct{} // closed by Close
	relayed chan struct{} // closed when relay returns
	once    sync.Once

	handler atomic.Pointer[func(raft.RPC)]                             // raft's heartbeat handler
	fast    atomic.Pointer[func(term uint64) bool]                     // FastHeartbeats' test
	holding atomic.Pointer[func(term uint64, peer raft.ServerID) bool] // HoldAppends' test (redial.go)

	// Elections (elections.go).
	beforePreVote atomic.Pointer[func()]
	span          atomic.Int64 // CoordinatePreVotes', a time.Duration
	candidatesMu  sync.Mutex
	candidates    map[string]*candidacy // by peer ID
	noted         chan struct{}         // closed, and replaced, when a candidacy is noted
	asked         map[string]ownRequest // the node's own pre-vote requests, by peer ID
}

// NewTransport is raft.NewNetworkTransportWithConfig, guarded.
func NewTransport(cfg *raft.NetworkTransportConfig) *Transport {
	return guard(raft.NewNetworkTransportWithConfig(cfg))
}

func guard(nt *raft.NetworkTransport) *Transport {
	t := &Transport{NetworkTransport: nt, rpcs: make(chan raft.RPC), done: make(chan struct{}), relayed: make(chan struct{}),
		candidates: map[string]*candidacy{}, noted: make(chan struct{}), asked: map[string]ownRequest{}}
	nt.SetHeartbeatHandler(t.heartbeat)
	go t.relay()
	return t
}

// relay hands raft's main loop every RPC the transport reads; heartbeat
// adds those it keeps off the fast path. It ends with Close.
func (t *Transport) relay() {
	defer close(t.relayed)
	in := t.NetworkTransport.Consumer()
	for {
		select {
		case rpc := <-in:
			if t.noteCandidacy(&rpc) {
				continue
			}
			select {
			case t.rpcs <- rpc:
			case <-t.done:
				return
			}
		case <-t.done:
			return
		}
	}
}

// Consumer is what raft's main loop reads: every RPC but the heartbeats
// answered on the fast path.
func (t *Transport) Consumer() <-chan raft.RPC { return t.rpcs }

// SetHeartbeatHandler keeps raft's fast-path handler for the heartbeats
// FastHeartbeats lets through.
func (t *Transport) SetHeartbeatHandler(fn func(raft.RPC)) { t.handler.Store(&fn) }

// FastHeartbeats lets a heartbeat of term take the fast path when
// current(term) says the node is a follower in that term. Until it is
// called every heartbeat goes to the main loop.
func (t *Transport) FastHeartbeats(current func(term uint64) bool) { t.fast.Store(&current) }

func (t *Transport) heartbeat(rpc raft.RPC) {
	// A node the test passed can have moved on before raft looks: to a
	// newer term, where raft ignores the heartbeat as older, or to a
	// pre-vote in the same term, which a heartbeat of its leader ends as
	// raft's own fast path would. It cannot lead in the heartbeat's term,
	// which has its leader (finding 18 needs a leading main loop).
	if h, fast := t.handler.Load(), t.fast.Load(); h != nil && fast != nil {
		if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok && (*fast)(req.Term) {
			(*h)(rpc)
			return
		}
	}
	select {
	case t.rpcs <- rpc:
	case <-t.done:
		rpc.Respond(nil, raft.ErrTransportShutdown)
	}
}

// Close closes the transport and ends its relay.
func (t *Transport) Close() error {
	t.once.Do(func() { close(t.done) })
	err := t.NetworkTransport.Close()
	<-t.relayed
	return err
}

func (t *Transport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
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
