package etcdbridge

import (
	"context"
	"encoding/json"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/moonraft/moonraft/errcode"
)

// MasterView is the leader clients find in etcd: the Raft leader of Term.
type MasterView struct {
	LeaderID string `json:"leader_id"`
	GRPCAddr string `json:"grpc_addr"`
	RaftAddr string `json:"raft_addr"`
	Term     uint64 `json:"term"`
}

// MasterView returns the published view, and whether there is one.
func (s *Store) MasterView(ctx context.Context) (MasterView, bool, error) {
	v, _, ok, err := s.readView(ctx)
	return v, ok, err
}

func (s *Store) readView(ctx context.Context) (v MasterView, modRev int64, ok bool, err error) {
	resp, err := s.c.Get(ctx, s.viewKey)
	if err != nil {
		return v, 0, false, opErr(err, "master_view: read %s", s.viewKey)
	}
	if len(resp.Kvs) == 0 {
		return v, 0, false, nil
	}
	kv := resp.Kvs[0]
	if err := json.Unmarshal(kv.Value, &v); err != nil {
		return MasterView{}, 0, false, badData(s.viewKey, "invalid master_view JSON: %v", err)
	}
	return v, kv.ModRevision, true, nil
}

// PublishMasterView writes v unless etcd holds a view of the same or a
// higher term (then *StaleTermError); republishing the identical view
// succeeds, so a retry after an ambiguous failure is safe. etcd cannot
// compare numbers inside JSON, so the term is compared here and the put is
// guarded on the mod revision that was read, retried on conflict.
func (s *Store) PublishMasterView(ctx context.Context, v MasterView) error {
	if v.LeaderID == "" || v.Term == 0 {
		return errcode.New(errcode.InvalidParams, "master_view: leader_id must be set and term >= 1 (got %q, %d)", v.LeaderID, v.Term)
	}
	val, _ := json.Marshal(v) // strings and a number always marshal
	for {
		cur, modRev, ok, err := s.readView(ctx)
		if err != nil {
			return err
		}
		if ok && cur == v {
			return nil
		}
		if ok && cur.Term >= v.Term {
			return &StaleTermError{Term: v.Term, Stored: cur}
		}
		resp, err := s.c.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(s.viewKey), "=", modRev)).
			Then(clientv3.OpPut(s.viewKey, string(val))).
			Commit()
		if err != nil {
			return opErr(err, "master_view: publish term %d", v.Term)
		}
		if resp.Succeeded {
			return nil
		}
	}
}
