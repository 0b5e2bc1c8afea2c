// Package node is the Raft host of one moonraft server: hashicorp/raft
// over raftstore's log stores and raftnet's transport, the state machine,
// leadership and read leases, the propose and read paths that implement
// the service contract, the leader loop (promotion, ticks) and its clock,
// and the OpLog export to etcd, paced to the rate etcd takes it.
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/raftnet"
	"github.com/moonraft/moonraft/raftstore"
)

// Node is one running server.
type Node struct {
	cfg   Config
	log   hclog.Logger
	now   func() int64
	clock *leaderClock // behind now, unless a test set Config.Now
	raft  *raft.Raft
	trans *raftnet.Transport
	store *raftstore.Checked
	disk  *diskHealth
	// The disk watchdog's view of log writes and its hold on the Raft
	// traffic (fence.go).
	logWrites *watchedLog
	stream    *fencedStream
	// timeoutsMu orders the reloads of Raft's timeouts (holdElections,
	// lookForLeader).
	timeoutsMu sync.Mutex
	// candidateAsked is when a candidate last asked this node, a follower
	// that still heard its leader, for a pre-vote (stand.go).
	candidateAsked instant
	sm             *stateMachine

	batcher    *lease.Batcher
	leadership *leadership
	gate       *gate
	handover   handover
	tickMu     sync.Mutex
	lastDrain  time.Time // the last DrainSegments; under tickMu
	// promotedTerm is the term in which this node, as leader, applied its
	// Promote; 0 when it is not the promoted leader.
	promotedTerm atomic.Uint64
	// needSpace is set when the leader refuses a PutStart for space before
	// proposing it, so the next Tick evicts.
	needSpace atomic.Bool
	// pendingWrites counts the client writes admitted and not yet applied
	// (admitWrite).
	pendingWrites atomic.Int64

	// hadState: the data dir held Raft state at start (a restart, which
	// neither bootstraps nor joins).
	hadState bool

	// stopListeners closes the listeners Config.Listen opened (nil: none).
	stopListeners func()

	serverTLS, clientTLS *tls.Config // nil: plaintext
	metrics              *nodeMetrics

	// OpLog export (nil etcd: export disabled).
	etcd        *etcdbridge.Store
	exportedSeq atomic.Uint64
	pacer       *pacer
	ringCh      chan struct{}     // a command was applied: the ring may have grown
	snapCh      chan snapshotDone // a snapshot was persisted
	renewMu     sync.Mutex
	renewed     map[string]struct{}

	notifyCh chan bool
	// leaderSignal wakes requests that wait out an election (AwaitLeader).
	leaderSignal *leaderSignal
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	closed       atomic.Bool
	raftDown     chan struct{} // closed once Raft has shut down
	halted       chan struct{} // closed when the state machine stops applying
	haltOnce     sync.Once
	haltErr      error
}

const (
	// renewalCoalesceMs: a regular tick takes a soft-pinned key's renewal
	// once it extends the key's logged lease by this much (lease.Batcher).
	renewalCoalesceMs = 1000
	// maxWaitingRenewals bounds the keys whose renewals wait for a flush
	// (about 100 bytes each); past it, a regular tick forgets those of
	// gone keys and, if still past it, logs them all.
	maxWaitingRenewals = 1 << 18
)

// New starts a node: it opens or creates the data directory, bootstraps a
// new cluster if asked and the directory is empty, and starts Raft. A node
// restarted on an existing data directory rejoins with its stored state.
func New(ctx context.Context, cfg Config) (*Node, error) {
	started := time.Now()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "moonraft", Level: hclog.Info})
	}
	if cfg.clocks == nil {
		cfg.clocks = readClocks
	}
	var clock *leaderClock
	if cfg.Now == nil {
		clock = newLeaderClock(cfg.clocks)
		cfg.Now = clock.now
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, errcode.New(errcode.FileWriteFail, "data dir %s: %v", cfg.DataDir, err)
	}
	// The first line of a start, so that the log times every step of one.
	cfg.Logger.Info("starting", "node", cfg.ID, "data_dir", cfg.DataDir)
	n := &Node{
		cfg:          cfg,
		log:          cfg.Logger.With("node", cfg.ID),
		now:          cfg.Now,
		clock:        clock,
		sm:           newStateMachine(cfg.ClusterID, cfg.ID, cfg.Now),
		gate:         newGate(),
		ringCh:       make(chan struct{}, 1),
		snapCh:       make(chan snapshotDone, 16),
		renewed:      map[string]struct{}{},
		notifyCh:     make(chan bool, 16),
		leaderSignal: newLeaderSignal(),
		raftDown:     make(chan struct{}),
		halted:       make(chan struct{}),
	}
	n.pacer = &pacer{
		softEntries: cfg.ExportSoftEntries,
		softAge:     cfg.ExportSoftAge,
		hard:        cfg.Params.ExportRingCap,
		maxWait:     undeadlinedPaceWait,
		backlog:     n.backlog,
		nowMs:       cfg.Now,
		now:         time.Now,
	}
	n.batcher = lease.NewBatcher(renewalCoalesceMs, maxWaitingRenewals, func(key string) (ok bool) {
		n.sm.read(func(f *fsm.FSM) { _, _, ok = f.Lease(key) })
		return ok
	})
	// Raft is started below; the rounds only run once it is.
	n.leadership = &leadership{
		verify: func() error { return logRound(n.raft, n.wait) },
		term:   func() uint64 { return n.raft.CurrentTerm() },
		now:    time.Now,
	}
	if cfg.ReadMode == ReadLease {
		n.leadership.dur = cfg.readLease()
	}
	n.sm.onPromote = n.leaderSignal.fire
	n.sm.onApply = func() {
		select {
		case n.ringCh <- struct{}{}:
		default:
		}
	}
	// A state replaced under the reads is not one a lease read may trust
	// (SnapshotRestore also suspends the lease before it starts).
	n.sm.onRestore = n.leadership.drop
	n.sm.onRestored = func(r restored) {
		args := []any{"index", r.hdr.RaftIndex, "objects", r.hdr.Objects, "took", r.took.Round(time.Millisecond)}
		if r.cpu > 0 {
			args = append(args, "cpu", r.cpu.Round(time.Millisecond))
		}
		if r.readied > 0 || r.huge > 0 {
			args = append(args, "readied_for_huge_pages", r.readied, "in_huge_pages", r.huge)
		}
		n.log.Info("restored the state from a snapshot", args...)
	}
	n.sm.onHalt = func(err error) {
		n.haltOnce.Do(func() {
			n.log.Error("stopped applying the Raft log", "error", err)
			n.haltErr = err
			close(n.halted)
		})
	}
	n.sm.onSnapshot = func(s snapshotDone) {
		select {
		case n.snapCh <- s:
		default: // a later snapshot covers more; dropping one only delays cleanup
		}
	}
	if cfg.TLS.Enabled() {
		var err error
		if n.serverTLS, err = cfg.TLS.ServerConfig(); err != nil {
			return nil, err
		}
		if n.clientTLS, err = cfg.TLS.ClientConfig(); err != nil {
			return nil, err
		}
	}
	n.disk = newDiskHealth()
	n.metrics = newNodeMetrics(n)
	etcdDown := false
	if len(cfg.Etcd.Endpoints) > 0 {
		if cfg.Etcd.ClusterID == "" {
			n.cfg.Etcd.ClusterID = cfg.ClusterID
		}
		store, err := etcdbridge.Dial(n.cfg.Etcd)
		if err != nil {
			return nil, err
		}
		if err := store.Check(); err != nil {
			// A new node fails fast on a wrong etcd address. A restart must
			// not depend on etcd: the cluster's state is in Raft, and the
			// exporter catches up once etcd answers.
			if ls, _ := raftstore.DetectLogStore(cfg.DataDir); ls == "" {
				_ = store.Close()
				return nil, err
			}
			n.log.Warn("etcd does not answer; starting from the Raft state, OpLog export resumes when it does", "error", err)
			etcdDown = true
		} else if err := refuseRebootstrap(ctx, cfg, store); err != nil {
			_ = store.Close()
			return nil, err
		}
		n.etcd = store
	} else {
		n.cfg.Params.ExportRingCap = 0 // nothing to export to
	}
	if err := n.startRaft(ctx, started); err != nil {
		n.closeStores()
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	// On every start, so members from before this check get registered:
	// at once while etcd answers (a replaced disk right after is refused),
	// else in the background, since a restart must not wait on etcd.
	if n.etcd != nil && (etcdDown || !n.registerNode(ctx)) {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.registerLoop(lctx)
		}()
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.monitorLeadership(lctx)
	}()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.diskWatchdog(lctx)
	}()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.announceLoop(lctx)
	}()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.watchStalls(lctx)
	}()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.standWhenSilent(lctx)
	}()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.catchUpLoop(lctx, started)
	}()
	if cfg.SnapshotLogRatio > 0 {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.snapshotLoop(lctx)
		}()
	}
	return n, nil
}

// leadsWithPeer says whether this node leads term with peer in its
// configuration: the transport holds an append to a peer that refuses
// connections while it does (raftnet/redial.go). raft's latest
// configuration is an atomic load.
func (n *Node) leadsWithPeer(term uint64, peer raft.ServerID) bool {
	r := n.raft
	return r.State() == raft.Leader && r.CurrentTerm() == term &&
		slices.ContainsFunc(r.GetConfiguration().Configuration().Servers, func(s raft.Server) bool { return s.ID == peer })
}

// startRaft opens the node's Raft stores and starts Raft, no sooner than
// a read lease after started.
func (n *Node) startRaft(ctx context.Context, started time.Time) error {
	cfg := n.cfg
	files, err := raftstore.OpenSnapshots(cfg.DataDir, cfg.SnapshotRetain, n.log.Named("snapshots"))
	if err != nil {
		return err
	}
	snaps := &watchedSnapshots{SnapshotStore: files, h: n.disk, dataDir: cfg.DataDir}
	keepFrom := uint64(1) // what a restart applies after its snapshot, if any
	if metas, err := files.List(); err == nil && len(metas) > 0 {
		// The log this node wrote before it stopped is not counted: its
		// next snapshot waits for as much again.
		n.disk.snapshotWritten(metas[0].Index, uint64(metas[0].Size))
		keepFrom = metas[0].Index + 1
	}
	opening := time.Now()
	store, ls, err := raftstore.Open(cfg.DataDir, cfg.RaftLogStore, n.log.Named("wal"), cfg.WALSegmentBytes, keepFrom)
	if err != nil {
		return err
	}
	n.store = store
	first, _ := store.FirstIndex()
	last, _ := store.LastIndex()
	n.log.Info("raft log store opened, the entries after the snapshot checked", "store", ls, "first", first, "last", last,
		"kept_to_apply", store.Kept(), "took", time.Since(opening).Round(time.Millisecond))
	// The failpoints stand for the disk, so they sit inside what the
	// disk watchdog watches.
	n.logWrites = &watchedLog{LogStore: withFailpoints(store, cfg.DataDir), h: n.disk}
	logs, err := raft.NewLogCache(512, n.logWrites)
	if err != nil {
		return err
	}
	tcfg := &raft.NetworkTransportConfig{MaxPool: 3, Timeout: 10 * time.Second, Logger: n.log.Named("transport")}
	if len(cfg.RaftDial) > 0 {
		dial := dialOverride{string(cfg.ID): cfg.RaftAddr} // raft asks for itself too
		for id, a := range cfg.RaftDial {
			dial[id] = a
		}
		tcfg.ServerAddressProvider = dial
	}
	var stream raft.StreamLayer
	if n.serverTLS != nil {
		stream, err = raftnet.NewTLSStreamLayer(cfg.RaftAddr, n.serverTLS, n.clientTLS)
	} else {
		stream, err = raftnet.NewTCPStreamLayer(cfg.RaftAddr)
	}
	if err != nil {
		return errcode.New(errcode.InvalidParams, "raft address %s: %v", cfg.RaftAddr, err)
	}
	n.stream = newFencedStream(stream)
	tcfg.Stream = n.stream
	n.trans = raftnet.NewTransport(tcfg)

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.ID)
	rc.Logger = n.log.Named("raft")
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.leaderLease()
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	if cfg.SnapshotLogRatio > 0 {
		rc.SnapshotThreshold = math.MaxUint64 // snapshotLoop decides
	}
	rc.NotifyCh = n.notifyCh
	// Group commit: concurrent Applies share one log write (one fsync) and
	// one AppendEntries round, which is where write throughput comes from.
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 512
	if err := raft.ValidateConfig(rc); err != nil {
		return errcode.New(errcode.InvalidParams, "raft timeouts: %v", err)
	}

	existing, err := raft.HasExistingState(logs, store, snaps)
	if err != nil {
		return errcode.New(errcode.FileReadFail, "read raft state in %s: %v", cfg.DataDir, err)
	}
	n.hadState = existing
	if cfg.Bootstrap {
		if !existing {
			var servers []raft.Server
			for _, p := range cfg.Peers {
				servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr), Suffrage: raft.Voter})
			}
			if err := raft.BootstrapCluster(rc, logs, store, snaps, n.trans, raft.Configuration{Servers: servers}); err != nil {
				return fmt.Errorf("bootstrap: %w", err)
			}
			n.log.Info("bootstrapped a new cluster", "peers", len(servers))
		}
	}
	// A node that acknowledged a leader's heartbeat before it stopped may
	// have helped confirm a read lease that still holds; restarted, it has
	// forgotten that leader and would vote for anyone at once. So it starts
	// voting only once any such lease has run out: a lease after this start
	// began, since it acknowledged nothing after its process stopped; the
	// stores' opening counts towards it.
	wait := max(time.Until(started.Add(cfg.readLease())), 0)
	n.log.Info("waiting out read leases before starting Raft", "wait", wait.Round(time.Millisecond), "lease", cfg.readLease())
	select {
	case <-time.After(wait):
	case <-ctx.Done():
		return errcode.New(errcode.UnavailableInCurrentStatus, "start canceled while waiting out read leases: %v", ctx.Err())
	}
	r, err := raft.NewRaft(rc, n.sm, logs, store, snaps, n.trans)
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	n.raft = r
	n.trans.FastHeartbeats(func(term uint64) bool { return r.State() == raft.Follower && r.CurrentTerm() == term })
	n.trans.HoldAppends(n.leadsWithPeer)
	n.trans.BeforePreVote(n.dropSilentLeader)
	n.trans.CoordinatePreVotes(n.cfg.ElectionTimeout)
	return nil
}

// dialOverride maps peer ids to the addresses to dial instead of the
// configured ones; other peers are dialled at their configured address.
type dialOverride map[string]string

func (d dialOverride) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if a, ok := d[string(id)]; ok {
		return raft.ServerAddress(a), nil
	}
	return "", fmt.Errorf("no dial override for %s", id)
}

func (n *Node) closeStores() {
	if n.etcd != nil {
		_ = n.etcd.Close()
	}
	if n.trans != nil {
		_ = n.trans.Close()
	}
	if n.store != nil {
		_ = n.store.Close()
	}
}

// Halted is closed when the node stopped applying the Raft log (HaltErr
// says why): it can no longer serve and its owner should Close it.
func (n *Node) Halted() <-chan struct{} { return n.halted }

// HaltErr is why the node halted; nil before Halted is closed.
func (n *Node) HaltErr() error {
	select {
	case <-n.halted:
		return n.haltErr
	default:
		return nil
	}
}

// promotedLeader returns the state's view of the leader when Raft's current
// leader is another node that has promoted itself (its Promote applied
// here): the leader whose addresses the state holds.
func (n *Node) promotedLeader() (fsm.Stats, bool) {
	_, leaderID := n.raft.LeaderWithID()
	var st fsm.Stats
	n.sm.read(func(f *fsm.FSM) { st = f.Stats() })
	return st, leaderID != "" && string(leaderID) == st.LeaderID && st.LeaderID != n.cfg.ID
}

// LeaderMooncakeAddr is the promoted leader's Mooncake address when this
// node is a follower whose Raft leader is that promoted leader, else "".
// Unlike a NOT_LEADER answer it does not ask for recent contact: on a
// loaded machine a live leader can be a heartbeat late, and a forward to a
// dead one fails at once (connection refused).
func (n *Node) LeaderMooncakeAddr() string {
	if n.IsLeader() {
		return ""
	}
	st, ok := n.promotedLeader()
	if !ok {
		return ""
	}
	return st.LeaderMooncakeAddr
}

// HadState reports whether the node started on an existing data dir.
func (n *Node) HadState() bool { return n.hadState }

// Close stops the node: the leader loop, Raft, the transport and the store.
func (n *Node) Close() error {
	if n.closed.Swap(true) {
		return nil
	}
	if n.stopListeners != nil {
		n.stopListeners()
	}
	n.cancel()
	err := n.raft.Shutdown().Error()
	close(n.raftDown)
	n.wg.Wait()
	n.closeStores()
	return err
}

// TransferLeadership hands leadership to id (any voter if empty) and waits
// for it; used on SIGTERM so a stopping leader does not cost an election.
func (n *Node) TransferLeadership(ctx context.Context, id string) error {
	if !n.IsLeader() {
		return n.notLeader()
	}
	var addr raft.ServerAddress
	switch {
	case id == n.cfg.ID:
		return errcode.New(errcode.InvalidParams, "%s is the leader already", id)
	case id != "":
		if addr = n.serverAddr(id); addr == "" {
			return errcode.New(errcode.InvalidParams, "no member %q", id)
		}
	case !n.hasOtherVoter():
		return errcode.New(errcode.InvalidParams, "no other voter to hand leadership to")
	}
	// The target's election (TimeoutNow) makes followers vote although
	// they know this leader: the lease ends before it can ask.
	resume := n.leadership.suspend()
	end := n.handover.begin()
	defer end()
	var f raft.Future
	if id == "" {
		f = n.raft.LeadershipTransfer()
	} else {
		f = n.raft.LeadershipTransferToServer(raft.ServerID(id), addr)
	}
	if err := n.wait(f); err != nil {
		// The target may still be running the election TimeoutNow started
		// (for up to two election timeouts): no lease until it is over.
		time.AfterFunc(2*n.cfg.ElectionTimeout, resume)
		return n.raftErr(err, false)
	}
	// This node has stepped down: no lease can be confirmed in that term
	// any more, and a later term's vote requests outrank the target's.
	resume()
	return nil
}

func (n *Node) serverAddr(id string) raft.ServerAddress {
	s, _ := n.server(id)
	return s.Address
}

// server returns member id of the Raft configuration.
func (n *Node) server(id string) (raft.Server, bool) {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return raft.Server{}, false
	}
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == id {
			return s, true
		}
	}
	return raft.Server{}, false
}

// hasOtherVoter tells whether the configuration has a voter besides this
// node (raft's own answer otherwise is "cannot find peer").
func (n *Node) hasOtherVoter() bool {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return true // let raft answer
	}
	for _, s := range cf.Configuration().Servers {
		if s.Suffrage == raft.Voter && string(s.ID) != n.cfg.ID {
			return true
		}
	}
	return false
}

// notLeader answers a request that reached a follower: NOT_LEADER with the
// leader's client address when the replicated state knows it and the
// leader was heard from lately, else a retryable
// UNAVAILABLE_IN_CURRENT_STATUS. A leader silent for half the heartbeat
// timeout is likely dead or paused: sending clients to it would only cost
// them a timeout.
func (n *Node) notLeader() error {
	st, ok := n.promotedLeader()
	if ok && st.LeaderAddr != "" && time.Since(n.raft.LastContact()) < n.cfg.HeartbeatTimeout/2 {
		return errcode.New(errcode.NotLeader, "%s", st.LeaderAddr)
	}
	return errcode.New(errcode.UnavailableInCurrentStatus, "node %s is not the leader and no promoted leader is known yet; retry", n.cfg.ID)
}

// raftErr maps a Raft error to a Mooncake code. applied says whether the
// command may have reached the log, so a lost leader means its outcome is
// unknown rather than failed.
func (n *Node) raftErr(err error, applied bool) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader):
		return n.notLeader()
	// ErrRaftShutdown also ends an entry already committed but not yet
	// applied here: for a proposed write it says nothing about the outcome.
	// ErrLeadershipTransferInProgress is not among them: raft answers it
	// to a proposal before logging it (raft.go, leaderLoop's applyCh).
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrRaftShutdown) && applied:
		return errcode.New(errcode.OutcomeUnknown, "leadership was lost before the write committed; it may or may not have been applied")
	case errors.Is(err, raft.ErrRaftShutdown):
		return errcode.New(errcode.UnavailableInCurrentStatus, "node is shutting down")
	case errors.Is(err, raft.ErrEnqueueTimeout), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return errcode.New(errcode.UnavailableInCurrentStatus, "%v; retry", err)
	// raft's LogCache reports its store's failure by text only. The leader
	// stores an entry before it sends it anywhere, so one it could not
	// store was not committed; raft has made the node a follower.
	case strings.Contains(err.Error(), "unable to store logs within log store"):
		return errcode.New(errcode.UnavailableInCurrentStatus,
			"node %s could not write its Raft log (%v): the write was not applied and the node has stepped down; retry", n.cfg.ID, err)
	}
	return errcode.New(errcode.InternalError, "raft: %v", err)
}
