package etcdbridge

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// ReadRenewals returns every current lease renewal and the etcd revision of
// the read.
func (s *Store) ReadRenewals(ctx context.Context) ([]oplog.Renewal, int64, error) {
	resp, err := s.c.Get(ctx, s.renewalDir, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, opErr(err, "lease_renewals: read %s", s.renewalDir)
	}
	rs := make([]oplog.Renewal, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		r, err := decodeRenewal(kv)
		if err != nil {
			return nil, 0, err
		}
		rs = append(rs, r)
	}
	return rs, resp.Header.Revision, nil
}

func decodeRenewal(kv *mvccpb.KeyValue) (oplog.Renewal, error) {
	r, err := oplog.DecodeRenewal(kv.Value)
	if err != nil {
		return oplog.Renewal{}, badData(string(kv.Key), "%v", err)
	}
	return r, nil
}

// Watch streams the entries and lease renewals put after revision afterRev
// (oplog.Feed). Two etcd watches run from afterRev+1, one on the entry
// range, one on lease_renewals/; each etcd watch response becomes one
// WatchEvent, its puts in revision order. Entries come in revision order and
// so do renewals; between the two kinds, a response waiting on each watch
// goes out older first, but the client library delivers the two watches
// separately, so an entry and a renewal may still swap (the follower must
// take a renewal that arrives before its key's entry anyway: the leader
// writes renewals beside the export, not after it). Deletes (cleanup,
// expired renewal leases) are filtered out by etcd. An entry put by hand out
// of seq order is delivered as written: the follower reorders.
//
// A failed watch sends one event with Err (INCOMPLETE_OPLOG_CATCH_UP when
// afterRev was compacted, the reader must re-read; ETCD_OPERATION_ERROR
// otherwise; INVALID_PARAMS for a key or renewal it cannot read) and closes
// the channel. The channel also closes when ctx ends; the goroutine and the
// etcd watches end with it.
func (s *Store) Watch(ctx context.Context, afterRev int64) <-chan oplog.WatchEvent {
	out := make(chan oplog.WatchEvent, 16)
	go s.watch(ctx, afterRev, out)
	return out
}

// A watchSource is one of Watch's two etcd watches.
type watchSource struct {
	ch      clientv3.WatchChan
	what    string
	pending *clientv3.WatchResponse // received, not yet converted
}

func (s *Store) watch(ctx context.Context, afterRev int64, out chan<- oplog.WatchEvent) {
	defer close(out)
	// WithRequireLeader: a member cut off from its cluster ends the watch
	// with an error instead of going silent.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	start := afterRev + 1
	src := [2]*watchSource{
		{ch: s.c.Watch(wctx, s.entryFirst, clientv3.WithRange(s.entryEnd), clientv3.WithRev(start), clientv3.WithFilterDelete()), what: "oplog entries"},
		{ch: s.c.Watch(wctx, s.renewalDir, clientv3.WithPrefix(), clientv3.WithRev(start), clientv3.WithFilterDelete()), what: "lease_renewals"},
	}
	send := func(ev oplog.WatchEvent) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	fail := func(err error) {
		if ctx.Err() == nil {
			send(oplog.WatchEvent{Err: err})
		}
	}
	for {
		// Wait for either watch, then take what the other has ready too,
		// so that two waiting responses go out in revision order.
		var closed *watchSource
		select {
		case <-ctx.Done():
			return
		case r, ok := <-src[0].ch:
			if !ok {
				closed = src[0]
			} else {
				src[0].pending = &r
			}
		case r, ok := <-src[1].ch:
			if !ok {
				closed = src[1]
			} else {
				src[1].pending = &r
			}
		}
		for _, w := range src {
			if w.pending != nil || w == closed {
				continue
			}
			select {
			case r, ok := <-w.ch:
				if ok {
					w.pending = &r
				} else if closed == nil {
					closed = w
				}
			default:
			}
		}
		order := src
		if src[0].pending != nil && src[1].pending != nil && firstRev(src[1].pending) < firstRev(src[0].pending) {
			order = [2]*watchSource{src[1], src[0]}
		}
		for _, w := range order {
			if w.pending == nil {
				continue
			}
			r := w.pending
			w.pending = nil
			ev, err := s.convert(w == src[0], r, afterRev)
			if err != nil {
				fail(err)
				return
			}
			if len(ev.Records)+len(ev.Renewals) > 0 && !send(ev) {
				return
			}
		}
		if closed != nil {
			fail(errcode.New(errcode.EtcdOperationError, "watch of %s from revision %d: closed by the etcd client", closed.what, start))
			return
		}
	}
}

// firstRev is the revision of a response's first event (or its header's).
func firstRev(r *clientv3.WatchResponse) int64 {
	if len(r.Events) > 0 {
		return r.Events[0].Kv.ModRevision
	}
	return r.Header.Revision
}

// convert turns one watch response into an event, or into the error that
// ends the watch.
func (s *Store) convert(entries bool, r *clientv3.WatchResponse, afterRev int64) (oplog.WatchEvent, error) {
	var ev oplog.WatchEvent
	if err := r.Err(); err != nil || r.Canceled {
		if r.CompactRevision != 0 {
			return ev, errcode.New(errcode.IncompleteOplogCatchUp,
				"watch from revision %d: etcd has compacted its history up to revision %d; re-read the OpLog and watch again",
				afterRev+1, r.CompactRevision)
		}
		if err == nil {
			err = errors.New("watch canceled by etcd")
		}
		return ev, opErr(err, "watch from revision %d", afterRev+1)
	}
	for _, e := range r.Events {
		if e.Type != clientv3.EventTypePut {
			continue
		}
		if entries {
			seq, err := s.parseEntryKey(e.Kv.Key)
			if err != nil {
				return ev, err
			}
			ev.Records = append(ev.Records, oplog.Record{Seq: seq, Value: e.Kv.Value})
			continue
		}
		rn, err := decodeRenewal(e.Kv)
		if err != nil {
			return ev, err
		}
		ev.Renewals = append(ev.Renewals, rn)
	}
	return ev, nil
}
