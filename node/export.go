package node

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
)

// etcdCallTimeout bounds every export call to etcd, so a silent etcd stalls
// the export for seconds, not until TCP gives up; the ring meanwhile holds
// what is not exported yet.
const etcdCallTimeout = 5 * time.Second

func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, etcdCallTimeout)
}

// etcdCall runs one call to etcd within etcdCallTimeout and counts it in
// the metrics under op.
func (n *Node) etcdCall(ctx context.Context, op string, call func(context.Context) error) error {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	start := time.Now()
	err := call(cctx)
	n.metrics.observeEtcd(op, start, err)
	return err
}

// snapshotDone reports a persisted Raft snapshot and the OpLog seq it covers.
type snapshotDone struct {
	id  string
	seq uint64
}

// publishMasterView is promotion step 3: announce this leader in etcd,
// fenced by term so a deposed leader cannot overwrite a newer one. It
// retries until published, a newer term is there, or leadership ends, and
// runs beside serving: an etcd outage must not keep a new leader from its
// clients.
func (n *Node) publishMasterView(ctx context.Context) {
	v := etcdbridge.MasterView{LeaderID: n.cfg.ID, GRPCAddr: n.cfg.GRPCAddr, RaftAddr: string(n.trans.LocalAddr()), Term: n.raft.CurrentTerm()}
	b := newBackoff(100*time.Millisecond, 2*time.Second)
	for ctx.Err() == nil {
		err := n.etcdCall(ctx, "master_view", func(ctx context.Context) error { return n.etcd.PublishMasterView(ctx, v) })
		if err == nil {
			n.publishMooncakeView(ctx, v)
			return
		}
		if _, stale := errors.AsType[*etcdbridge.StaleTermError](err); stale {
			n.log.Warn("master_view not published: etcd holds a newer term", "term", v.Term, "error", err)
			return
		}
		n.log.Warn("master_view not published yet; retrying", "term", v.Term, "error", err)
		b.wait(ctx)
	}
}

// publishMooncakeView keeps this leader's Mooncake address at master_view,
// where Mooncake's HA clients watch, while it leads: published fenced by
// moonraft's view v, on a lease kept alive, republished if etcd let the
// lease lapse, revoked when leadership ends. Without a Mooncake address it
// removes the JSON view an earlier release left there.
func (n *Node) publishMooncakeView(ctx context.Context, v etcdbridge.MasterView) {
	b := newBackoff(100*time.Millisecond, 2*time.Second)
	for ctx.Err() == nil {
		cctx, cancel := callCtx(ctx)
		var err error
		if n.cfg.MooncakeAddr == "" {
			err = n.etcd.DropLegacyView(cctx)
			cancel()
			if err == nil {
				return
			}
		} else {
			var lease clientv3.LeaseID
			lease, err = n.etcd.PublishMooncakeView(cctx, v, n.cfg.MooncakeAddr)
			cancel()
			if errcode.Of(err) == errcode.EtcdTransactionFail {
				n.log.Warn("Mooncake master_view not published: a newer leader was elected", "error", err)
				return
			}
			if err == nil {
				n.etcd.KeepMooncakeView(ctx, lease)
				b = newBackoff(100*time.Millisecond, 2*time.Second)
				continue
			}
		}
		n.log.Warn("Mooncake master_view not published yet; retrying", "error", err)
		b.wait(ctx)
	}
}

// exportLoop is promotion step 4 and then the steady state: the export ring
// goes to etcd in order, as many entries per transaction as are waiting (up
// to the batch limit: group commit under load, one round trip when idle),
// each transaction fenced on the previous latest. The leader then proposes
// Exported so every node trims its ring. One transaction is in flight at a
// time: two would cost an idle etcd 23 % less per entry
// (BenchmarkWriteOpLogPipelined), but beside a loaded cluster, where etcd
// is short of CPU rather than waiting on its disk, they took no more
// entries a second (BenchmarkExportLoad) and sent 40 % more transactions,
// those that reached etcd before their predecessor being fenced out.
func (n *Node) exportLoop(ctx context.Context) {
	n.pacer.start()
	defer n.pacer.stop()
	var (
		latest    uint64
		known     bool
		backoff   = newBackoff(50*time.Millisecond, 2*time.Second)
		clean     = &oplogCleanup{n: n}
		written   int // entries exported since the cleanup's last step
		lastWrite time.Time
		proposed  uint64 // the last Exported proposed
		proposeAt time.Time
	)
	// Exported is a Raft entry, written to every node's disk: after a
	// transaction at most one a tick, not one a transaction (the rings are
	// trimmed a tick later), and one once nothing is left to export.
	propose := func() {
		if proposed < latest {
			// Asynchronous: a later Exported supersedes a lost one.
			n.raft.Apply(fsm.Encode(&fsm.Exported{Seq: latest}), 0)
			proposed, proposeAt = latest, time.Now()
		}
	}
	for ctx.Err() == nil {
		select {
		case s := <-n.snapCh:
			clean.add(s)
		default:
		}
		if !known {
			var l uint64
			if err := n.etcdCall(ctx, "latest", func(ctx context.Context) (err error) {
				l, err = n.etcd.Latest(ctx)
				return err
			}); err != nil {
				n.log.Warn("etcd unreachable, export waits", "error", err)
				n.pacer.failed(err)
				backoff.wait(ctx)
				continue
			}
			latest, known = l, true
			n.exportedSeq.Store(latest)
		}
		batch, values := n.nextBatch(ctx, latest, lastWrite)
		if len(batch) == 0 {
			propose()
		}
		if len(batch) > 0 && batch[0].SequenceID != latest+1 {
			n.log.Error("etcd is missing OpLog entries this node no longer holds; was etcd reset?",
				"etcd_latest", latest, "ring_first", batch[0].SequenceID)
			known = false
			backoff.wait(ctx)
			continue
		}
		if len(batch) > 0 {
			err := n.etcdCall(ctx, "oplog_write", func(ctx context.Context) error {
				return n.etcd.WriteOpLogBatch(ctx, latest, batch, values)
			})
			var fenced *etcdbridge.FencedError
			switch {
			case errors.As(err, &fenced):
				// Another writer (a deposed leader, or our own write whose
				// answer was lost) got there: entries are deterministic, so
				// whatever it wrote is what we would have written.
				latest = fenced.Latest
				continue
			case err != nil:
				n.log.Warn("OpLog export failed, retrying", "from_seq", latest+1, "error", err)
				n.pacer.failed(err)
				backoff.wait(ctx)
				continue
			}
			backoff.reset()
			lastWrite = time.Now()
			latest = batch[len(batch)-1].SequenceID
			n.exportedSeq.Store(latest)
			n.pacer.took(uint64(len(batch)))
			if time.Since(proposeAt) >= n.cfg.Tick {
				propose()
			}
		}
		if len(batch) > 0 {
			// Under load a chunk of cleanup per half a chunk exported:
			// cleanup catches up at twice the write rate, and etcd is
			// never held long by one delete.
			if written += len(batch); written >= cleanupChunk/2 {
				clean.step(ctx, latest)
				written = 0
			}
			continue
		}
		if clean.step(ctx, latest) {
			continue
		}
		n.pacer.idle()
		select {
		case <-ctx.Done():
		case <-n.ringCh:
		case s := <-n.snapCh:
			clean.add(s)
		}
	}
}

// nextBatch returns the ring entries after latest for the next transaction
// and their encodings. If the last write was recent (the exporter is under
// load) and the batch is not full, it lingers up to ExportLinger for more:
// etcd then takes one transaction per many entries instead of one per few,
// and each transaction's Exported entry is one Raft entry less. Idle, an
// entry goes at once.
func (n *Node) nextBatch(ctx context.Context, latest uint64, lastWrite time.Time) ([]oplog.Entry, [][]byte) {
	var pending fsm.Pending
	read := func() {
		n.sm.read(func(f *fsm.FSM) { pending = f.RingAfter(latest, n.etcd.MaxBatch()) })
	}
	read()
	if linger := n.cfg.ExportLinger; linger > 0 && pending.Len() > 0 && pending.Len() < n.etcd.MaxBatch() && time.Since(lastWrite) <= 2*linger {
		n.linger(ctx, func() bool { read(); return pending.Len() >= n.etcd.MaxBatch() })
	}
	n.pacer.setOldest(pending)
	batch := pending.Entries()       // outside the state's lock
	values := n.etcd.FitBatch(batch) // within etcd's request size too
	return batch[:len(values)], values
}

// linger waits up to ExportLinger for more entries, until full says the
// batch is.
func (n *Node) linger(ctx context.Context, full func() bool) {
	t := time.NewTimer(n.cfg.ExportLinger)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			full()
			return
		case <-n.ringCh:
			if full() {
				return
			}
		}
	}
}

// renewalLoop writes the lease renewals of the last second to
// lease_renewals/ (seed 000) for etcd watchers; Raft already carries them
// to the standbys, so a failed write is only logged.
func (n *Node) renewalLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.renewMu.Lock()
		keys := n.renewed
		n.renewed = map[string]struct{}{}
		n.renewMu.Unlock()
		if len(keys) == 0 {
			continue
		}
		now := n.now()
		rs := make([]oplog.Renewal, 0, len(keys))
		n.sm.read(func(f *fsm.FSM) {
			for k := range keys {
				if l, sp, ok := f.Lease(k); ok {
					rs = append(rs, oplog.Renewal{Key: k, LeaseTimeoutMs: l, SoftPinTimeoutMs: sp, TimestampMs: now})
				}
			}
		})
		if err := n.etcdCall(ctx, "renewals", func(ctx context.Context) error { return n.etcd.PutRenewals(ctx, rs) }); err != nil {
			n.log.Warn("lease renewals not exported", "keys", len(rs), "error", err)
		}
	}
}

// noteRenewed remembers keys renewed by a tick for the next renewal export.
func (n *Node) noteRenewed(renewals []lease.Renewal) {
	if n.etcd == nil || !n.cfg.ExportRenewals || len(renewals) == 0 {
		return
	}
	n.renewMu.Lock()
	for _, r := range renewals {
		n.renewed[r.Key] = struct{}{}
	}
	n.renewMu.Unlock()
}

// backoff is an exponential wait between retries of an unreachable etcd.
type backoff struct{ min, max, cur time.Duration }

func newBackoff(min, max time.Duration) *backoff { return &backoff{min: min, max: max, cur: min} }

func (b *backoff) reset() { b.cur = b.min }

func (b *backoff) wait(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(b.cur):
	}
	b.cur = min(2*b.cur, b.max)
}
