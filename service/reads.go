package service

import (
	"context"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
)

// SegmentStatusOf answers Data.SegmentStatus from f.
func SegmentStatusOf(f *fsm.FSM, ref string, byName bool) ([]fsm.SegmentStatus, error) {
	if ref == "" {
		return f.SegmentStatuses(), nil
	}
	st, err := f.SegmentStatus(ref, byName)
	if err != nil {
		return nil, err
	}
	return []fsm.SegmentStatus{st}, nil
}

// BatchGetByKey answers a batch read one key at a time with get, for a
// backend without a batched path. An answer that says the backend cannot
// serve at all (a retryable code) is the whole batch's.
func BatchGetByKey(ctx context.Context, keys []string, get func(context.Context, string) ([]oplog.ReplicaDesc, fsm.Grant, error)) ([]fsm.KeyRead, error) {
	out := make([]fsm.KeyRead, len(keys))
	for i, k := range keys {
		descs, g, err := get(ctx, k)
		if err != nil && errcode.Of(err).Retryable() {
			return nil, err
		}
		out[i] = fsm.KeyRead{Replicas: descs, Found: err == nil, Grant: g, Err: err}
	}
	return out, nil
}

// BatchExistByKey is BatchGetByKey for existence checks.
func BatchExistByKey(ctx context.Context, keys []string, exist func(context.Context, string) (bool, fsm.Grant, error)) ([]fsm.KeyRead, error) {
	out := make([]fsm.KeyRead, len(keys))
	for i, k := range keys {
		ok, g, err := exist(ctx, k)
		if err != nil && errcode.Of(err).Retryable() {
			return nil, err
		}
		out[i] = fsm.KeyRead{Found: ok, Grant: g, Err: err}
	}
	return out, nil
}
