package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/internal/listflag"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/node"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/transport"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// rawPrimary is the source notes' primary: state in memory, every mutation
// written to etcd as its own put before the client is answered, lease
// renewals batched to etcd once a second. Its standbys follow etcd alone.
// It serves the same gRPC API as moonraft, so the same workload drives it.
type rawPrimary struct {
	transport.NoAdmin
	mu      sync.RWMutex
	f       *fsm.FSM
	store   *etcdbridge.Store
	batcher *lease.Batcher
	acks    ackTracker
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

func newRawPrimary(store *etcdbridge.Store) *rawPrimary {
	p := &rawPrimary{NoAdmin: transport.NoAdmin{Err: errcode.New(errcode.UnavailableInCurrentMode, "not part of the baseline")}, f: fsm.New(), store: store, batcher: lease.NewBatcher(0, 0), acks: ackTracker{acked: map[uint64]bool{}}}
	params := fsm.DefaultParams()
	params.ExportRingCap = 1 << 40 // the ring only holds what is being written
	p.f.ApplyCommand(&fsm.Promote{NowMs: p.Now(), LeaderID: "primary", Term: 1, Params: params})
	return p
}

// apply runs cmd, then writes every entry it produced to etcd, each as its
// own put, before returning.
func (p *rawPrimary) apply(ctx context.Context, cmd fsm.Command) (fsm.Result, error) {
	p.mu.Lock()
	seq := p.f.Stats().AppliedSeq
	r := p.f.ApplyCommand(cmd)
	es := p.f.RingAfter(seq, 1<<30)
	p.mu.Unlock()
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
		if time.Since(last) >= time.Second && len(pending) > 0 {
			_ = p.store.PutRenewals(ctx, pending)
			pending, last = nil, time.Now()
		}
	}
}

func (p *rawPrimary) Now() int64         { return time.Now().UnixMilli() }
func (p *rawPrimary) ClientTTLMs() int64 { return p.f.Params().ClientTTLMs }

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
	if r.Found {
		p.batcher.Renew(key, r.Grant.Renewal.AtMs, r.Grant.CurrentMs, r.Grant.UntilMs)
	}
	return r.Replicas, r.Grant, r.Err
}

func (p *rawPrimary) ExistKey(_ context.Context, key string) (bool, fsm.Grant, error) {
	p.mu.RLock()
	r := p.f.ExistKey(key, p.Now())
	p.mu.RUnlock()
	if r.Found {
		p.batcher.Renew(key, r.Grant.Renewal.AtMs, r.Grant.CurrentMs, r.Grant.UntilMs)
	}
	return r.Found, r.Grant, r.Err
}

// Batch reads take the lock per key, as the Mooncake master's batch reads
// call its single reads.
func (p *rawPrimary) BatchGetReplicaList(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return transport.BatchGetByKey(ctx, keys, p.GetReplicaList)
}

func (p *rawPrimary) BatchExistKey(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return transport.BatchExistByKey(ctx, keys, p.ExistKey)
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

func (p *rawPrimary) Progress() *moonraftpb.NodeStatus { return p.Status() }

func (p *rawPrimary) Status() *moonraftpb.NodeStatus {
	p.mu.RLock()
	defer p.mu.RUnlock()
	st := p.f.Stats()
	return &moonraftpb.NodeStatus{Id: "primary", Role: "leader", Promoted: true, AppliedSeq: st.AppliedSeq, Objects: uint64(st.Objects)}
}

var _ transport.Backend = (*rawPrimary)(nil)

// The baseline's primary and standbys each run in a process of their own,
// as moonraft's nodes do: moonbench starts its own binary with one of these
// commands. (In the benchmark's process, the primary would be spared the
// hop between processes that every real client pays.)
const (
	cmdBaselinePrimary = "baseline-primary"
	cmdBaselineStandby = "baseline-standby"
)

// runBaselineProcess is `moonbench baseline-primary|baseline-standby
// --listen ADDR --etcd-endpoints URLS`: it serves until SIGINT or SIGTERM.
func runBaselineProcess(role string, args []string) error {
	fs := flag.NewFlagSet("moonbench "+role, flag.ContinueOnError)
	listen := fs.String("listen", "", "gRPC address to serve on")
	endpoints := fs.String("etcd-endpoints", "", "the baseline's etcd")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ecfg := baselineEtcd(listflag.Split(*endpoints))
	if role == cmdBaselineStandby {
		f, err := node.StartEtcdFollower(node.FollowerConfig{ID: "standby", GRPCAddr: *listen, Etcd: ecfg, Logger: hclog.NewNullLogger()})
		if err != nil {
			return err
		}
		<-ctx.Done()
		return f.Close()
	}
	store, err := etcdbridge.Open(ecfg)
	if err != nil {
		return err
	}
	defer store.Close()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	p := newRawPrimary(store)
	srv := transport.NewServer(p)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { _ = srv.Serve(l) })
	wg.Go(func() { p.run(ctx) })
	<-ctx.Done()
	srv.Stop()
	return nil
}

func baselineEtcd(endpoints []string) etcdbridge.Config {
	return etcdbridge.Config{Endpoints: endpoints, Prefix: "mooncake-store", ClusterID: "baseline"}
}

// baseline is --baseline raw-etcd-watch: an embedded etcd, the primary,
// and two standbys that follow etcd on their own.
type baseline struct {
	dir      string
	etcdE    *etcdbridge.Embedded
	primary  *child.Proc
	standbys []*child.Proc
	addrs    []string // the primary's, then the standbys'
	cl       *transport.Client
}

func openBaseline(ctx context.Context, cfg config) (*baseline, error) {
	dir, err := os.MkdirTemp("", "moonbench-baseline-")
	if err != nil {
		return nil, err
	}
	b := &baseline{dir: dir}
	progressf("starting the baseline (raw-etcd-watch): embedded etcd, primary, two standbys")
	if b.etcdE, err = etcdbridge.StartEmbedded(filepath.Join(dir, "etcd"), "", ""); err != nil {
		b.close()
		return nil, err
	}
	eps := strings.Join(b.etcdE.Endpoints(), ",")
	for i, role := range []string{cmdBaselinePrimary, cmdBaselineStandby, cmdBaselineStandby} {
		a, err := freeport.Addr()
		if err != nil {
			b.close()
			return nil, err
		}
		p := &child.Proc{Bin: cfg.benchBin, Args: []string{role, "--listen", a, "--etcd-endpoints", eps}}
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
	if b.cl, err = transport.Dial(transport.ClientConfig{Endpoints: b.addrs[:1]}); err != nil {
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

func (b *baseline) name() string              { return "raw-etcd-watch" }
func (b *baseline) client() *transport.Client { return b.cl }
func (b *baseline) etcd() etcdLoad            { return embeddedEtcdLoad() }

func (b *baseline) leaderProc(context.Context) (*child.Proc, error) { return b.primary, nil }

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
	if b.etcdE != nil {
		_ = b.etcdE.Close()
	}
	os.RemoveAll(b.dir)
}
