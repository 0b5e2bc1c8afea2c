package etcdbridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

func TestPutRenewals(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	n := 2*s.Config().MaxTxnOps + 7
	var rs []oplog.Renewal
	for i := range n {
		rs = append(rs, oplog.Renewal{Key: fmt.Sprintf("obj/%d", i), LeaseTimeoutMs: int64(1000 + i), SoftPinTimeoutMs: int64(i), TimestampMs: 42})
	}
	// A key twice keeps its last renewal (and does not break the txn).
	rs = append(rs, oplog.Renewal{Key: "obj/0", LeaseTimeoutMs: 99, TimestampMs: 43})
	require.NoError(t, s.PutRenewals(ctx, rs))
	require.NoError(t, s.PutRenewals(ctx, nil))
	requireCode(t, s.PutRenewals(ctx, []oplog.Renewal{{}}), errcode.InvalidParams)

	got, rev, err := s.ReadRenewals(ctx)
	require.NoError(t, err)
	require.Positive(t, rev)
	require.Len(t, got, n)
	want := append([]oplog.Renewal{rs[n]}, rs[1:n]...)
	require.ElementsMatch(t, want, got)

	resp, err := s.Client().Get(ctx, s.RenewalKey("obj/7"))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	r, err := oplog.DecodeRenewal(resp.Kvs[0].Value)
	require.NoError(t, err)
	require.Equal(t, rs[7], r)
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	require.NotZero(t, lease)
	ttl, err := s.Client().TimeToLive(ctx, lease, clientv3.WithAttachedKeys())
	require.NoError(t, err)
	require.Equal(t, int64(60), ttl.GrantedTTL)
	require.InDelta(t, 60, ttl.TTL, 5)
	require.Len(t, ttl.Keys, n, "every key of the flush is on one lease")
}

func TestMasterView(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	_, ok, err := s.MasterView(ctx)
	require.NoError(t, err)
	require.False(t, ok)

	v2 := MasterView{LeaderID: "n2", GRPCAddr: "10.0.0.2:50051", RaftAddr: "10.0.0.2:7000", Term: 2}
	require.NoError(t, s.PublishMasterView(ctx, v2))
	require.NoError(t, s.PublishMasterView(ctx, v2), "republishing the same view is a no-op")

	err = s.PublishMasterView(ctx, MasterView{LeaderID: "n1", Term: 1})
	requireCode(t, err, errcode.EtcdTransactionFail)
	require.Contains(t, err.Error(), "term 2 already published by n2")
	var st *StaleTermError
	require.ErrorAs(t, err, &st)
	require.Equal(t, v2, st.Stored)
	requireCode(t, s.PublishMasterView(ctx, MasterView{LeaderID: "n3", Term: 2}), errcode.EtcdTransactionFail)

	v3 := MasterView{LeaderID: "n3", GRPCAddr: "g3", RaftAddr: "r3", Term: 3}
	require.NoError(t, s.PublishMasterView(ctx, v3))
	got, ok, err := s.MasterView(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, v3, got)

	resp, err := s.Client().Get(ctx, s.Config().Prefix+"/mooncake_cluster/moonraft_view")
	require.NoError(t, err)
	require.JSONEq(t, `{"leader_id":"n3","grpc_addr":"g3","raft_addr":"r3","term":3}`, string(resp.Kvs[0].Value))

	requireCode(t, s.PublishMasterView(ctx, MasterView{Term: 9}), errcode.InvalidParams)

	// Publishers racing with terms 4..19 leave the highest term.
	var wg sync.WaitGroup
	for term := uint64(4); term < 20; term++ {
		wg.Go(func() {
			err := s.PublishMasterView(ctx, MasterView{LeaderID: fmt.Sprintf("n%d", term), Term: term})
			var st *StaleTermError
			if err != nil && !errors.As(err, &st) {
				t.Errorf("term %d: %v", term, err)
			}
		})
	}
	wg.Wait()
	got, _, err = s.MasterView(ctx)
	require.NoError(t, err)
	require.Equal(t, MasterView{LeaderID: "n19", Term: 19}, got)
}

func TestBadDataInEtcd(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	put := func(k, v string) {
		_, err := s.Client().Put(ctx, k, v)
		require.NoError(t, err)
	}
	requireNamed := func(err error, key string) {
		t.Helper()
		requireCode(t, err, errcode.InvalidParams)
		require.Contains(t, err.Error(), key)
	}

	put(s.LatestKey(), "abc")
	_, err := s.Latest(ctx)
	requireNamed(err, s.LatestKey())
	requireNamed(s.UpdateLatestSequenceId(ctx, 5), s.LatestKey())
	requireNamed(s.WriteOpLogBatch(ctx, 0, entries(1, 1, "b"), nil), s.LatestKey())
	put(s.LatestKey(), "99999999999999999999999")
	_, err = s.Latest(ctx)
	requireNamed(err, s.LatestKey())
	put(s.LatestKey(), "007")
	n, err := s.Latest(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(7), n)
	requireNamed(s.WriteOpLogBatch(ctx, 7, entries(8, 1, "b"), nil), s.LatestKey())

	bad := s.oplogDir + "12"
	put(bad, "{}")
	_, _, err = s.ReadOpLogSince(ctx, 0, 0)
	requireNamed(err, bad)
	_, err = s.GetMinSequenceId(ctx)
	requireNamed(err, bad)

	put(s.SnapshotKey("x"), "-1")
	_, _, err = s.SnapshotSequenceId(ctx, "x")
	requireNamed(err, s.SnapshotKey("x"))

	put(s.RenewalKey("k"), "not json")
	_, _, err = s.ReadRenewals(ctx)
	requireNamed(err, s.RenewalKey("k"))

	put(s.MasterViewKey(), `{"term":"x"}`)
	_, _, err = s.MasterView(ctx)
	requireNamed(err, s.MasterViewKey())
	requireNamed(s.PublishMasterView(ctx, MasterView{LeaderID: "a", Term: 1}), s.MasterViewKey())
}

func TestContextRespected(t *testing.T) {
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Latest(ctx)
	requireCode(t, err, errcode.EtcdOperationError)
	require.ErrorIs(t, err, context.Canceled)
	requireCode(t, s.WriteOpLogBatch(ctx, 0, entries(1, 1, "c"), nil), errcode.EtcdOperationError)
	requireCode(t, s.PublishMasterView(ctx, MasterView{LeaderID: "a", Term: 1}), errcode.EtcdOperationError)
	requireCode(t, s.PutRenewals(ctx, []oplog.Renewal{{Key: "a"}}), errcode.EtcdOperationError)
}

func TestOpen(t *testing.T) {
	prefix := fmt.Sprintf("test/open/%d", prefixSeq.Add(1))
	s, err := Open(Config{Endpoints: testEtcd.Endpoints(), Prefix: prefix + "/"})
	require.NoError(t, err)
	ctx := testCtx(t)
	require.NoError(t, s.WriteOpLog(ctx, entries(1, 1, "o")[0]))
	require.Equal(t, prefix+"/oplog/mooncake_cluster/latest", s.LatestKey())
	require.NoError(t, s.Close())

	_, err = Open(Config{})
	requireCode(t, err, errcode.InvalidParams)
}

func TestOpenUnreachable(t *testing.T) {
	url, err := FreeLocalURL() // nothing listens there
	require.NoError(t, err)
	start := time.Now()
	_, err = Open(Config{Endpoints: []string{url}, DialTimeout: time.Second})
	requireCode(t, err, errcode.EtcdOperationError)
	require.Contains(t, err.Error(), url)
	require.Less(t, time.Since(start), 10*time.Second)
}

// TestMooncakeView: the leader's Mooncake address at master_view in
// Mooncake's format, on a lease, fenced by moonraft's own view; the JSON an
// earlier release left there is removed.
func TestMooncakeView(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	key := s.Config().Prefix + "/mooncake_cluster/master_view"
	_, err := s.Client().Put(ctx, key, `{"leader_id":"old","grpc_addr":"g","raft_addr":"r","term":1}`)
	require.NoError(t, err)
	require.NoError(t, s.DropLegacyView(ctx))
	_, ok, err := s.MooncakeView(ctx)
	require.NoError(t, err)
	require.False(t, ok, "an earlier release's JSON view is gone")
	_, err = s.MooncakeMaster(ctx)
	require.Equal(t, errcode.EtcdKeyNotExist, errcode.Of(err), "no master to connect to yet: %v", err)

	v2 := MasterView{LeaderID: "n2", Term: 2}
	require.NoError(t, s.PublishMasterView(ctx, v2))
	lease, err := s.PublishMooncakeView(ctx, v2, "10.0.0.2:50051")
	require.NoError(t, err)
	addr, ok, err := s.MooncakeView(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "10.0.0.2:50051", addr, "the bare host:port, as Mooncake's clients read it")
	master, err := s.MooncakeMaster(ctx)
	require.NoError(t, err)
	require.Equal(t, addr, master)
	require.NoError(t, s.DropLegacyView(ctx))
	_, ok, _ = s.MooncakeView(ctx)
	require.True(t, ok, "a Mooncake-format view stays")

	require.NoError(t, s.PublishMasterView(ctx, MasterView{LeaderID: "n3", Term: 3}))
	_, err = s.PublishMooncakeView(ctx, v2, "10.0.0.2:50051")
	requireCode(t, err, errcode.EtcdTransactionFail)

	kctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.KeepMooncakeView(kctx, lease); close(done) }()
	stop()
	<-done
	_, ok, err = s.MooncakeView(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a leader that stops leading revokes its view at once")
}

// TestMooncakeViewIsCreatedAnew: Mooncake's clients switch masters when the
// view's create revision grows, so a new leader's view is a new key.
func TestMooncakeViewIsCreatedAnew(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	key := s.Config().Prefix + "/mooncake_cluster/master_view"
	rev := func() int64 {
		resp, err := s.Client().Get(ctx, key)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		return resp.Kvs[0].CreateRevision
	}
	v1, v2 := MasterView{LeaderID: "n1", Term: 1}, MasterView{LeaderID: "n2", Term: 2}
	require.NoError(t, s.PublishMasterView(ctx, v1))
	_, err := s.PublishMooncakeView(ctx, v1, "10.0.0.1:50051")
	require.NoError(t, err)
	first := rev()
	require.NoError(t, s.PublishMasterView(ctx, v2))
	_, err = s.PublishMooncakeView(ctx, v2, "10.0.0.2:50051")
	require.NoError(t, err)
	require.Greater(t, rev(), first, "the next leader's view is a new key")
}

// TestEmbeddedCompacts: the embedded etcd compacts its history on a
// period; the OpLog and lease renewals rewrite keys all the time, and
// without it etcd's database grew ~20 MiB a minute under the soak. Its
// quota leaves room for the history of a burst of writes.
func TestEmbeddedCompacts(t *testing.T) {
	cfg := testEtcd.etcd.Config()
	require.Equal(t, "periodic", cfg.AutoCompactionMode)
	require.Equal(t, EmbeddedCompactionRetention.String(), cfg.AutoCompactionRetention)
	require.Equal(t, int64(EmbeddedQuotaBytes), cfg.QuotaBackendBytes)
}

// TestOpErrSaysWhatToDo: an etcd refusal a person must act on says how.
func TestOpErrSaysWhatToDo(t *testing.T) {
	for _, tc := range []struct {
		cause error
		want  string
	}{
		{rpctypes.ErrNoSpace, "etcdctl alarm disarm"},
		{rpctypes.ErrTooManyOps, "--max-txn-ops"},
		{rpctypes.ErrRequestTooLarge, "--max-request-bytes"},
		{context.DeadlineExceeded, "unreachable or too slow"},
	} {
		err := opErr(tc.cause, "oplog: write entries %d..%d", 1, 2)
		assert.Equal(t, errcode.EtcdOperationError, errcode.Of(err), "%v", tc.cause)
		assert.Contains(t, err.Error(), tc.want, "%v", tc.cause)
		assert.ErrorIs(t, err, tc.cause)
	}
}
