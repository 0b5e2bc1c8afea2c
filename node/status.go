package node

import (
	"encoding/hex"

	"github.com/moonraft/moonraft/fsm"
)

// Status is what `moonctl status` shows for one node.
type Status struct {
	ID           string
	RaftAddr     string
	GRPCAddr     string
	Role         string // Leader, Follower, Candidate, Shutdown
	Promoted     bool
	Term         uint64
	AppliedIndex uint64
	CommitIndex  uint64
	LeaderID     string
	Digest       string // hex SHA-256 of the state at AppliedIndex
	State        fsm.Stats
}

// Status reports this node's view; the digest and applied index are taken
// together under the state lock, so equal indexes must mean equal digests.
func (n *Node) Status() Status {
	_, leader := n.raft.LeaderWithID()
	st := Status{
		ID:          n.cfg.ID,
		RaftAddr:    string(n.trans.LocalAddr()),
		GRPCAddr:    n.cfg.GRPCAddr,
		Role:        n.raft.State().String(),
		Promoted:    n.IsLeader(),
		Term:        n.raft.CurrentTerm(),
		CommitIndex: n.raft.CommitIndex(),
		LeaderID:    string(leader),
	}
	n.sm.read(func(f *fsm.FSM) {
		d := f.Digest()
		st.Digest = hex.EncodeToString(d[:])
		st.State = f.Stats()
		st.AppliedIndex = n.sm.appliedIndex.Load()
	})
	return st
}
