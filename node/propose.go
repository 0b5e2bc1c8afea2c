package node

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
)

// IsLeader reports whether this node is the promoted leader, ready to serve.
func (n *Node) IsLeader() bool {
	return n.promoted.Load() && n.raft.State() == raft.Leader
}

// Propose replicates a client command and returns its result. It is only
// served by the promoted leader. Removals first flush pending lease
// renewals and hold reads of what they remove until applied, so a lease a
// read has returned is never broken (DESIGN.md, "Time, leases, eviction").
func (n *Node) Propose(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	if err := n.awaitLeader(ctx); err != nil {
		return fsm.Result{}, err
	}
	var release func()
	switch c := cmd.(type) {
	case *fsm.Remove:
		if !c.Force {
			release = n.gate.closeKey(c.Key)
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
		if _, err := n.tick(ctx); err != nil {
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
	if err := n.awaitLeader(ctx); err != nil {
		return nil, err
	}
	for i, c := range cmds {
		if !fsm.Batchable(c) {
			return nil, errcode.New(errcode.InvalidParams, "batch item %d: %T cannot be batched", i, c)
		}
	}
	r, err := n.apply(ctx, &fsm.Batch{Cmds: cmds})
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

// apply proposes cmd through Raft and waits for it to be applied here.
func (n *Node) apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	timeout := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
		if timeout <= 0 {
			return fsm.Result{}, errcode.New(errcode.UnavailableInCurrentStatus, "deadline passed before the write was sent")
		}
	}
	f := n.raft.Apply(fsm.Encode(cmd), timeout)
	if err := f.Error(); err != nil {
		return fsm.Result{}, n.raftErr(err, true)
	}
	r, _ := f.Response().(fsm.Result)
	return r, nil
}

// Read runs fn on the leader's state after confirming leadership with a
// quorum, so the read is linearizable; concurrent reads share one round.
func (n *Node) Read(ctx context.Context, fn func(f *fsm.FSM)) error {
	if err := n.verifyLeader(ctx); err != nil {
		return err
	}
	return n.gate.readAll(ctx, func() { n.sm.read(fn) })
}

func (n *Node) verifyLeader(ctx context.Context) error {
	if err := n.awaitLeader(ctx); err != nil {
		return err
	}
	if err := n.verifier.verify(ctx); err != nil {
		return n.raftErr(err, false)
	}
	return nil
}

// GetReplicaList is a linearizable read of key that grants a read lease:
// the renewal is recorded for the next Tick before the answer goes out.
func (n *Node) GetReplicaList(ctx context.Context, key string) ([]oplog.ReplicaDesc, fsm.Grant, error) {
	var (
		descs []oplog.ReplicaDesc
		grant fsm.Grant
		err   error
	)
	if verr := n.verifyLeader(ctx); verr != nil {
		return nil, grant, verr
	}
	gerr := n.gate.read(ctx, key, func() {
		n.sm.read(func(f *fsm.FSM) { descs, grant, err = f.GetReplicaList(key, n.now()) })
		if err == nil {
			n.batcher.Renew(key, grant.Renewal.AtMs, grant.CurrentMs)
		}
	})
	if gerr != nil {
		return nil, grant, gerr
	}
	return descs, grant, err
}

// ExistKey is a linearizable existence check that grants a lease if found.
func (n *Node) ExistKey(ctx context.Context, key string) (bool, fsm.Grant, error) {
	var (
		ok    bool
		grant fsm.Grant
		err   error
	)
	if verr := n.verifyLeader(ctx); verr != nil {
		return false, grant, verr
	}
	gerr := n.gate.read(ctx, key, func() {
		n.sm.read(func(f *fsm.FSM) { ok, grant, err = f.ExistKey(key, n.now()) })
		if ok {
			n.batcher.Renew(key, grant.Renewal.AtMs, grant.CurrentMs)
		}
	})
	if gerr != nil {
		return false, grant, gerr
	}
	return ok, grant, err
}

// Ping records a client's liveness for the next Tick and reports whether
// the client must remount (it has no session).
func (n *Node) Ping(ctx context.Context, clientID string) (needRemount bool, err error) {
	if err := n.verifyLeader(ctx); err != nil {
		return false, err
	}
	n.sm.read(func(f *fsm.FSM) { needRemount = !f.HasSession(clientID) })
	if !needRemount {
		n.batcher.Ping(clientID, n.now())
	}
	return needRemount, nil
}
