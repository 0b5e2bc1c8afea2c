package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/node"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/transport"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
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
	p := &rawPrimary{NoAdmin: transport.NoAdmin{Err: errcode.New(errcode.UnavailableInCurrentMode, "not part of the baseline")}, f: fsm.New(), store: store, batcher: lease.NewBatcher(1000), acks: ackTracker{acked: map[uint64]bool{}}}
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
	d, g, err := p.f.GetReplicaList(key, p.Now())
	p.mu.RUnlock()
	if err == nil {
		p.batcher.Renew(key, g.Renewal.AtMs, g.CurrentMs)
	}
	return d, g, err
}

func (p *rawPrimary) ExistKey(_ context.Context, key string) (bool, fsm.Grant, error) {
	p.mu.RLock()
	ok, g, err := p.f.ExistKey(key, p.Now())
	p.mu.RUnlock()
	if ok {
		p.batcher.Renew(key, g.Renewal.AtMs, g.CurrentMs)
	}
	return ok, g, err
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

// baseline is --baseline raw-etcd-watch: an embedded etcd, the primary,
// and two standbys that follow etcd on their own.
type baseline struct {
	dir      string
	etcdE    *etcdbridge.Embedded
	store    *etcdbridge.Store
	primary  *rawPrimary
	srv      *grpc.Server
	standbys []*node.EtcdFollower
	cl       *transport.Client
	cancel   context.CancelFunc
	wg       sync.WaitGroup
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
	ecfg := etcdbridge.Config{Endpoints: b.etcdE.Endpoints(), Prefix: "mooncake-store", ClusterID: "baseline"}
	if b.store, err = etcdbridge.Open(ecfg); err != nil {
		b.close()
		return nil, err
	}
	b.primary = newRawPrimary(b.store)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.close()
		return nil, err
	}
	b.srv = transport.NewServer(b.primary)
	rctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		_ = b.srv.Serve(l)
	}()
	go func() {
		defer b.wg.Done()
		b.primary.run(rctx)
	}()
	for i := 0; i < 2; i++ {
		a, err := freeport.Addr()
		if err != nil {
			b.close()
			return nil, err
		}
		f, err := node.StartEtcdFollower(node.FollowerConfig{ID: "standby", GRPCAddr: a, Etcd: ecfg, Logger: hclog.NewNullLogger()})
		if err != nil {
			b.close()
			return nil, err
		}
		b.standbys = append(b.standbys, f)
	}
	if b.cl, err = transport.Dial(transport.ClientConfig{Endpoints: []string{l.Addr().String()}}); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *baseline) name() string              { return "raw-etcd-watch" }
func (b *baseline) client() *transport.Client { return b.cl }
func (b *baseline) etcd() etcdLoad            { return embeddedEtcdLoad() }

func (b *baseline) positions(context.Context) (uint64, []uint64, error) {
	b.primary.mu.RLock()
	leader := b.primary.f.Stats().AppliedSeq
	b.primary.mu.RUnlock()
	var out []uint64
	for _, s := range b.standbys {
		if err := s.Err(); err != nil {
			return 0, nil, err
		}
		out = append(out, s.Follower().AppliedSeq())
	}
	return leader, out, nil
}

func (b *baseline) close() {
	if b.cl != nil {
		b.cl.Close()
	}
	for _, s := range b.standbys {
		_ = s.Close()
	}
	if b.srv != nil {
		b.srv.Stop()
	}
	if b.cancel != nil {
		b.cancel()
	}
	b.wg.Wait()
	if b.store != nil {
		_ = b.store.Close()
	}
	if b.etcdE != nil {
		_ = b.etcdE.Close()
	}
	os.RemoveAll(b.dir)
}
