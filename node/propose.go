package node

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/service"
)

// IsLeader reports whether this node is the promoted leader, ready to
// serve: the leader of the term in which it applied its Promote.
func (n *Node) IsLeader() bool {
	t := n.promotedTerm.Load()
	return t != 0 && n.raft.State() == raft.Leader && t == n.raft.CurrentTerm()
}

// Propose replicates a client command and returns its result. It is only
// served by the promoted leader. Removals and upserts first flush pending
// lease renewals and hold reads of their keys until applied, so a lease a
// read has returned is never broken (docs/ARCHITECTURE.md, "Invariants").
func (n *Node) Propose(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	if err := n.AwaitLeader(ctx); err != nil {
		return fsm.Result{}, err
	}
	if err := n.admitWrite(); err != nil {
		return fsm.Result{}, err
	}
	defer n.pendingWrites.Add(-1)
	paced, err := n.pacer.admit(ctx, entriesOf(cmd))
	if err != nil {
		return fsm.Result{}, err
	}
	defer paced()
	var release func()
	switch c := cmd.(type) {
	case *fsm.Remove, *fsm.UpsertStart:
		release = n.gateKeys([]fsm.Command{c})
	case *fsm.GracefulUnmount:
		if bound := n.cfg.GracefulUnmountMax.Milliseconds(); c.GraceMs == 0 || c.GraceMs > bound {
			c.GraceMs = bound
		}
	case *fsm.RemoveByRegex:
		if !c.Force {
			release = n.gate.closeAll()
		}
	case *fsm.RemoveAll:
		if !c.Force {
			release = n.gate.closeAll()
		}
	}
	if release != nil {
		defer release()
		if _, err := n.tick(ctx, true); err != nil {
			return fsm.Result{}, err
		}
	}
	r, err := n.apply(ctx, cmd)
	if err == nil && r.Code() == errcode.NoAvailableHandle {
		n.needSpace.Store(true)
	}
	return r, err
}

// ProposeBatch replicates puts as one log entry (one Raft round trip for a
// whole batch RPC), applied in order with a result each.
func (n *Node) ProposeBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, error) {
	if err := n.AwaitLeader(ctx); err != nil {
		return nil, err
	}
	if err := n.admitWrite(); err != nil {
		return nil, err
	}
	defer n.pendingWrites.Add(-1)
	for i, c := range cmds {
		if !fsm.Batchable(c) {
			return nil, errcode.New(errcode.InvalidParams, "batch item %d: %T cannot be batched", i, c)
		}
	}
	batch := &fsm.Batch{Cmds: cmds}
	paced, err := n.pacer.admit(ctx, entriesOf(batch))
	if err != nil {
		return nil, err
	}
	defer paced()
	if release := n.gateKeys(cmds); release != nil {
		defer release()
		if _, err := n.tick(ctx, true); err != nil {
			return nil, err
		}
	}
	r, err := n.apply(ctx, batch)
	if err != nil {
		return nil, err
	}
	for _, br := range r.Batch {
		if br.Code() == errcode.NoAvailableHandle {
			n.needSpace.Store(true)
		}
	}
	return r.Batch, nil
}

// admitWrite counts a client write in (the caller counts it out once it is
// applied), or refuses it when MaxPendingWrites are already waiting for
// the log. Under a herd of clients a queue without bound makes every write
// wait longer than its caller's deadline: all of them time out, none is of
// use to anyone, and the log still carries them. Refused at once, the
// excess costs little and the writes let in finish in time.
func (n *Node) admitWrite() error {
	p := n.pendingWrites.Add(1)
	if limit := n.cfg.MaxPendingWrites; limit >= 0 && p > int64(limit) {
		n.pendingWrites.Add(-1)
		n.metrics.writesRefused.Inc()
		return errcode.New(errcode.TooManyRequests,
			"%d writes are waiting for the log on this node, the limit is %d (--max-pending-writes); this one was not applied, retry after a short wait",
			p-1, limit)
	}
	return nil
}

// gateKeys holds reads of the keys that cmds check leases of (unforced
// removes, upserts) and returns what releases them, or nil if none does.
func (n *Node) gateKeys(cmds []fsm.Command) func() {
	var releases []func()
	for _, c := range cmds {
		switch c := c.(type) {
		case *fsm.Remove:
			if !c.Force {
				releases = append(releases, n.gate.closeKey(c.Key))
			}
		case *fsm.UpsertStart:
			releases = append(releases, n.gate.closeKey(c.Key))
		}
	}
	if len(releases) == 0 {
		return nil
	}
	return func() {
		for _, r := range releases {
			r()
		}
	}
}

// apply proposes cmd through Raft and waits for it to be applied here.
// Raft refuses a proposal, unlogged, while this node hands leadership
// over: apply waits for the handover's outcome and proposes again if this
// node still leads, or answers as a follower if it does not. After a
// failed transfer Raft refuses for a moment longer (until its transfer
// goroutine ends), so apply keeps trying for two election timeouts (the
// transfer's own bound, and as much again) from the first refusal.
func (n *Node) apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	data := fsm.Encode(cmd)
	var until time.Time
	for {
		timeout := timeoutOf(ctx, 10*time.Second)
		if timeout <= 0 {
			return fsm.Result{}, errcode.New(errcode.UnavailableInCurrentStatus, "deadline passed before the write was sent")
		}
		f := n.raft.Apply(data, timeout)
		err := n.wait(f)
		if errors.Is(err, raft.ErrLeadershipTransferInProgress) {
			if until.IsZero() {
				until = time.Now().Add(2 * n.cfg.ElectionTimeout)
			}
			if n.handover.wait(ctx) == nil {
				switch {
				case !n.IsLeader():
					err = raft.ErrNotLeader
				case time.Now().Before(until):
					continue
				}
			}
		}
		service.TraceWrite(ctx, refusedUnlogged(err))
		if err != nil {
			return fsm.Result{}, n.raftErr(err, true)
		}
		r, _ := f.Response().(fsm.Result)
		return r, nil
	}
}

// wait returns f's error. hashicorp/raft never answers a future that it
// had queued but not taken up when it shut down (hashicorp/raft#498; with
// BatchApplyCh the apply queue is buffered): once this node has shut Raft
// down, wait stops waiting, and the goroutine left on f ends with the
// process.
func (n *Node) wait(f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-n.raftDown:
		return raft.ErrRaftShutdown
	}
}

// linearizable runs read so that what it sees is linearizable: under the
// read lease when this node holds one, else after a quorum round that began
// after the call. read may run twice (a lease that lapsed while it read is
// not trusted), so it may only record what is harmless to record twice,
// such as lease renewals. Under service.NoWait it gives up where it
// would wait (AwaitLeader, confirmLeader, the gate).
func (n *Node) linearizable(ctx context.Context, read func() error) error {
	if err := n.AwaitLeader(ctx); err != nil {
		return err
	}
	if tok, ok := n.leadership.lease(); ok {
		if err := read(); err != nil {
			return err
		}
		// Checked again after the read: had the lease lapsed or this node
		// stepped down meanwhile (a pause, a slow gate), another leader may
		// have changed what was read.
		if n.leadership.holds(tok) && n.IsLeader() {
			n.metrics.leaseReads.Inc()
			return nil
		}
	}
	if err := n.confirmLeader(ctx); err != nil {
		return err
	}
	n.metrics.quorumReads.Inc()
	return read()
}

// confirmLeader waits for a quorum round that began after the call
// (under service.NoWait it gives up instead).
func (n *Node) confirmLeader(ctx context.Context) error {
	if err := n.AwaitLeader(ctx); err != nil {
		return err
	}
	if service.MustNotWait(ctx) {
		return errWouldWait
	}
	if err := n.leadership.confirm(ctx); err != nil {
		return n.raftErr(err, false)
	}
	return nil
}

// GetReplicaList is a linearizable read of key that grants a read lease:
// the renewal is recorded for the next Tick before the answer goes out.
func (n *Node) GetReplicaList(ctx context.Context, key string) ([]oplog.ReplicaDesc, fsm.Grant, error) {
	var r [1]fsm.KeyRead // on the stack: a lone read allocates no batch
	if err := n.batchRead(ctx, []string{key}, r[:], (*fsm.FSM).GetReplicaLists); err != nil {
		return nil, fsm.Grant{}, err
	}
	return r[0].Replicas, r[0].Grant, r[0].Err
}

// ExistKey is a linearizable existence check that grants a lease if found.
func (n *Node) ExistKey(ctx context.Context, key string) (bool, fsm.Grant, error) {
	var r [1]fsm.KeyRead
	if err := n.batchRead(ctx, []string{key}, r[:], (*fsm.FSM).ExistKeys); err != nil {
		return false, fsm.Grant{}, err
	}
	return r[0].Found, r[0].Grant, r[0].Err
}

// BatchGetReplicaList reads every key in one pass: one leadership check,
// one gate pass and one state lock for the whole batch.
func (n *Node) BatchGetReplicaList(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return n.readEach(ctx, keys, (*fsm.FSM).GetReplicaLists)
}

// BatchExistKey checks every key in one pass, like BatchGetReplicaList.
func (n *Node) BatchExistKey(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return n.readEach(ctx, keys, (*fsm.FSM).ExistKeys)
}

// keysReader reads keys[i] into out[i] as of nowMs.
type keysReader = func(f *fsm.FSM, keys []string, nowMs int64, out []fsm.KeyRead)

func (n *Node) readEach(ctx context.Context, keys []string, read keysReader) ([]fsm.KeyRead, error) {
	out := make([]fsm.KeyRead, len(keys))
	if err := n.batchRead(ctx, keys, out, read); err != nil {
		return nil, err
	}
	return out, nil
}

// batchRead reads keys[i] into out[i].
func (n *Node) batchRead(ctx context.Context, keys []string, out []fsm.KeyRead, read keysReader) error {
	return n.linearizable(ctx, func() error {
		return n.gate.readKeys(ctx, keys, func() {
			now := n.now()
			n.sm.read(func(f *fsm.FSM) { read(f, keys, now, out) })
			for _, r := range out {
				if r.Found {
					n.renew(r.Grant)
				}
			}
		})
	})
}

// renew records the lease a read returned for a later Tick.
func (n *Node) renew(g fsm.Grant) {
	n.batcher.Renew(g.Renewal.Key, g.Renewal.AtMs, g.CurrentMs, g.UntilMs, g.SoftPin)
}

// Ping records a client's liveness for the next Tick and reports whether
// the client must remount (it has no session). It is answered from this
// node's own sessions, without proving that it still leads: no read
// lease, no quorum round. A ping counts only once a Tick carries it through
// the log, which a deposed leader cannot append to, and a new leader gives
// every session at least a full TTL at its promotion; so a deposed leader's answers,
// until it steps down within its leader lease, cost a client nothing. A
// promoted leader has applied every entry before its Promote, so its
// sessions hold every mount it could be asked about. Pings that waited for
// a round, once the read lease had lapsed under load, took seconds: at
// three million objects and 10,000 clients hundreds of sessions expired
// and were remounted, and pings released together starved the leader's
// Raft goroutines (docs/RELIABILITY.md, findings 27 and 32).
func (n *Node) Ping(_ context.Context, clientID string) (needRemount bool, err error) {
	if !n.IsLeader() {
		return false, n.notLeader()
	}
	if !n.sm.hasSession(clientID) {
		return true, nil
	}
	n.batcher.Ping(clientID, n.now())
	return false, nil
}

// timeoutOf is the time left until ctx's deadline, or fallback without one.
func timeoutOf(ctx context.Context, fallback time.Duration) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d)
	}
	return fallback
}
