package etcdbridge

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// PutRenewals writes one flush of lease renewals (seed 000): it grants one
// etcd lease of RenewalLeaseTTL and puts every renewal attached to it, in
// transactions of at most MaxTxnOps puts, so renewals not refreshed within a
// minute vanish by themselves. A key given twice keeps its last renewal.
func (s *Store) PutRenewals(ctx context.Context, rs []oplog.Renewal) error {
	if len(rs) == 0 {
		return nil
	}
	// etcd refuses a transaction that puts one key twice.
	idx := make(map[string]int, len(rs))
	uniq := make([]oplog.Renewal, 0, len(rs))
	for _, r := range rs {
		if r.Key == "" {
			return errcode.New(errcode.InvalidParams, "lease_renewals: empty key")
		}
		if i, ok := idx[r.Key]; ok {
			uniq[i] = r
			continue
		}
		idx[r.Key] = len(uniq)
		uniq = append(uniq, r)
	}
	lease, err := s.c.Grant(ctx, int64(RenewalLeaseTTL.Seconds()))
	s.stats.renewalTxns.Add(1)
	if err != nil {
		return opErr(err, "lease_renewals: grant a %v lease", RenewalLeaseTTL)
	}
	for lo := 0; lo < len(uniq); lo += s.cfg.MaxTxnOps {
		hi := min(lo+s.cfg.MaxTxnOps, len(uniq))
		ops := make([]clientv3.Op, 0, hi-lo)
		var bytes int
		for _, r := range uniq[lo:hi] {
			k, v := s.RenewalKey(r.Key), oplog.EncodeRenewal(r)
			bytes += len(k) + len(v)
			ops = append(ops, clientv3.OpPut(k, string(v), clientv3.WithLease(lease.ID)))
		}
		s.stats.renewalTxns.Add(1)
		s.stats.renewalBytes.Add(uint64(bytes))
		if _, err := s.c.Txn(ctx).Then(ops...).Commit(); err != nil {
			return opErr(err, "lease_renewals: put %d renewals", hi-lo)
		}
	}
	return nil
}
