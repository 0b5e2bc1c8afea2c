package etcdbridge

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// One embedded etcd serves the whole package; every test works under its
// own prefix.
var (
	testEtcd   *Embedded
	testClient *clientv3.Client
	prefixSeq  atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "etcdbridge-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	testEtcd, err = StartEmbedded(dir, "", "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "start embedded etcd:", err)
		return 1
	}
	defer testEtcd.Close()
	testClient, err = clientv3.New(clientv3.Config{Endpoints: testEtcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd client:", err)
		return 1
	}
	defer testClient.Close()
	return m.Run()
}

// newStore returns a store under a prefix no other test uses.
func newStore(t testing.TB) *Store {
	t.Helper()
	return New(testClient, Config{Prefix: fmt.Sprintf("test/%s/%d", t.Name(), prefixSeq.Add(1))})
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// entries returns entries first..first+n-1; tag varies the bytes.
func entries(first uint64, n int, tag string) []oplog.Entry {
	es := make([]oplog.Entry, n)
	for i := range es {
		seq := first + uint64(i)
		es[i] = oplog.NewEntry(seq, 1_700_000_000_000+int64(seq), oplog.OpRemove,
			fmt.Sprintf("dir/key-%s-%d", tag, seq), "", 1, oplog.SourceRemove)
	}
	return es
}

func requireCode(t *testing.T, err error, code errcode.Code) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, errcode.Of(err), "error: %v", err)
}

// entryKeys lists the seqs of every key in the entry range.
func entrySeqs(t *testing.T, s *Store) []uint64 {
	t.Helper()
	recs, _, err := s.ReadOpLogSince(testCtx(t), 0, 0)
	require.NoError(t, err)
	seqs := make([]uint64, len(recs))
	for i, r := range recs {
		seqs[i] = r.Seq
	}
	return seqs
}

func seqRange(first, last uint64) []uint64 {
	var r []uint64
	for s := first; s <= last; s++ {
		r = append(r, s)
	}
	return r
}
