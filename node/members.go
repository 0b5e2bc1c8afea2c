package node

import (
	"context"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/raftstore"
)

// recordMember has the replicated state hold grpcAddr as member id's client
// address ("" forgets it), unless it does already.
func (n *Node) recordMember(ctx context.Context, id, grpcAddr string) error {
	var have string
	n.sm.read(func(f *fsm.FSM) { have = f.MemberAddrs()[id] })
	if have == grpcAddr {
		return nil
	}
	r, err := n.apply(ctx, &fsm.Member{ID: id, GRPCAddr: grpcAddr})
	if err != nil {
		return err
	}
	return r.Err
}

// announceLoop has the leader record this follower's client address, so
// that members list names it on every node (a bootstrapped member never
// joined through AddVoter). It asks with AddVoter, which leaves the
// configuration alone for a voter already at this Raft address, until the
// replicated state holds the address: at once, then backing off from a
// second to a minute while asking has no effect (a leader of an older
// release ignores the address and appends a configuration entry each time).
func (n *Node) announceLoop(ctx context.Context) {
	const poll, first, most = 100 * time.Millisecond, time.Second, time.Minute
	t := time.NewTicker(poll)
	defer t.Stop()
	var (
		wait       = first
		next       time.Time
		lastLeader string
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n.cfg.GRPCAddr == "" || n.IsLeader() {
			continue
		}
		var (
			st   fsm.Stats
			have string
		)
		n.sm.read(func(f *fsm.FSM) { st, have = f.Stats(), f.MemberAddrs()[n.cfg.ID] })
		if st.LeaderAddr != lastLeader { // a new leader: ask it soon
			lastLeader, wait, next = st.LeaderAddr, first, time.Now()
		}
		if have == n.cfg.GRPCAddr || st.LeaderAddr == "" || time.Now().Before(next) {
			continue
		}
		self, known := n.server(n.cfg.ID)
		if !known || self.Suffrage != raft.Voter {
			continue
		}
		if err := n.announce(ctx, st.LeaderAddr, string(self.Address)); err != nil && wait == first {
			n.log.Warn("could not have the leader record this node's client address; retrying", "leader", st.LeaderAddr, "error", err)
		}
		next = time.Now().Add(wait)
		wait = min(2*wait, most)
	}
}

func (n *Node) announce(ctx context.Context, leader, raftAddr string) error {
	c, err := client.Dial(n.clientConfig(leader))
	if err != nil {
		return err
	}
	defer c.Close()
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.AddVoter(actx, n.cfg.ID, raftAddr, n.cfg.GRPCAddr)
}

// refuseRebootstrap refuses to start node cfg.ID on an empty data dir when
// etcd shows it had Raft state of this cluster before (RegisterNode at its
// first start): a member whose data dir was lost would come back having
// forgotten its vote, and could vote twice in a term. It must rejoin. A
// member starting for the first time, however late, is not registered.
func refuseRebootstrap(ctx context.Context, cfg Config, store *etcdbridge.Store) error {
	if !cfg.Bootstrap {
		return nil // --join with an empty data dir is the way back
	}
	if ls, _ := raftstore.DetectLogStore(cfg.DataDir); ls != "" {
		return nil // a restart on its own state
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	known, err := store.NodeRegistered(ctx, cfg.ID)
	if err != nil || !known {
		return err
	}
	return errcode.New(errcode.InvalidParams,
		"node %s had Raft state of cluster %q (etcd registered it at its first start), but its data dir %s is empty: "+
			"started again it would have forgotten its vote. Remove it from the cluster (moonctl members remove %s) and start it "+
			"with an empty data dir and --join HOST:GRPCPORT of a member, not --bootstrap; or, for a new cluster, use another --cluster-id or --etcd-prefix",
		cfg.ID, store.Config().ClusterID, cfg.DataDir, cfg.ID)
}

// registerNode records this node's id in etcd (refuseRebootstrap reads it)
// and reports whether it did.
func (n *Node) registerNode(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := n.etcd.RegisterNode(rctx, n.cfg.ID); err != nil {
		n.log.Warn("could not register this node in etcd yet (until it is, a start on a lost data dir is not refused)", "error", err)
		return false
	}
	return true
}

// registerLoop retries registerNode, backing off to once a minute, until
// it succeeds or ctx ends.
func (n *Node) registerLoop(ctx context.Context) {
	for wait := time.Second; !n.registerNode(ctx); wait = min(2*wait, time.Minute) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
