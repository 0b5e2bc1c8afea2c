package node

import (
	"encoding/hex"
	"strings"
	"time"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/service"
)

// Status reports this node's view, as `moonctl status` shows it. The
// digests are of a snapshot taken with the applied index, under the state
// lock, so nodes at equal applied indexes must show equal digests; they are
// computed after the lock is let go, since a pass over millions of objects
// takes seconds that applies and reads would otherwise wait (RELIABILITY
// finding 19).
func (n *Node) Status() *service.NodeStatus { return n.status(true) }

// Progress is Status without the digests: cheap enough to poll.
func (n *Node) Progress() *service.NodeStatus { return n.status(false) }

func (n *Node) status(digests bool) *service.NodeStatus {
	_, leader := n.raft.LeaderWithID()
	st := &service.NodeStatus{
		ID:           n.cfg.ID,
		RaftAddr:     string(n.trans.LocalAddr()),
		GRPCAddr:     n.cfg.GRPCAddr,
		Role:         strings.ToLower(n.raft.State().String()),
		Promoted:     n.IsLeader(),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		LastLogIndex: n.raft.LastIndex(),
		LeaderID:     string(leader),
		EtcdExport:   n.etcd != nil,
		ReadMode:     string(n.cfg.ReadMode),
		DiskError:    n.disk.String(),
	}
	if st.Role == "follower" {
		st.LastContactMs = -1
		if last := n.raft.LastContact(); !last.IsZero() {
			st.LastContactMs = time.Since(last).Milliseconds()
		}
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
	var snap *fsm.Snapshot
	stats := func(f *fsm.FSM) {
		if digests {
			snap = f.Snapshot()
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
	}
	if digests {
		n.sm.write(stats)
		d, od := snap.Digest(), snap.ObjectSetDigest()
		st.Digest = hex.EncodeToString(d[:])
		st.ObjectSetDigest = hex.EncodeToString(od[:])
	} else {
		n.sm.read(stats)
	}
	return st
}
