package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/etcdfollower"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/internal/listflag"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/transport"
)

// The baselines: the source notes' design, state in memory on a primary
// whose standbys follow the OpLog in etcd alone. raw-etcd-watch writes each
// mutation to etcd as its own put before the client is answered;
// raw-etcd-watch-async answers first and writes in batches in the
// background, as the Mooncake master does (PutEnd's
// AppendOpLogVisibleBeforeDurable, an ordered writer of up to 1,024 entries
// per batch; Mooncake 3b5a594 master_service.cpp).
const (
	baselineSync  = "raw-etcd-watch"
	baselineAsync = "raw-etcd-watch-async"
)

var baselineModes = map[string]bool{baselineSync: false, baselineAsync: true} // name: async

// rawPrimary is a baseline's primary. Lease renewals go to etcd in batches
// once a second in both modes. It serves the same gRPC API as moonraft, so
// the same workload drives it.
type rawPrimary struct {
	mu      sync.RWMutex
	f       *fsm.FSM
	store   *etcdbridge.Store // nil: a promoted standby, which exports nothing
	batcher *lease.Batcher
	acks    ackTracker
	async   bool
	kick    chan struct{} // async: entries wait to be written
	// inherited is what a promoted standby followed: read-only objects
	// that the new state does not hold (nil on a primary started as one).
	inherited *oplog.Follower
}

// ackTracker trims the export ring up to the longest prefix of entries
// etcd acknowledged; puts of different operations complete out of order.
type ackTracker struct {
	mu    sync.Mutex
	low   uint64 // every seq <= low is acknowledged
	acked map[uint64]bool
}

func (a *ackTracker) ack(seq uint64) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.acked[seq] = true
	for a.acked[a.low+1] {
		delete(a.acked, a.low+1)
		a.low++
	}
	return a.low
}

func newRawPrimary(store *etcdbridge.Store, async bool) *rawPrimary {
	p := &rawPrimary{f: fsm.New(), store: store,
		batcher: lease.NewBatcher(0, 0, nil), acks: ackTracker{acked: map[uint64]bool{}}, async: async, kick: make(chan struct{}, 1)}
	params := fsm.DefaultParams()
	params.ExportRingCap = 1 << 40 // the ring only holds what is being written
	p.f.ApplyCommand(&fsm.Promote{NowMs: p.Now(), LeaderID: "primary", Term: 1, Params: params})
	return p
}

// apply runs cmd, then (sync) writes every entry it produced to etcd, each
// as its own put, before returning, or (async) leaves them to writeLoop.
func (p *rawPrimary) apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	p.mu.Lock()
	seq := p.f.Stats().AppliedSeq
	r := p.f.ApplyCommand(cmd)
	var pending fsm.Pending
	if p.store != nil && !p.async {
		pending = p.f.RingAfter(seq, 1<<30)
	}
	p.mu.Unlock()
	es := pending.Entries()
	if p.async {
		select {
		case p.kick <- struct{}{}:
		default:
		}
		return r, nil
	}
	// The mutation is applied: a client giving up must not leave a hole in
	// the OpLog that the standbys would wait on forever.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, e := range es {
		if _, err := p.store.Client().Put(wctx, p.store.EntryKey(e.SequenceID), string(e.Encode())); err != nil {
			return r, errcode.New(errcode.EtcdOperationError, "write entry %d: %v", e.SequenceID, err)
		}
		if low := p.acks.ack(e.SequenceID); low == e.SequenceID {
			p.mu.Lock()
			p.f.ApplyCommand(&fsm.Exported{Seq: low})
			p.mu.Unlock()
		}
	}
	return r, nil
}

// writeLoop is the async primary's OpLog writer: whatever has been applied
// and not written goes to etcd in transactions of up to MaxBatch entries,
// one after the other.
func (p *rawPrimary) writeLoop(ctx context.Context) {
	var written uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		for ctx.Err() == nil {
			p.mu.RLock()
			pending := p.f.RingAfter(written, p.store.MaxBatch())
			p.mu.RUnlock()
			es := pending.Entries()
			if len(es) == 0 {
				break
			}
			values := p.store.FitBatch(es)
			es = es[:len(values)]
			if err := p.store.WriteOpLogBatch(ctx, written, es, values); err != nil {
				time.Sleep(10 * time.Millisecond) // etcd away: the entries wait, as the clients do not
				continue
			}
			written = es[len(es)-1].SequenceID
			p.mu.Lock()
			p.f.ApplyCommand(&fsm.Exported{Seq: written})
			p.mu.Unlock()
		}
	}
}

// run ticks the primary's time, renewals and eviction locally every 100 ms
// and exports lease renewals once a second, as the notes describe.
func (p *rawPrimary) run(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var pending []oplog.Renewal
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rs, pings := p.batcher.Drain()
		p.mu.RLock()
		evict := p.f.EvictionDue()
		p.mu.RUnlock()
		_, _ = p.apply(ctx, &fsm.Tick{NowMs: p.Now(), Renewals: rs, Pings: pings, Evict: evict})
		p.mu.RLock()
		for _, r := range rs {
			if l, sp, ok := p.f.Lease(r.Key); ok {
				pending = append(pending, oplog.Renewal{Key: r.Key, LeaseTimeoutMs: l, SoftPinTimeoutMs: sp, TimestampMs: r.AtMs})
			}
		}
		p.mu.RUnlock()
		if time.Since(last) >= time.Second && len(pending) > 0 && p.store != nil {
			_ = p.store.PutRenewals(ctx, pending)
			pending, last = nil, time.Now()
		}
	}
}

func (p *rawPrimary) Now() int64          { return time.Now().UnixMilli() }
func (p *rawPrimary) ClientTTLMs() int64  { return p.f.Params().ClientTTLMs }
func (p *rawPrimary) ViewVersion() uint64 { return 0 }

func (p *rawPrimary) SegmentStatus(_ context.Context, ref string, byName bool) ([]fsm.SegmentStatus, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return service.SegmentStatusOf(p.f, ref, byName)
}

func (p *rawPrimary) Propose(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	return p.apply(ctx, cmd)
}

func (p *rawPrimary) ProposeBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, error) {
	r, err := p.apply(ctx, &fsm.Batch{Cmds: cmds})
	return r.Batch, err
}

func (p *rawPrimary) GetReplicaList(_ context.Context, key string) ([]oplog.ReplicaDesc, fsm.Grant, error) {
	p.mu.RLock()
	r := p.f.GetReplicaList(key, p.Now())
	p.mu.RUnlock()
	if o, ok := p.inheritedObject(key, r.Found); ok {
		return o.Payload.Replicas, fsm.Grant{}, nil
	}
	if r.Found {
		p.renew(r.Grant)
	}
	return r.Replicas, r.Grant, r.Err
}

// renew records the lease a read returned, as the node does: under the
// state's own copy of the key.
func (p *rawPrimary) renew(g fsm.Grant) {
	p.batcher.Renew(g.Renewal.Key, g.Renewal.AtMs, g.CurrentMs, g.UntilMs, g.SoftPin)
}

func (p *rawPrimary) ExistKey(_ context.Context, key string) (bool, fsm.Grant, error) {
	p.mu.RLock()
	r := p.f.ExistKey(key, p.Now())
	p.mu.RUnlock()
	if _, ok := p.inheritedObject(key, r.Found); ok {
		return true, fsm.Grant{}, nil
	}
	if r.Found {
		p.renew(r.Grant)
	}
	return r.Found, r.Grant, r.Err
}

// Batch reads take the lock per key, as the Mooncake master's batch reads
// call its single reads.
func (p *rawPrimary) BatchGetReplicaList(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return service.BatchGetByKey(ctx, keys, p.GetReplicaList)
}

func (p *rawPrimary) BatchExistKey(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return service.BatchExistByKey(ctx, keys, p.ExistKey)
}

// inheritedObject is key's object as a promoted standby followed it, when
// the state proper does not have it.
func (p *rawPrimary) inheritedObject(key string, found bool) (oplog.ObjectState, bool) {
	if found || p.inherited == nil {
		return oplog.ObjectState{}, false
	}
	return p.inherited.Get(key)
}

func (p *rawPrimary) GetReplicaListByRegex(_ context.Context, re string) ([]fsm.KeyReplicas, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.f.GetReplicaListByRegex(re, p.Now())
}

func (p *rawPrimary) Ping(_ context.Context, clientID string) (bool, error) {
	p.mu.RLock()
	ok := p.f.HasSession(clientID)
	p.mu.RUnlock()
	if ok {
		p.batcher.Ping(clientID, p.Now())
	}
	return !ok, nil
}

func (p *rawPrimary) Progress() *service.NodeStatus { return p.Status() }

func (p *rawPrimary) Status() *service.NodeStatus {
	p.mu.RLock()
	defer p.mu.RUnlock()
	st := p.f.Stats()
	return &service.NodeStatus{ID: "primary", Role: "leader", Promoted: true, AppliedSeq: st.AppliedSeq, Objects: uint64(st.Objects)}
}

var _ service.Data = (*rawPrimary)(nil)

// The baseline's primary and standbys each run in a process of their own,
// as moonraft's nodes do: moonbench starts its own binary with one of these
// commands. (In the benchmark's process, the primary would be spared the
// hop between processes that every real client pays.)
const (
	cmdBaselinePrimary = "baseline-primary"
	cmdBaselineStandby = "baseline-standby"
)

// runBaselineProcess is `moonbench baseline-primary|baseline-standby
// --listen ADDR --etcd-endpoints URLS [--async]`: it serves until SIGINT or
// SIGTERM. A standby sent SIGUSR1 is promoted (promoteStandby).
func runBaselineProcess(role string, args []string) error {
	fs := flag.NewFlagSet("moonbench "+role, flag.ContinueOnError)
	listen := fs.String("listen", "", "gRPC address to serve on")
	endpoints := fs.String("etcd-endpoints", "", "the baseline's etcd")
	async := fs.Bool("async", false, "primary: answer before the OpLog entry is in etcd, write entries in background batches")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ecfg := baselineEtcd(listflag.Split(*endpoints))
	if role == cmdBaselineStandby {
		promote := make(chan os.Signal, 1)
		signal.Notify(promote, syscall.SIGUSR1)
		f, err := etcdfollower.Start(etcdfollower.Config{ID: "standby", GRPCAddr: *listen, Etcd: ecfg, Logger: hclog.NewNullLogger()})
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return f.Close()
		case <-promote:
		}
		p, err := promoteStandby(ctx, f, ecfg)
		if err != nil {
			return err
		}
		return serveBaseline(ctx, p, *listen)
	}
	store, err := etcdbridge.Open(ecfg)
	if err != nil {
		return err
	}
	defer store.Close()
	return serveBaseline(ctx, newRawPrimary(store, *async), *listen)
}

// promoteStandby turns a standby into a primary as the notes describe: it
// catches up with what etcd holds (up to a gap that does not fill within a
// second: entries past it are lost to it, as to any reader of the OpLog),
// stops following, and serves what it followed. The new primary starts a
// state of its own beside the followed objects, which it serves for reads,
// and exports nothing: it exists to time the failover and to count the
// acknowledged writes it does not have.
func promoteStandby(ctx context.Context, f *etcdfollower.Server, ecfg etcdbridge.Config) (*rawPrimary, error) {
	store, err := etcdbridge.Open(ecfg)
	if err != nil {
		return nil, err
	}
	fol := f.Follower()
	for {
		recs, _, err := store.ReadOpLogSince(ctx, fol.AppliedSeq(), 1)
		if err != nil || len(recs) == 0 {
			break
		}
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err = fol.WaitFor(wctx, recs[0].Seq)
		cancel()
		if err != nil {
			break
		}
	}
	_ = store.Close()
	if err := f.Close(); err != nil {
		return nil, err
	}
	p := newRawPrimary(nil, false)
	p.inherited = fol
	return p, nil
}

func serveBaseline(ctx context.Context, p *rawPrimary, listen string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := transport.NewServer(p, transport.ServerConfig{})
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { _ = srv.Serve(l) })
	wg.Go(func() { p.run(ctx) })
	if p.async {
		wg.Go(func() { p.writeLoop(ctx) })
	}
	<-ctx.Done()
	srv.Stop()
	return nil
}

func baselineEtcd(endpoints []string) etcdbridge.Config {
	return etcdbridge.Config{Endpoints: endpoints, Prefix: "mooncake-store", ClusterID: "baseline"}
}

// baseline is one --baseline: an embedded etcd, the primary, and two
// standbys that follow etcd on their own.
type baseline struct {
	mode     string
	dir      string
	etcdP    *etcdProc
	primary  *child.Proc
	standbys []*child.Proc
	addrs    []string // the primary's, then the standbys'
	cl       *client.Client
}

func openBaseline(ctx context.Context, cfg config, mode string) (*baseline, error) {
	dir, err := os.MkdirTemp("", "moonbench-baseline-")
	if err != nil {
		return nil, err
	}
	b := &baseline{mode: mode, dir: dir}
	progressf("starting the baseline (%s): embedded etcd, primary, two standbys", mode)
	if b.etcdP, err = startEtcd(ctx, cfg, dir); err != nil {
		b.close()
		return nil, err
	}
	eps := strings.Join(b.etcdP.endpoints(), ",")
	for i, role := range []string{cmdBaselinePrimary, cmdBaselineStandby, cmdBaselineStandby} {
		a, err := freeport.Addr()
		if err != nil {
			b.close()
			return nil, err
		}
		p := &child.Proc{Bin: cfg.benchBin, Args: []string{role, "--listen", a, "--etcd-endpoints", eps}}
		if i == 0 && baselineModes[mode] {
			p.Args = append(p.Args, "--async")
		}
		if cfg.verbose {
			p.Output = os.Stderr
		}
		if err := p.Start(); err != nil {
			b.close()
			return nil, err
		}
		b.addrs = append(b.addrs, a)
		if i == 0 {
			b.primary = p
		} else {
			b.standbys = append(b.standbys, p)
		}
	}
	if b.cl, err = client.Dial(client.Config{Endpoints: b.addrs[:1]}); err != nil {
		b.close()
		return nil, err
	}
	// Ready when all three answer.
	for _, a := range b.addrs {
		if err := retryUntil(ctx, 30*time.Second, func(ctx context.Context) error { _, err := b.cl.Progress(ctx, a); return err }); err != nil {
			b.close()
			return nil, fmt.Errorf("baseline process at %s: %w", a, err)
		}
	}
	return b, nil
}

// retryUntil calls fn until it succeeds or within has passed.
func retryUntil(ctx context.Context, within time.Duration, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		err := fn(cctx)
		ccancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (b *baseline) name() string           { return b.mode }
func (b *baseline) client() *client.Client { return b.cl }
func (b *baseline) etcd(ctx context.Context) etcdLoad {
	l, _ := b.etcdP.load(ctx)
	return l
}

func (b *baseline) serverProcs(context.Context) ([]*child.Proc, error) {
	return append([]*child.Proc{b.primary}, b.standbys...), nil
}

func (b *baseline) exportBacklog(context.Context) (uint64, error) { return 0, nil }

func (b *baseline) positions(ctx context.Context) (uint64, []uint64, error) {
	var out []uint64
	for _, a := range b.addrs {
		st, err := b.cl.Progress(ctx, a)
		if err != nil {
			return 0, nil, err
		}
		out = append(out, st.AppliedSeq)
	}
	return out[0], out[1:], nil
}

func (b *baseline) close() {
	if b.cl != nil {
		b.cl.Close()
	}
	var ps []*child.Proc
	if b.primary != nil {
		ps = append(ps, b.primary)
	}
	child.StopAll(10*time.Second, append(ps, b.standbys...)...)
	if b.etcdP != nil {
		b.etcdP.close()
	}
	os.RemoveAll(b.dir)
}
