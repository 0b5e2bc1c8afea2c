package service

import (
	"context"
	"io"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
)

// Data is what a front door serves to clients. Errors are *errcode.Error
// values: NOT_LEADER carries the leader's client address as its message.
type Data interface {
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
	// Ping renews a client session; needRemount when it has none. Unlike
	// the other calls it does not wait out an election: with no promoted
	// leader it fails at once, and the client pings again later.
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
	// Status is the serving node's report of itself, as `moonctl status`
	// shows it; Progress is the same without the digests (cheap, for
	// polling).
	Status() *NodeStatus
	Progress() *NodeStatus
}

// Admin is what operators call on a node of the Raft group.
type Admin interface {
	Members(ctx context.Context) ([]Member, error)
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

// NodeStatus is one node's view of itself and of its cluster.
type NodeStatus struct {
	ID       string // Raft server ID
	RaftAddr string
	GRPCAddr string
	HTTPAddr string
	Role     string // leader | follower | candidate | shutdown | etcd-follower
	Term     uint64
	// AppliedIndex and Digest are read together: nodes at equal applied
	// indexes show equal digests.
	AppliedIndex   uint64
	CommitIndex    uint64
	AppliedSeq     uint64 // last OpLog sequence id produced
	Digest         string // hex state digest
	LeaderID       string
	LeaderGRPCAddr string
	Objects        uint64
	Segments       uint64
	Sessions       uint64
	UsedBytes      uint64
	CapacityBytes  uint64
	ExportRingLen  uint64 // OpLog entries not yet acknowledged by etcd
	NowMs          int64  // the state machine's command clock
	Promoted       bool   // a leader that finished promotion and serves clients
	ExportedSeq    uint64 // last OpLog seq this leader wrote to etcd (0 on followers or without etcd)
	EtcdExport     bool   // the cluster exports its OpLog to etcd
	// ObjectSetDigest is the hex SHA-256 of (key, size, key_sequence_id)
	// of complete objects: comparable with an etcd follower's.
	ObjectSetDigest      string
	ReadMode             string // lease | quorum
	ReadLeaseRemainingMs int64  // how long the leader's read lease still holds (0: none)
	DiskError            string // the last failed write of the Raft log or a snapshot ("" once one succeeds again)
	// The export's flow control, on the leader with etcd: the age of the
	// oldest entry etcd has not taken, the rate it takes them at, the
	// writes waiting for it now, and why it takes none ("" while it does).
	ExportBacklogMs int64
	ExportTakeRate  float64
	WritesPaced     uint64
	EtcdError       string
	// ExportDeferred is the REMOVEs of bulk removals waiting to enter the
	// export ring (every node holds them).
	ExportDeferred uint64
	// LastLogIndex is the last entry in this node's Raft log, committed or
	// not; LastContactMs, on a follower, how long ago Raft last heard from
	// its leader (-1: not since the node started). Together they tell
	// whether a follower still takes a silent leader's entries.
	LastLogIndex  uint64
	LastContactMs int64
}

// Member is one server of the Raft configuration.
type Member struct {
	ID       string
	RaftAddr string
	GRPCAddr string
	Suffrage string // hashicorp/raft's: Voter | Nonvoter | Staging
	Leader   bool
}
