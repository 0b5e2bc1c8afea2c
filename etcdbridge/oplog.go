package etcdbridge

import (
	"context"
	"strconv"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// WriteOpLog writes one entry, continuing from SequenceID-1.
func (s *Store) WriteOpLog(ctx context.Context, e oplog.Entry) error {
	if e.SequenceID == 0 {
		return errcode.New(errcode.InvalidParams, "oplog: sequence_id 0 cannot be written")
	}
	return s.WriteOpLogBatch(ctx, e.SequenceID-1, []oplog.Entry{e}, nil)
}

// FitBatch encodes the leading entries of es that one WriteOpLogBatch can
// take: at most MaxBatch, and no more encoded bytes than MaxTxnBytes (but at
// least one, so an oversized entry is still tried and etcd says why). Pass
// the encodings on to WriteOpLogBatch: an entry is encoded once, and the
// batch's encodings share one buffer.
func (s *Store) FitBatch(es []oplog.Entry) [][]byte {
	n := min(len(es), s.MaxBatch())
	values := make([][]byte, 0, n)
	buf := make([]byte, 0, min(s.cfg.MaxTxnBytes, n*entrySizeHint))
	size := 0
	for len(values) < n {
		start := len(buf)
		buf = es[len(values)].AppendJSON(buf)
		// key + value + a little protobuf framing
		size += len(s.oplogDir) + seqKeyLen + 16 + len(buf) - start
		if len(values) > 0 && size > s.cfg.MaxTxnBytes {
			break
		}
		// An append past the buffer's room moves the rest to a new one;
		// the values already taken keep the old.
		values = append(values, buf[start:len(buf):len(buf)])
	}
	return values
}

// entrySizeHint is about a PUT_END entry's encoding with one replica.
const entrySizeHint = 512

// WriteOpLogBatch writes es, which must be prev+1, prev+2, ... in order, and
// sets latest to the last one, all in one etcd transaction guarded on
// latest == prev (for prev 0: latest absent or "0") and on no key existing
// in the range of the batch's entry keys (one range comparison, not one
// per entry: etcd's work per entry is the export's largest cost): the
// OpLog in etcd can get neither a gap nor an overwrite.
// A lost guard returns *FencedError with the latest found. An empty es
// writes nothing. values are the entries' encodings from FitBatch (nil:
// encoded here).
func (s *Store) WriteOpLogBatch(ctx context.Context, prev uint64, es []oplog.Entry, values [][]byte) error {
	if len(es) == 0 {
		return nil
	}
	if values != nil && len(values) != len(es) {
		return errcode.New(errcode.InvalidParams, "oplog: %d encodings for %d entries", len(values), len(es))
	}
	if len(es) > s.MaxBatch() {
		return errcode.New(errcode.InvalidParams,
			"oplog: batch of %d entries exceeds MaxBatch %d (MaxTxnOps %d less one for latest)",
			len(es), s.MaxBatch(), s.cfg.MaxTxnOps)
	}
	if prev+uint64(len(es)) < prev {
		return errcode.New(errcode.InvalidParams, "oplog: batch after %d overflows the sequence ids", prev)
	}
	last := prev + uint64(len(es))
	txn := newPutTxn(len(es) + 1)
	var bytes int // keys and values put, for Stats
	// The entries' keys, in one buffer made to their size.
	keys := make([]byte, 0, len(es)*(len(s.oplogDir)+seqKeyLen))
	for i, e := range es {
		if want := prev + 1 + uint64(i); e.SequenceID != want {
			return errcode.New(errcode.InvalidParams,
				"oplog: entry %d of the batch has sequence_id %d, want %d (a batch continues prev=%d without gaps)",
				i, e.SequenceID, want, prev)
		}
		var v []byte
		if values != nil {
			v = values[i]
		} else {
			v = e.Encode()
		}
		start := len(keys)
		keys = s.appendEntryKey(keys, e.SequenceID)
		txn.put(keys[start:], v)
		bytes += len(keys) - start + len(v)
	}
	txn.put([]byte(s.latestKey), strconv.AppendUint(nil, last, 10))
	first, end := s.EntryKey(prev+1), s.EntryKey(last)+"\x00"
	absent := clientv3.Compare(clientv3.CreateRevision(first), "=", 0).WithRange(end)
	txn.req.Failure = []*pb.RequestOp{
		{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(s.latestKey)}}},
		{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(first), RangeEnd: []byte(end), KeysOnly: true, Limit: 1}}},
	}

	// etcd's If is a conjunction, so "absent or 0" for prev 0 takes two
	// tries: absent first (a fresh OpLog), then "0" if latest holds that.
	guardValue := prev != 0
	for attempt := 0; ; attempt++ {
		var guard clientv3.Cmp
		if guardValue {
			guard = clientv3.Compare(clientv3.Value(s.latestKey), "=", strconv.FormatUint(prev, 10))
		} else {
			guard = clientv3.Compare(clientv3.CreateRevision(s.latestKey), "=", 0)
		}
		txn.req.Compare = []*pb.Compare{absent.GetCompare(), guard.GetCompare()}
		resp, err := s.kv.Txn(ctx, &txn.req, kvCallOpts...)
		err = clientv3.ContextError(ctx, err)
		s.stats.oplogTxns.Add(1)
		if err == nil && resp.Succeeded {
			s.stats.oplogBytes.Add(uint64(bytes))
		}
		if err != nil {
			return opErr(err, "oplog: write entries %d..%d", prev+1, last)
		}
		if resp.Succeeded {
			return nil
		}
		// The Else reads ran in the same transaction: they show why it failed.
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		var cur uint64
		if len(kvs) > 0 {
			if cur, err = parseDecimal(s.latestKey, kvs[0].Value); err != nil {
				return err
			}
		}
		if cur != prev {
			return &FencedError{Latest: cur, Prev: prev}
		}
		if ex := resp.Responses[1].GetResponseRange().GetKvs(); len(ex) > 0 {
			return errcode.New(errcode.EtcdTransactionFail,
				"oplog: etcd key %q already exists although latest is %d; refusing to overwrite it (entries past latest were written by someone else)",
				ex[0].Key, cur)
		}
		if len(kvs) > 0 && string(kvs[0].Value) != strconv.FormatUint(prev, 10) {
			return badData(s.latestKey, "value %q is not in canonical decimal form; a guarded write cannot match it", truncate(kvs[0].Value))
		}
		// Only prev 0 gets here: latest is "0" where the guard wanted it
		// absent, or absent where it wanted "0" (deleted in between).
		if attempt >= 3 {
			return errcode.New(errcode.EtcdTransactionFail, "oplog: %s keeps appearing and disappearing; write of entries %d..%d abandoned", s.latestKey, prev+1, last)
		}
		guardValue = len(kvs) > 0
	}
}

// readLatest returns latest (0 if absent), its mod revision (0 if absent)
// and the read's revision.
func (s *Store) readLatest(ctx context.Context) (seq uint64, modRev, rev int64, err error) {
	resp, err := s.c.Get(ctx, s.latestKey)
	if err != nil {
		return 0, 0, 0, opErr(err, "oplog: read %s", s.latestKey)
	}
	rev = resp.Header.Revision
	if len(resp.Kvs) == 0 {
		return 0, 0, rev, nil
	}
	seq, err = parseDecimal(s.latestKey, resp.Kvs[0].Value)
	return seq, resp.Kvs[0].ModRevision, rev, err
}

// Latest returns the largest exported sequence id, 0 if none.
func (s *Store) Latest(ctx context.Context) (uint64, error) {
	seq, _, _, err := s.readLatest(ctx)
	return seq, err
}

// UpdateLatestSequenceId moves latest forward to seq; it never moves it
// back. Values are decimal strings, which etcd compares as bytes ("9" >
// "10"), so the decision is made here and the write is guarded on the mod
// revision that was read.
func (s *Store) UpdateLatestSequenceId(ctx context.Context, seq uint64) error {
	for {
		cur, modRev, _, err := s.readLatest(ctx)
		if err != nil {
			return err
		}
		if cur >= seq {
			return nil
		}
		resp, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(s.latestKey), "=", modRev)).
			Then(clientv3.OpPut(s.latestKey, strconv.FormatUint(seq, 10))).
			Commit()
		if err != nil {
			return opErr(err, "oplog: update %s to %d", s.latestKey, seq)
		}
		if resp.Succeeded {
			return nil
		}
	}
}

// ReadOpLogSince returns up to limit entries with seq > after, in seq order,
// and the etcd revision of the read; limit <= 0 means no limit. Values are
// the raw JSON: the reader decodes and verifies them.
func (s *Store) ReadOpLogSince(ctx context.Context, after uint64, limit int) ([]oplog.Record, int64, error) {
	start := s.EntryKey(after + 1)
	if after+1 == 0 {
		start = s.entryEnd // nothing follows the largest sequence id: an empty range
	}
	opts := []clientv3.OpOption{clientv3.WithRange(s.entryEnd), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
	if limit > 0 {
		opts = append(opts, clientv3.WithLimit(int64(limit)))
	}
	resp, err := s.c.Get(ctx, start, opts...)
	if err != nil {
		return nil, 0, opErr(err, "oplog: read entries after %d", after)
	}
	recs := make([]oplog.Record, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		seq, err := s.parseEntryKey(kv.Key)
		if err != nil {
			return nil, 0, err
		}
		recs = append(recs, oplog.Record{Seq: seq, Value: kv.Value})
	}
	return recs, resp.Header.Revision, nil
}

// ReadSince implements oplog.Feed with ReadOpLogSince.
func (s *Store) ReadSince(ctx context.Context, after uint64, limit int) ([]oplog.Record, int64, error) {
	return s.ReadOpLogSince(ctx, after, limit)
}

// GetMinSequenceId returns the smallest stored entry's sequence id, 0 if
// there is none.
func (s *Store) GetMinSequenceId(ctx context.Context) (uint64, error) {
	resp, err := s.c.Get(ctx, s.entryFirst, clientv3.WithRange(s.entryEnd),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return 0, opErr(err, "oplog: read the first entry")
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return s.parseEntryKey(resp.Kvs[0].Key)
}

func checkSnapshotID(id string) error {
	if id == "" || strings.Contains(id, "/") {
		return errcode.New(errcode.InvalidParams, "oplog: snapshot id %q must be non-empty and contain no '/'", id)
	}
	return nil
}

// RecordSnapshotSequenceId records that snapshot snapshotID covers the
// OpLog up to seq.
func (s *Store) RecordSnapshotSequenceId(ctx context.Context, snapshotID string, seq uint64) error {
	if err := checkSnapshotID(snapshotID); err != nil {
		return err
	}
	k := s.SnapshotKey(snapshotID)
	if _, err := s.c.Put(ctx, k, strconv.FormatUint(seq, 10)); err != nil {
		return opErr(err, "oplog: write %s", k)
	}
	return nil
}

// SnapshotSequenceId returns the seq recorded for snapshotID, and whether
// one is recorded.
func (s *Store) SnapshotSequenceId(ctx context.Context, snapshotID string) (uint64, bool, error) {
	if err := checkSnapshotID(snapshotID); err != nil {
		return 0, false, err
	}
	k := s.SnapshotKey(snapshotID)
	resp, err := s.c.Get(ctx, k)
	if err != nil {
		return 0, false, opErr(err, "oplog: read %s", k)
	}
	if len(resp.Kvs) == 0 {
		return 0, false, nil
	}
	seq, err := parseDecimal(k, resp.Kvs[0].Value)
	return seq, err == nil, err
}

// CleanupOpLogBefore deletes the entries with seq < seq (from the smallest
// stored one, as the notes do) and returns how many went. The range holds
// entry keys only: latest and snapshot/ are never touched. The caller keeps
// seq <= latest+1 (DESIGN: cleanup follows a snapshot that etcd covers).
func (s *Store) CleanupOpLogBefore(ctx context.Context, seq uint64) (int64, error) {
	if seq <= 1 {
		return 0, nil
	}
	min, err := s.GetMinSequenceId(ctx)
	if err != nil || min == 0 || min >= seq {
		return 0, err
	}
	return s.DeleteOpLogRange(ctx, min, seq)
}

// DeleteOpLogRange deletes the entries from seq from to before (exclusive)
// in one transaction; those already gone are skipped. etcd applies one
// transaction at a time, so a range of millions of entries holds up every
// other writer for seconds: delete in chunks beside other work.
func (s *Store) DeleteOpLogRange(ctx context.Context, from, before uint64) (int64, error) {
	if from >= before {
		return 0, nil
	}
	resp, err := s.c.Delete(ctx, s.EntryKey(from), clientv3.WithRange(s.EntryKey(before)))
	if err != nil {
		return 0, opErr(err, "oplog: delete entries %d..%d", from, before-1)
	}
	return resp.Deleted, nil
}
