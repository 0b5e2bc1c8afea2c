package etcdbridge

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// collect reads events until enough records and renewals came, failing
// on an Err event, a closed channel or a timeout.
func collect(t *testing.T, ch <-chan oplog.WatchEvent, records, renewals int) ([]oplog.Record, []oplog.Renewal) {
	t.Helper()
	var recs []oplog.Record
	var rens []oplog.Renewal
	timeout := time.After(10 * time.Second)
	for len(recs) < records || len(rens) < renewals {
		select {
		case ev, ok := <-ch:
			require.True(t, ok, "watch closed early")
			require.NoError(t, ev.Err)
			require.NotEmpty(t, len(ev.Records)+len(ev.Renewals), "no empty events")
			recs = append(recs, ev.Records...)
			rens = append(rens, ev.Renewals...)
		case <-timeout:
			t.Fatalf("timed out with %d/%d records, %d/%d renewals", len(recs), records, len(rens), renewals)
		}
	}
	return recs, rens
}

// requireClosed waits for ch to close, returning the Err events seen.
func requireClosed(t *testing.T, ch <-chan oplog.WatchEvent) []error {
	t.Helper()
	var errs []error
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return errs
			}
			if ev.Err != nil {
				errs = append(errs, ev.Err)
			}
		case <-timeout:
			t.Fatal("watch channel not closed")
		}
	}
}

func TestWatch(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	require.NoError(t, s.WriteOpLogBatch(ctx, 0, entries(1, 3, "w"), nil))
	recs, rev, err := s.ReadSince(ctx, 0, 100)
	require.NoError(t, err)
	require.Len(t, recs, 3)

	wctx, cancel := context.WithCancel(ctx)
	ch := s.Watch(wctx, rev)

	es := entries(4, 4, "w")
	require.NoError(t, s.WriteOpLogBatch(ctx, 3, es[:2], nil))
	rs := []oplog.Renewal{{Key: "k1", LeaseTimeoutMs: 10, SoftPinTimeoutMs: 20, TimestampMs: 5}, {Key: "k2", LeaseTimeoutMs: 11}}
	require.NoError(t, s.PutRenewals(ctx, rs))
	require.NoError(t, s.WriteOpLogBatch(ctx, 5, es[2:], nil))
	// Cleanup deletes and other keys of the OpLog directory are not delivered.
	_, err = s.CleanupOpLogBefore(ctx, 3)
	require.NoError(t, err)
	require.NoError(t, s.RecordSnapshotSequenceId(ctx, "s", 7))
	require.NoError(t, s.UpdateLatestSequenceId(ctx, 9))
	// Entries put by hand out of order come as written: 9 before 8.
	e8, e9 := entries(8, 2, "w")[0], entries(8, 2, "w")[1]
	_, err = s.Client().Put(ctx, s.EntryKey(9), string(e9.Encode()))
	require.NoError(t, err)
	_, err = s.Client().Put(ctx, s.EntryKey(8), string(e8.Encode()))
	require.NoError(t, err)

	got, rens := collect(t, ch, 6, 2)
	var seqs []uint64
	for _, r := range got {
		seqs = append(seqs, r.Seq)
	}
	require.Equal(t, []uint64{4, 5, 6, 7, 9, 8}, seqs)
	require.Equal(t, es[0].Encode(), got[0].Value)
	require.Equal(t, e8.Encode(), got[5].Value)
	require.ElementsMatch(t, rs, rens)

	// The renewals came between entries 5 and 6 in etcd; nothing else is pending.
	select {
	case ev := <-ch:
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	require.Empty(t, requireClosed(t, ch), "cancel closes without an error")
}

func TestWatchOrderWithinKinds(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	_, rev, err := s.ReadSince(ctx, 0, 1)
	require.NoError(t, err)
	ch := s.Watch(ctx, rev)
	// Interleaved writes, some before the watch catches up and some after.
	var want []oplog.Renewal
	for i := range 20 {
		require.NoError(t, s.WriteOpLogBatch(ctx, uint64(2*i), entries(uint64(2*i+1), 2, "o"), nil))
		r := oplog.Renewal{Key: "r", TimestampMs: int64(i)}
		require.NoError(t, s.PutRenewals(ctx, []oplog.Renewal{r}))
		want = append(want, r)
	}
	recs, rens := collect(t, ch, 40, 20)
	for i, r := range recs {
		require.Equal(t, uint64(i+1), r.Seq)
	}
	require.Equal(t, want, rens, "renewals of one key come in the order written")
}

func TestWatchBadKeyEndsWithError(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	_, rev, err := s.ReadSince(ctx, 0, 1)
	require.NoError(t, err)
	ch := s.Watch(ctx, rev)
	_, err = s.Client().Put(ctx, s.oplogDir+"5", "{}") // the notes' unpadded form
	require.NoError(t, err)
	errs := requireClosed(t, ch)
	require.Len(t, errs, 1)
	requireCode(t, errs[0], errcode.InvalidParams)
	require.Contains(t, errs[0].Error(), s.oplogDir+"5")
}

func TestWatchCompacted(t *testing.T) {
	s := newStore(t)
	ctx := testCtx(t)
	_, rev, err := s.ReadSince(ctx, 0, 1)
	require.NoError(t, err)
	require.NoError(t, s.WriteOpLogBatch(ctx, 0, entries(1, 2, "z"), nil))
	require.NoError(t, s.WriteOpLogBatch(ctx, 2, entries(3, 2, "z"), nil))
	resp, err := s.Client().Get(ctx, s.LatestKey())
	require.NoError(t, err)
	_, err = s.Client().Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	require.NoError(t, err)

	errs := requireClosed(t, s.Watch(ctx, rev))
	require.Len(t, errs, 1)
	requireCode(t, errs[0], errcode.IncompleteOplogCatchUp)
	require.Contains(t, errs[0].Error(), "compacted")
}

func TestWatchEndsWithContext(t *testing.T) {
	s := newStore(t)
	_, rev, err := s.ReadSince(testCtx(t), 0, 1)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ch := s.Watch(ctx, rev)
	cancel()
	require.Empty(t, requireClosed(t, ch))

	// A reader that stops reading does not keep the goroutine alive: it
	// blocks on a full channel until ctx ends.
	ctx2, cancel2 := context.WithCancel(context.Background())
	ch2 := s.Watch(ctx2, rev)
	require.NoError(t, s.WriteOpLog(testCtx(t), entries(1, 1, "e")[0]))
	collect(t, ch2, 1, 0)
	for seq := uint64(2); seq <= 40; seq++ {
		require.NoError(t, s.WriteOpLog(testCtx(t), entries(seq, 1, "e")[0]))
	}
	time.Sleep(200 * time.Millisecond)
	cancel2()
	require.Empty(t, requireClosed(t, ch2))
}
