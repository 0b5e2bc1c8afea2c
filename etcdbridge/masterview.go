package etcdbridge

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

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

// MooncakeViewTTL is the etcd lease of the Mooncake-format view, as
// Mooncake's own masters hold it (DEFAULT_MASTER_VIEW_LEASE_TTL_SEC).
const MooncakeViewTTL = 5 * time.Second

// PublishMooncakeView writes addr, the leader's Mooncake-protocol address,
// at {prefix}/{cluster}/master_view in Mooncake's format (the bare
// host:port, on an etcd lease of MooncakeViewTTL), where Mooncake's HA
// clients watch for their master. It is fenced by v: the put happens only
// while etcd holds v as moonraft's view (a deposed leader cannot write).
// It returns the lease, which the caller keeps alive while it leads and
// revokes when it stops.
//
// Mooncake's clients take the key's create revision for the view's version
// and switch masters only when it grows, so the key is deleted and created
// anew, never overwritten.
func (s *Store) PublishMooncakeView(ctx context.Context, v MasterView, addr string) (clientv3.LeaseID, error) {
	val, _ := json.Marshal(v)
	ours := clientv3.Compare(clientv3.Value(s.viewKey), "=", string(val))
	// The lease first: a client that reads the key between the delete and
	// the create finds no master, so that window is kept to one round trip.
	lease, err := s.c.Grant(ctx, int64(MooncakeViewTTL/time.Second))
	if err != nil {
		return 0, opErr(err, "master_view: grant a lease")
	}
	if _, err := s.c.Txn(ctx).If(ours).Then(clientv3.OpDelete(s.mcViewKey)).Commit(); err != nil {
		_, _ = s.c.Revoke(context.WithoutCancel(ctx), lease.ID)
		return 0, opErr(err, "master_view: delete the previous leader's")
	}
	resp, err := s.c.Txn(ctx).
		If(ours, clientv3.Compare(clientv3.CreateRevision(s.mcViewKey), "=", 0)).
		Then(clientv3.OpPut(s.mcViewKey, addr, clientv3.WithLease(lease.ID))).
		Commit()
	if err != nil || !resp.Succeeded {
		_, _ = s.c.Revoke(context.WithoutCancel(ctx), lease.ID)
	}
	if err != nil {
		return 0, opErr(err, "master_view: publish %s for term %d", addr, v.Term)
	}
	if !resp.Succeeded {
		return 0, errcode.New(errcode.EtcdTransactionFail,
			"master_view: moonraft's view no longer names %s of term %d: a newer leader was elected", v.LeaderID, v.Term)
	}
	return lease.ID, nil
}

// KeepMooncakeView keeps lease alive until ctx ends, then revokes it so
// Mooncake clients stop seeing this node at once; it returns early if etcd
// lets the lease lapse.
func (s *Store) KeepMooncakeView(ctx context.Context, lease clientv3.LeaseID) {
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_, _ = s.c.Revoke(rctx, lease)
	}()
	ch, err := s.c.KeepAlive(ctx, lease)
	if err != nil {
		return
	}
	for range ch { // closed when ctx ends or the lease is lost
	}
}

// MooncakeView returns the Mooncake-format view: the address Mooncake's
// clients would use, and whether there is one.
func (s *Store) MooncakeView(ctx context.Context) (string, bool, error) {
	resp, err := s.c.Get(ctx, s.mcViewKey)
	if err != nil {
		return "", false, opErr(err, "master_view: read %s", s.mcViewKey)
	}
	if len(resp.Kvs) == 0 {
		return "", false, nil
	}
	return string(resp.Kvs[0].Value), true, nil
}

// MooncakeMaster is the address a Mooncake HA client connects to: the
// Mooncake-format view, or an error while there is none (no leader yet).
func (s *Store) MooncakeMaster(ctx context.Context) (string, error) {
	addr, ok, err := s.MooncakeView(ctx)
	if err == nil && !ok {
		err = errcode.New(errcode.EtcdKeyNotExist, "master_view: %s holds no leader's address yet", s.mcViewKey)
	}
	return addr, err
}

// DropLegacyView deletes what a release before the Mooncake protocol left
// at master_view: its JSON view, which a Mooncake client would take for an
// address. A Mooncake-format value is left alone.
func (s *Store) DropLegacyView(ctx context.Context) error {
	addr, ok, err := s.MooncakeView(ctx)
	if err != nil || !ok || !strings.HasPrefix(addr, "{") {
		return err
	}
	_, err = s.c.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(s.mcViewKey), "=", addr)).
		Then(clientv3.OpDelete(s.mcViewKey)).
		Commit()
	if err != nil {
		return opErr(err, "master_view: delete the JSON view of an earlier release")
	}
	return nil
}

// RegisterNode records that node id has Raft state of this cluster (at
// its first start), unless recorded already: a later start of that id on
// an empty data dir is then known to be a member that lost its data.
func (s *Store) RegisterNode(ctx context.Context, id string) error {
	if id == "" || strings.Contains(id, "/") {
		return errcode.New(errcode.InvalidParams, "nodes: id %q must be non-empty and contain no '/'", id)
	}
	key := s.nodeKey(id)
	v := fmt.Sprintf(`{"first_start_unix_ms":%d}`, time.Now().UnixMilli())
	_, err := s.c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(clientv3.OpPut(key, v)).Commit()
	if err != nil {
		return opErr(err, "nodes: register %s", id)
	}
	return nil
}

// NodeRegistered tells whether node id was registered (RegisterNode).
func (s *Store) NodeRegistered(ctx context.Context, id string) (bool, error) {
	resp, err := s.c.Get(ctx, s.nodeKey(id), clientv3.WithCountOnly())
	if err != nil {
		return false, opErr(err, "nodes: read %s", id)
	}
	return resp.Count > 0, nil
}

func (s *Store) nodeKey(id string) string {
	return s.cfg.Prefix + "/" + s.cfg.ClusterID + "/nodes/" + id
}
