package mooncakeapi

import (
	"context"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/structpack"
)

// register serves every function of the table.
func (h *Handler) register() {
	b := h.b
	serve(h, "ServiceReady", func(context.Context, Void) Expected[string] { return structpack.OK(StoreVersion) })
	serve(h, "GetStorageConfig", func(context.Context, Void) Expected[GetStorageConfigResponse] {
		return structpack.OK(GetStorageConfigResponse{EnableDiskEviction: true}) // no disk tier: the real master's answer without one
	})
	serve(h, "GetFsdir", func(context.Context, Void) Expected[string] { return structpack.OK("") })
	serve(h, "FetchTasks", func(context.Context, FetchTasksArgs) Expected[[]TaskAssignment] {
		return structpack.OK([]TaskAssignment{}) // moonraft hands out no copy/move tasks
	})
	serve(h, "Ping", func(ctx context.Context, id UUID) Expected[PingResponse] {
		need, err := b.Ping(ctx, id.String())
		if err != nil {
			return fail[PingResponse](err)
		}
		st := ClientOK
		if need {
			st = ClientNeedRemount
		}
		return structpack.OK(PingResponse{ViewVersionID: int64(b.ViewVersion()), ClientStatus: st})
	})
	serve(h, "MountSegment", func(ctx context.Context, a MountArgs) Expected[Void] {
		return done(b.Propose(ctx, &fsm.MountSegment{NowMs: b.Now(), ClientID: a.ClientID.String(), Segment: h.segment(a.Segment)}))
	})
	serve(h, "ReMountSegment", func(ctx context.Context, a ReMountArgs) Expected[Void] {
		segs := make([]fsm.SegmentSpec, len(a.Segments))
		for i, s := range a.Segments {
			segs[i] = h.segment(s)
		}
		return done(b.Propose(ctx, &fsm.RemountSegments{NowMs: b.Now(), ClientID: a.ClientID.String(), Segments: segs}))
	})
	serve(h, "UnmountSegment", func(ctx context.Context, a UnmountArgs) Expected[Void] {
		r := done(b.Propose(ctx, &fsm.UnmountSegment{NowMs: b.Now(), ClientID: a.ClientID.String(), SegmentID: a.SegmentID.String()}))
		if r.Err == structpack.ErrorCode(errcode.SegmentNotFound) {
			// Mooncake's rule (master_service.cpp): unmounting is idempotent, so
			// a client whose session expired before its unmount arrived is
			// told its segment is gone, as it asked.
			return Expected[Void]{}
		}
		return r
	})
	serve(h, "GracefulUnmountSegment", func(ctx context.Context, a GracefulUnmountArgs) Expected[Void] {
		return done(b.Propose(ctx, &fsm.GracefulUnmount{NowMs: b.Now(), ClientID: a.ClientID.String(), SegmentID: a.SegmentID.String(), GraceMs: int64(min(a.GracePeriodMs, 1<<62))}))
	})

	serve(h, "ExistKey", func(ctx context.Context, a KeyArgs) Expected[bool] {
		if err := tenantErr(a.TenantID); err != nil {
			return fail[bool](err)
		}
		ok, _, err := b.ExistKey(ctx, a.Key)
		if err != nil {
			return fail[bool](err)
		}
		return structpack.OK(ok)
	})
	serve(h, "BatchExistKey", func(ctx context.Context, a KeysArgs) []Expected[bool] {
		rs, err := h.batchRead(ctx, a, b.BatchExistKey)
		out := make([]Expected[bool], len(a.Keys))
		for i := range out {
			switch {
			case err != nil:
				out[i] = fail[bool](err)
			case rs[i].Err != nil:
				out[i] = fail[bool](rs[i].Err)
			default:
				out[i] = structpack.OK(rs[i].Found)
			}
		}
		return out
	})
	serve(h, "GetReplicaList", func(ctx context.Context, a KeyArgs) Expected[GetReplicaListResponse] {
		if err := tenantErr(a.TenantID); err != nil {
			return fail[GetReplicaListResponse](err)
		}
		rs, _, err := b.GetReplicaList(ctx, a.Key)
		return h.replicaList(rs, err)
	})
	serve(h, "BatchGetReplicaList", func(ctx context.Context, a KeysArgs) []Expected[GetReplicaListResponse] {
		rs, err := h.batchRead(ctx, a, b.BatchGetReplicaList)
		out := make([]Expected[GetReplicaListResponse], len(a.Keys))
		if err != nil {
			for i := range out {
				out[i] = fail[GetReplicaListResponse](err)
			}
			return out
		}
		n := 0
		for _, r := range rs {
			n += len(r.Replicas)
		}
		slab := make([]ReplicaDescriptor, 0, n)
		for i := range out {
			out[i], slab = h.replicaListIn(slab, rs[i].Replicas, rs[i].Err)
		}
		return out
	})
	serve(h, "GetReplicaListByRegex", func(ctx context.Context, a KeyArgs) Expected[map[string][]ReplicaDescriptor] {
		if err := tenantErr(a.TenantID); err != nil {
			return fail[map[string][]ReplicaDescriptor](err)
		}
		krs, err := b.GetReplicaListByRegex(ctx, a.Key)
		if err != nil {
			return fail[map[string][]ReplicaDescriptor](err)
		}
		out := make(map[string][]ReplicaDescriptor, len(krs))
		for _, kr := range krs {
			if rs, err := replicasOf(kr.Replicas); err == nil {
				out[kr.Key] = rs
			}
		}
		return structpack.OK(out)
	})

	putStarts := func(name string, upsert bool) {
		serve(h, name, func(ctx context.Context, a PutStartArgs) Expected[[]ReplicaDescriptor] {
			if err := tenantErr(a.TenantID); err != nil {
				return fail[[]ReplicaDescriptor](err)
			}
			ps := h.putStart(a)
			var cmd fsm.Command = &ps
			if upsert {
				cmd = &fsm.UpsertStart{PutStart: ps, Copy: true}
			}
			r, err := b.Propose(ctx, cmd)
			if err == nil {
				err = r.Err
			}
			return expectedReplicas(r.Replicas, err)
		})
		serve(h, "Batch"+name, func(ctx context.Context, a BatchPutStartArgs) []Expected[[]ReplicaDescriptor] {
			out := make([]Expected[[]ReplicaDescriptor], len(a.Keys))
			if len(a.SliceLengths) != len(a.Keys) {
				err := errInvalid("%d keys but %d slice lengths", len(a.Keys), len(a.SliceLengths))
				for i := range out {
					out[i] = fail[[]ReplicaDescriptor](err)
				}
				return out
			}
			cmds := make([]fsm.Command, len(a.Keys))
			for i, k := range a.Keys {
				ps := h.putStart(PutStartArgs{ClientID: a.ClientID, Key: k, SliceLength: a.SliceLengths[i], Config: a.Config})
				cmds[i] = &ps
				if upsert {
					cmds[i] = &fsm.UpsertStart{PutStart: ps, Copy: true}
				}
			}
			rs, err := h.batch(ctx, a.TenantID, cmds)
			for i := range out {
				if err != nil {
					out[i] = fail[[]ReplicaDescriptor](err)
					continue
				}
				out[i] = expectedReplicas(rs[i].Replicas, rs[i].Err)
			}
			return out
		})
	}
	putStarts("PutStart", false)
	putStarts("UpsertStart", true)
	for _, name := range []string{"PutEnd", "UpsertEnd"} {
		serve(h, name, func(ctx context.Context, a PutEndArgs) Expected[Void] {
			if err := tenantErr(a.TenantID); err != nil {
				return fail[Void](err)
			}
			return done(b.Propose(ctx, &fsm.PutEnd{NowMs: b.Now(), Key: a.Meta.Key, ClientID: a.ClientID.String()}))
		})
	}
	for _, name := range []string{"PutRevoke", "UpsertRevoke"} {
		serve(h, name, func(ctx context.Context, a PutRevokeArgs) Expected[Void] {
			if err := tenantErr(a.TenantID); err != nil {
				return fail[Void](err)
			}
			return done(b.Propose(ctx, &fsm.PutRevoke{NowMs: b.Now(), Key: a.Key, ClientID: a.ClientID.String()}))
		})
	}
	ends := func(ctx context.Context, client UUID, metas []ObjectMeta, tenant string) []Expected[Void] {
		cmds := make([]fsm.Command, len(metas))
		for i, m := range metas {
			cmds[i] = &fsm.PutEnd{NowMs: b.Now(), Key: m.Key, ClientID: client.String()}
		}
		return h.voids(ctx, tenant, cmds)
	}
	revokes := func(ctx context.Context, client UUID, keys []string, tenant string) []Expected[Void] {
		cmds := make([]fsm.Command, len(keys))
		for i, k := range keys {
			cmds[i] = &fsm.PutRevoke{NowMs: b.Now(), Key: k, ClientID: client.String()}
		}
		return h.voids(ctx, tenant, cmds)
	}
	serve(h, "BatchPutEnd", func(ctx context.Context, a BatchPutEndArgs) []Expected[Void] {
		return ends(ctx, a.ClientID, a.Metas, a.TenantID)
	})
	serve(h, "BatchUpsertEnd", func(ctx context.Context, a BatchUpsertEndArgs) []Expected[Void] {
		return ends(ctx, a.ClientID, a.Metas, a.TenantID)
	})
	serve(h, "BatchPutRevoke", func(ctx context.Context, a BatchPutRevokeArgs) []Expected[Void] {
		return revokes(ctx, a.ClientID, a.Keys, a.TenantID)
	})
	serve(h, "BatchUpsertRevoke", func(ctx context.Context, a BatchUpsertRevokeArgs) []Expected[Void] {
		return revokes(ctx, a.ClientID, a.Keys, a.TenantID)
	})

	serve(h, "Remove", func(ctx context.Context, a RemoveArgs) Expected[Void] {
		if err := tenantErr(a.TenantID); err != nil {
			return fail[Void](err)
		}
		return done(b.Propose(ctx, &fsm.Remove{NowMs: b.Now(), Key: a.Key, Force: a.Force}))
	})
	serve(h, "BatchRemove", func(ctx context.Context, a BatchRemoveArgs) []Expected[Void] {
		cmds := make([]fsm.Command, len(a.Keys))
		for i, k := range a.Keys {
			cmds[i] = &fsm.Remove{NowMs: b.Now(), Key: k, Force: a.Force}
		}
		return h.voids(ctx, a.TenantID, cmds)
	})
	serve(h, "RemoveByRegex", func(ctx context.Context, a RemoveArgs) Expected[int64] {
		if err := tenantErr(a.TenantID); err != nil {
			return fail[int64](err)
		}
		r, err := b.Propose(ctx, &fsm.RemoveByRegex{NowMs: b.Now(), Regex: a.Key, Force: a.Force})
		if err == nil {
			err = r.Err
		}
		if err != nil {
			return fail[int64](err)
		}
		return structpack.OK(int64(r.Removed))
	})
	serve(h, "RemoveAll", func(ctx context.Context, a RemoveAllArgs) int64 {
		if err := tenantErr(a.TenantID); err != nil {
			h.log.Warn("mooncake protocol: RemoveAll removed nothing", "error", err)
			return 0
		}
		r, err := b.Propose(ctx, &fsm.RemoveAll{NowMs: b.Now(), Force: a.Force})
		if err == nil {
			err = r.Err
		}
		if err != nil { // Mooncake's RemoveAll answers a count only
			h.log.Warn("mooncake protocol: RemoveAll removed nothing", "error", err)
			return 0
		}
		return int64(r.Removed)
	})
}
