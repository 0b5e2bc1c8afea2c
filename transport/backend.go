package transport

import (
	"context"
	"io"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// Backend is what the server needs from a node (node.Node implements it).
// Errors are *errcode.Error values: NOT_LEADER carries the leader's client
// address as its message.
type Backend interface {
	// Now is the leader's clock (Unix ms) to stamp commands with.
	Now() int64
	// Propose replicates a write on the promoted leader.
	Propose(ctx context.Context, cmd fsm.Command) (fsm.Result, error)
	// ProposeBatch replicates puts (fsm.Batchable) as one entry, applied in
	// order; one result per command.
	ProposeBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, error)
	// Linearizable reads on the leader; those that find an object grant a lease.
	GetReplicaList(ctx context.Context, key string) ([]oplog.ReplicaDesc, fsm.Grant, error)
	ExistKey(ctx context.Context, key string) (bool, fsm.Grant, error)
	GetReplicaListByRegex(ctx context.Context, regex string) ([]fsm.KeyReplicas, error)
	// Batch reads: one answer per key, in order. The error is the batch's
	// (not the leader, say); a key's own error is in its answer.
	BatchGetReplicaList(ctx context.Context, keys []string) ([]fsm.KeyRead, error)
	BatchExistKey(ctx context.Context, keys []string) ([]fsm.KeyRead, error)
	// Ping renews a client session; needRemount when it has none.
	Ping(ctx context.Context, clientID string) (needRemount bool, err error)
	// ClientTTLMs is the session TTL clients ping within.
	ClientTTLMs() int64
	// ViewVersion is the term the serving leader was promoted in
	// (Mooncake's view_version): it changes exactly when a failover
	// happened; 0 for a backend without a Raft group.
	ViewVersion() uint64
	// SegmentStatus is a read of one mounted segment, by id or by name,
	// or with ref "" of every one, by id.
	SegmentStatus(ctx context.Context, ref string, byName bool) ([]fsm.SegmentStatus, error)

	// Admin.
	Status() *moonraftpb.NodeStatus
	// Progress is Status without the digests (cheap, for polling).
	Progress() *moonraftpb.NodeStatus
	Members(ctx context.Context) ([]*moonraftpb.Member, error)
	// AddVoter adds id as a voter (nothing to change if it is one at
	// raftAddr) and records grpcAddr, its client address, if not "".
	AddVoter(ctx context.Context, id, raftAddr, grpcAddr string) error
	RemoveServer(ctx context.Context, id string) error
	TransferLeadership(ctx context.Context, id string) error
	// SnapshotSave streams a fresh consistent snapshot of the leader's state.
	SnapshotSave(ctx context.Context, w io.Writer) error
	// SnapshotRestore installs a snapshot on the whole cluster through Raft.
	SnapshotRestore(ctx context.Context, r io.Reader) error
}

// NoAdmin answers Backend's membership and snapshot calls with Err, for a
// server with no Raft group behind it (the etcd follower, moonbench's
// baseline primary): embed it.
type NoAdmin struct{ Err error }

func (a NoAdmin) Members(context.Context) ([]*moonraftpb.Member, error)  { return nil, a.Err }
func (a NoAdmin) AddVoter(context.Context, string, string, string) error { return a.Err }
func (a NoAdmin) RemoveServer(context.Context, string) error             { return a.Err }
func (a NoAdmin) TransferLeadership(context.Context, string) error       { return a.Err }
func (a NoAdmin) SnapshotSave(context.Context, io.Writer) error          { return a.Err }
func (a NoAdmin) SnapshotRestore(context.Context, io.Reader) error       { return a.Err }

// SegmentStatusOf answers Backend.SegmentStatus from f.
func SegmentStatusOf(f *fsm.FSM, ref string, byName bool) ([]fsm.SegmentStatus, error) {
	if ref == "" {
		return f.SegmentStatuses(), nil
	}
	st, err := f.SegmentStatus(ref, byName)
	if err != nil {
		return nil, err
	}
	return []fsm.SegmentStatus{st}, nil
}

// BatchGetByKey answers a batch read one key at a time with get, for a
// backend without a batched path. An answer that says the backend cannot
// serve at all (a retryable code) is the whole batch's.
func BatchGetByKey(ctx context.Context, keys []string, get func(context.Context, string) ([]oplog.ReplicaDesc, fsm.Grant, error)) ([]fsm.KeyRead, error) {
	out := make([]fsm.KeyRead, len(keys))
	for i, k := range keys {
		descs, g, err := get(ctx, k)
		if err != nil && Retryable(errcode.Of(err)) {
			return nil, err
		}
		out[i] = fsm.KeyRead{Replicas: descs, Found: err == nil, Grant: g, Err: err}
	}
	return out, nil
}

// BatchExistByKey is BatchGetByKey for existence checks.
func BatchExistByKey(ctx context.Context, keys []string, exist func(context.Context, string) (bool, fsm.Grant, error)) ([]fsm.KeyRead, error) {
	out := make([]fsm.KeyRead, len(keys))
	for i, k := range keys {
		ok, g, err := exist(ctx, k)
		if err != nil && Retryable(errcode.Of(err)) {
			return nil, err
		}
		out[i] = fsm.KeyRead{Found: ok, Grant: g, Err: err}
	}
	return out, nil
}
