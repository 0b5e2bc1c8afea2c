package node

import (
	"encoding/hex"
	"strings"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/service"
)

// Status reports this node's view, as `moonctl status` shows it. The digest
// and applied index are read together under the state lock, so nodes at
// equal applied indexes must show equal digests.
func (n *Node) Status() *service.NodeStatus { return n.status(true) }

// Progress is Status without the digests: cheap enough to poll.
func (n *Node) Progress() *service.NodeStatus { return n.status(false) }

func (n *Node) status(digests bool) *service.NodeStatus {
	_, leader := n.raft.LeaderWithID()
	st := &service.NodeStatus{
		ID:          n.cfg.ID,
		RaftAddr:    string(n.trans.LocalAddr()),
		GRPCAddr:    n.cfg.GRPCAddr,
		Role:        strings.ToLower(n.raft.State().String()),
		Promoted:    n.IsLeader(),
		Term:        n.raft.CurrentTerm(),
		CommitIndex: n.raft.CommitIndex(),
		LeaderID:    string(leader),
		EtcdExport:  n.etcd != nil,
		ReadMode:    string(n.cfg.ReadMode),
		DiskError:   n.disk.String(),
	}
	if st.Promoted {
		st.ExportedSeq = n.exportedSeq.Load()
		st.ReadLeaseRemainingMs = n.leadership.remaining().Milliseconds()
		if n.etcd != nil {
			st.ExportBacklogMs = n.backlogAge(st.ExportedSeq).Milliseconds()
			ps := n.pacer.stats()
			st.ExportTakeRate, st.WritesPaced, st.EtcdError = ps.TakeRate, uint64(ps.Waiting), ps.EtcdError
		}
	}
	n.sm.read(func(f *fsm.FSM) {
		if digests {
			d, od := f.Digest(), f.ObjectSetDigest()
			st.Digest = hex.EncodeToString(d[:])
			st.ObjectSetDigest = hex.EncodeToString(od[:])
		}
		s := f.Stats()
		st.AppliedIndex = n.sm.appliedIndex.Load()
		st.AppliedSeq = s.AppliedSeq
		st.LeaderGRPCAddr = s.LeaderAddr
		st.Objects = uint64(s.Objects)
		st.Segments = uint64(s.Segments)
		st.Sessions = uint64(s.Sessions)
		st.UsedBytes = s.UsedBytes
		st.CapacityBytes = s.CapacityBytes
		st.ExportRingLen = uint64(s.RingLen)
		deferred, _, _ := f.DeferredRemovals()
		st.ExportDeferred = uint64(deferred)
		st.NowMs = s.NowMs
	})
	return st
}
