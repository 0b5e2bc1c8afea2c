package node

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// A leader whose disk stalls keeps its leadership: hashicorp/raft sends
// heartbeats from its replication goroutines, which go on while its main
// loop waits on a log write, and its own lease check runs in that loop. So
// the followers keep hearing from a leader that cannot commit (RELIABILITY
// finding 13). The disk watchdog cuts the leader's outgoing Raft traffic
// once a log write has been outstanding for stallAfter, so the
// followers elect another node, as they would replace a stopped process;
// the traffic resumes when the write returns, and the node, hearing of the
// newer term, steps down. Cutting traffic cannot break Raft's safety, and
// the read lease is safe too: it is renewed only by committed rounds,
// which a stalled disk has held up as long.

var errFenced = errors.New("outgoing raft traffic cut: this node's log writes are stalled")

// fencedStream is a raft.StreamLayer whose outgoing connections can be
// cut: closed, and new ones refused, until it is let go.
type fencedStream struct {
	raft.StreamLayer
	fenced atomic.Bool
	mu     sync.Mutex
	out    map[*outConn]struct{}
}

func newFencedStream(s raft.StreamLayer) *fencedStream {
	return &fencedStream{StreamLayer: s, out: map[*outConn]struct{}{}}
}

func (s *fencedStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.fenced.Load() {
		return nil, errFenced
	}
	c, err := s.StreamLayer.Dial(address, timeout)
	if err != nil {
		return nil, err
	}
	oc := &outConn{Conn: c, s: s}
	s.mu.Lock()
	s.out[oc] = struct{}{}
	s.mu.Unlock()
	if s.fenced.Load() { // cut while dialling
		_ = oc.Close()
		return nil, errFenced
	}
	return oc, nil
}

// cut closes every outgoing connection and refuses new ones until let go.
func (s *fencedStream) cut() {
	if !s.fenced.CompareAndSwap(false, true) {
		return
	}
	s.mu.Lock()
	conns := make([]*outConn, 0, len(s.out))
	for c := range s.out {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (s *fencedStream) letGo() bool { return s.fenced.CompareAndSwap(true, false) }

type outConn struct {
	net.Conn
	s    *fencedStream
	once sync.Once
}

func (c *outConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.out, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

// stallAfter is how long a leader's log write may be outstanding before the
// watchdog cuts its traffic: a heartbeat timeout, as for a silent process,
// but at least a second, so that an fsync slowed by a busy host does not
// cost an election.
func (n *Node) stallAfter() time.Duration { return max(n.cfg.HeartbeatTimeout, time.Second) }

// A node whose log appends fail (a full disk) can still persist its votes
// (bbolt reuses free pages, raft-wal's meta database is small), so it can
// win an election, fail to store its first entry as leader, step down, and
// win again: its vote requests reset the others' election timers, and the
// cluster has no leader that lasts (RELIABILITY finding 17). While its
// appends fail it waits electionHoldBack times longer before it stands, so
// a healthy node is elected first; it still stands if none is.
const electionHoldBack = 10

// holdElections lengthens this node's Raft timeouts by electionHoldBack,
// or restores them.
func (n *Node) holdElections(hold bool) error {
	n.timeoutsMu.Lock()
	defer n.timeoutsMu.Unlock()
	rc := n.raft.ReloadableConfig()
	rc.HeartbeatTimeout, rc.ElectionTimeout = n.cfg.HeartbeatTimeout, n.cfg.ElectionTimeout
	if hold {
		rc.HeartbeatTimeout *= electionHoldBack
		rc.ElectionTimeout *= electionHoldBack
	}
	return n.raft.ReloadConfig(rc)
}

// diskWatchdog cuts this node's outgoing Raft traffic while it leads and
// a log write has been outstanding for longer than stallAfter, and restores
// it once no write is outstanding; and it holds the node back from
// elections while its log appends fail.
func (n *Node) diskWatchdog(ctx context.Context) {
	t := time.NewTicker(n.cfg.HeartbeatTimeout / 4)
	defer t.Stop()
	held := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if hold := n.disk.standing(diskLogAppend); hold != held {
			if err := n.holdElections(hold); err != nil {
				n.log.Error("could not change the Raft timeouts", "error", err)
			} else if held = hold; hold {
				n.log.Warn("log appends fail: this node waits longer before it stands for election, so a node that can write leads",
					"heartbeat_timeout", n.cfg.HeartbeatTimeout*electionHoldBack)
			} else {
				n.log.Info("log appends succeed again: Raft timeouts restored")
			}
		}
		since, pending := n.logWrites.outstanding()
		switch {
		case !pending:
			if n.stream.letGo() {
				n.log.Warn("log writes flow again: outgoing Raft traffic restored")
			}
		case time.Since(since) > n.stallAfter() && n.raft.State() == raft.Leader && !n.stream.fenced.Load():
			n.log.Error("a Raft log write has been outstanding too long: cutting this leader's outgoing Raft traffic so the followers elect another node",
				"outstanding", time.Since(since).Round(time.Millisecond))
			n.stream.cut()
		}
	}
}
