package transport

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/require"
)

// testBackend is a Backend over a real FSM, with switches that make it act
// as a follower, as a node with no leader, or as a leader lost mid-write.
type testBackend struct {
	lis *trackingListener

	mu sync.Mutex
	f  *fsm.FSM

	notLeader   atomic.Pointer[string] // answer NOT_LEADER naming this address
	unavailable atomic.Bool            // answer UNAVAILABLE_IN_CURRENT_STATUS
	dropNext    atomic.Bool            // drop every connection after the next Propose applies
	loseNext    atomic.Bool            // answer the next Propose OUTCOME_UNKNOWN after applying it
	paused      atomic.Bool            // answer ExistKey only at the call's deadline, as a SIGSTOPped process
	hung        atomic.Bool            // answer ExistKey only after the client gave up on it
	busyPings   atomic.Int64           // answer this many more pings TOO_MANY_REQUESTS

	proposes atomic.Int64 // Propose calls that reached the FSM
	refused  atomic.Int64 // calls answered NOT_LEADER or UNAVAILABLE
	pings    atomic.Int64
}

func (b *testBackend) refuse() error {
	if addr := b.notLeader.Load(); addr != nil {
		b.refused.Add(1)
		return errcode.New(errcode.NotLeader, "%s", *addr)
	}
	if b.unavailable.Load() {
		b.refused.Add(1)
		return errcode.New(errcode.UnavailableInCurrentStatus, "no promoted leader yet; retry")
	}
	return nil
}

func (b *testBackend) Now() int64 { return time.Now().UnixMilli() }

func (b *testBackend) ProposeBatch(ctx context.Context, cmds []fsm.Command) ([]fsm.Result, error) {
	r, err := b.Propose(ctx, &fsm.Batch{Cmds: cmds})
	return r.Batch, err
}

func (b *testBackend) Propose(_ context.Context, cmd fsm.Command) (fsm.Result, error) {
	if err := b.refuse(); err != nil {
		return fsm.Result{}, err
	}
	b.proposes.Add(1)
	b.mu.Lock()
	r := b.f.Apply(fsm.Encode(cmd))
	b.mu.Unlock()
	if b.dropNext.CompareAndSwap(true, false) {
		b.lis.dropAll()
	}
	if b.loseNext.CompareAndSwap(true, false) {
		return fsm.Result{}, errcode.New(errcode.OutcomeUnknown, "leadership was lost before the write committed")
	}
	return r, nil
}

func (b *testBackend) GetReplicaList(_ context.Context, key string) ([]oplog.ReplicaDesc, fsm.Grant, error) {
	if err := b.refuse(); err != nil {
		return nil, fsm.Grant{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.f.GetReplicaList(key, b.Now())
	return r.Replicas, r.Grant, r.Err
}

func (b *testBackend) BatchGetReplicaList(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return service.BatchGetByKey(ctx, keys, b.GetReplicaList)
}

func (b *testBackend) BatchExistKey(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return service.BatchExistByKey(ctx, keys, b.ExistKey)
}

func (b *testBackend) ExistKey(ctx context.Context, key string) (bool, fsm.Grant, error) {
	if b.hung.Load() {
		b.refused.Add(1)
		<-ctx.Done()
		time.Sleep(100 * time.Millisecond)
		return false, fsm.Grant{}, ctx.Err()
	}
	if b.paused.Load() {
		b.refused.Add(1)
		<-ctx.Done()
		return false, fsm.Grant{}, ctx.Err()
	}
	if err := b.refuse(); err != nil {
		return false, fsm.Grant{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.f.ExistKey(key, b.Now())
	return r.Found, r.Grant, r.Err
}

func (b *testBackend) GetReplicaListByRegex(_ context.Context, re string) ([]fsm.KeyReplicas, error) {
	if err := b.refuse(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.GetReplicaListByRegex(re, b.Now())
}

func (b *testBackend) Ping(_ context.Context, clientID string) (bool, error) {
	if err := b.refuse(); err != nil {
		return false, err
	}
	if b.busyPings.Add(-1) >= 0 {
		b.refused.Add(1)
		return false, errcode.New(errcode.TooManyRequests, "client %s has calls in flight", clientID)
	}
	b.pings.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.f.HasSession(clientID), nil
}

func (b *testBackend) ClientTTLMs() int64 { return fsm.DefaultParams().ClientTTLMs }

func (b *testBackend) ViewVersion() uint64 { return 7 }

func (b *testBackend) SegmentStatus(_ context.Context, ref string, byName bool) ([]fsm.SegmentStatus, error) {
	if err := b.refuse(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return service.SegmentStatusOf(b.f, ref, byName)
}

func (b *testBackend) Progress() *service.NodeStatus { return b.Status() }

func (b *testBackend) Status() *service.NodeStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.f.Stats()
	d := b.f.Digest()
	return &service.NodeStatus{ID: "n", GRPCAddr: b.lis.Addr().String(), Objects: uint64(st.Objects), Digest: hex.EncodeToString(d[:])}
}

func (b *testBackend) Members(context.Context) ([]service.Member, error) {
	if err := b.refuse(); err != nil {
		return nil, err
	}
	return []service.Member{{ID: "n", GRPCAddr: b.lis.Addr().String(), Suffrage: "Voter", Leader: true}}, nil
}

func (b *testBackend) AddVoter(context.Context, string, string, string) error { return b.refuse() }
func (b *testBackend) RemoveServer(context.Context, string) error             { return b.refuse() }
func (b *testBackend) TransferLeadership(context.Context, string) error {
	return b.refuse()
}

func (b *testBackend) SnapshotSave(_ context.Context, w io.Writer) error {
	if err := b.refuse(); err != nil {
		return err
	}
	b.mu.Lock()
	s := b.f.Snapshot()
	b.mu.Unlock()
	return s.Write(w, snapshots.Header{NodeID: "n"})
}

func (b *testBackend) SnapshotRestore(_ context.Context, r io.Reader) error {
	if err := b.refuse(); err != nil {
		return err
	}
	nf := fsm.New()
	if _, err := nf.Restore(r); err != nil {
		return err
	}
	b.mu.Lock()
	b.f = nf
	b.mu.Unlock()
	return nil
}

// apply applies cmd directly, as setup, and requires it to succeed.
func (b *testBackend) apply(t testing.TB, cmd fsm.Command) fsm.Result {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.f.ApplyCommand(cmd)
	require.NoError(t, r.Err)
	return r
}

func (b *testBackend) digest() [32]byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.Digest()
}

func (b *testBackend) hasSession(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f.HasSession(id)
}

// expireSessions moves command time an hour on, so every session expires.
func (b *testBackend) expireSessions(t testing.TB) {
	b.mu.Lock()
	now := b.f.Stats().NowMs
	b.mu.Unlock()
	b.apply(t, &fsm.Tick{NowMs: max(now, b.Now()) + 3_600_000})
}

// trackingListener remembers its connections so a test can cut them.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) dropAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

// startNode serves a fresh testBackend on 127.0.0.1 and returns it with
// its address.
func startNode(t *testing.T) (*testBackend, string) {
	t.Helper()
	return startNodeWith(t, ServerConfig{})
}

func dialT(t *testing.T, endpoints ...string) *client.Client {
	t.Helper()
	c, err := client.Dial(client.Config{Endpoints: endpoints, MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// deadAddr is a local address nothing listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func seg(id string, base uint64) fsm.SegmentSpec {
	return fsm.SegmentSpec{ID: id, Name: "name-" + id, Base: base, Size: 64 << 20}
}
