package node

import (
	"bufio"
	"context"
	"encoding/hex"
	"io"
	"os"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/snapshots"
)

// Node serves the gRPC API.
var (
	_ service.Data  = (*Node)(nil)
	_ service.Admin = (*Node)(nil)
)

// Now is the leader's command clock in Unix milliseconds.
func (n *Node) Now() int64 { return n.now() }

// ClientTTLMs is the client session TTL in force.
func (n *Node) ClientTTLMs() int64 {
	var ttl int64
	n.sm.read(func(f *fsm.FSM) { ttl = f.Params().ClientTTLMs })
	return ttl
}

// ViewVersion is the term this node was promoted leader in (0 when it is
// not the promoted leader).
func (n *Node) ViewVersion() uint64 { return n.promotedTerm.Load() }

// SegmentStatus is a linearizable read of one segment, or of all.
func (n *Node) SegmentStatus(ctx context.Context, ref string, byName bool) ([]fsm.SegmentStatus, error) {
	var (
		out  []fsm.SegmentStatus
		rerr error
	)
	err := n.linearizable(ctx, func() error {
		n.sm.read(func(f *fsm.FSM) { out, rerr = service.SegmentStatusOf(f, ref, byName) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, rerr
}

// GetReplicaListByRegex is a linearizable read of every complete object
// whose key matches; each found object is leased like GetReplicaList.
func (n *Node) GetReplicaListByRegex(ctx context.Context, regex string) ([]fsm.KeyReplicas, error) {
	var (
		out  []fsm.KeyReplicas
		rerr error
	)
	err := n.linearizable(ctx, func() error {
		return n.gate.readAll(ctx, func() {
			n.sm.read(func(f *fsm.FSM) { out, rerr = f.GetReplicaListByRegex(regex, n.now()) })
			for _, kr := range out {
				n.renew(kr.Grant)
			}
		})
	})
	if err != nil {
		return nil, err
	}
	return out, rerr
}

// Members lists the Raft configuration with every member's client address
// the replicated state holds (each member has the leader record its own:
// announceLoop), this node's and the promoted leader's also before that.
func (n *Node) Members(ctx context.Context) ([]service.Member, error) {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, n.raftErr(err, false)
	}
	_, leader := n.raft.LeaderWithID()
	var (
		st    fsm.Stats
		addrs map[string]string
	)
	n.sm.read(func(f *fsm.FSM) { st, addrs = f.Stats(), f.MemberAddrs() })
	var out []service.Member
	for _, s := range cf.Configuration().Servers {
		m := service.Member{ID: string(s.ID), RaftAddr: string(s.Address), Suffrage: s.Suffrage.String(), Leader: s.ID == leader,
			GRPCAddr: addrs[string(s.ID)]}
		switch string(s.ID) {
		case n.cfg.ID:
			m.GRPCAddr = n.cfg.GRPCAddr
		case st.LeaderID:
			m.GRPCAddr = st.LeaderAddr
		}
		out = append(out, m)
	}
	return out, nil
}

// AddVoter adds a server to the cluster (leader only); a voter already at
// raftAddr is left as it is, so a member may call it again to have its
// client address recorded.
func (n *Node) AddVoter(ctx context.Context, id, raftAddr, grpcAddr string) error {
	if err := n.AwaitLeader(ctx); err != nil {
		return err
	}
	if id == "" || raftAddr == "" {
		return errcode.New(errcode.InvalidParams, "add voter needs an id and a raft address")
	}
	if s, ok := n.server(id); !ok || s.Address != raft.ServerAddress(raftAddr) || s.Suffrage != raft.Voter {
		if err := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, timeoutOf(ctx, adminTimeout)).Error(); err != nil {
			return n.raftErr(err, true)
		}
	}
	if grpcAddr == "" {
		return nil
	}
	return n.recordMember(ctx, id, grpcAddr)
}

// RemoveServer removes a server from the cluster (leader only).
func (n *Node) RemoveServer(ctx context.Context, id string) error {
	if err := n.AwaitLeader(ctx); err != nil {
		return err
	}
	if n.serverAddr(id) == "" {
		return errcode.New(errcode.InvalidParams, "no member %q", id)
	}
	if err := n.raft.RemoveServer(raft.ServerID(id), 0, timeoutOf(ctx, adminTimeout)).Error(); err != nil {
		return n.raftErr(err, true)
	}
	return n.recordMember(ctx, id, "")
}

// SnapshotSave streams a fresh snapshot of the leader's state into w. The
// state is captured under the lock (cheap, copy-on-write) after a quorum
// check, and written while Apply goes on.
func (n *Node) SnapshotSave(ctx context.Context, w io.Writer) error {
	if err := n.confirmLeader(ctx); err != nil {
		return err
	}
	s, err := n.sm.Snapshot()
	if err != nil {
		return err
	}
	fs := s.(*fsmSnapshot)
	return fs.snap.Write(w, fs.hdr)
}

// SnapshotRestore installs a snapshot on the whole cluster through Raft
// (raft.Restore). The file is spooled and verified first, so a bad one
// changes nothing.
func (n *Node) SnapshotRestore(ctx context.Context, r io.Reader) error {
	if err := n.AwaitLeader(ctx); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(n.cfg.DataDir, "restore-*.snap")
	if err != nil {
		return errcode.New(errcode.FileWriteFail, "spool snapshot: %v", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	size, err := io.Copy(tmp, r)
	if err != nil {
		return errcode.New(errcode.FileReadFail, "receive snapshot: %v", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return errcode.New(errcode.FileReadFail, "spool snapshot: %v", err)
	}
	sum, err := snapshots.Inspect(bufio.NewReader(tmp))
	if err != nil {
		return err
	}
	if sum.Header.ClusterID != n.cfg.ClusterID {
		return errcode.New(errcode.InvalidParams, "snapshot is of cluster %q, this is %q", sum.Header.ClusterID, n.cfg.ClusterID)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return errcode.New(errcode.FileReadFail, "spool snapshot: %v", err)
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return n.raftErr(err, false)
	}
	// The state is swapped under the reads, and this term's Promote must
	// be applied again before a lease read may trust it.
	defer n.leadership.suspend()()
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Index: sum.Header.RaftIndex, Term: sum.Header.RaftTerm,
		Configuration: cf.Configuration(), ConfigurationIndex: cf.Index(), Size: size}
	if err := n.raft.Restore(meta, bufio.NewReader(tmp), timeoutOf(ctx, adminTimeout)); err != nil {
		return errcode.New(errcode.InternalError, "restore through raft: %v", err)
	}
	// The snapshot's session deadlines and leases are as old as the file:
	// promote again, as a new leader would, so the next tick does not
	// expire every client and drop their objects.
	if n.promote(ctx) == 0 {
		return errcode.New(errcode.UnavailableInCurrentStatus, "snapshot restored, but re-promotion failed; the next leader will promote")
	}
	n.log.Info("restored snapshot", "objects", sum.Header.Objects, "file_digest", hex.EncodeToString(sum.Digest[:]))
	return nil
}

// adminTimeout bounds an admin call to Raft (membership, restore) whose
// context has no deadline.
const adminTimeout = 30 * time.Second
