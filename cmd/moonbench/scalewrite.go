package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/mckeeper"
	mc "github.com/moonraft/moonraft/mooncakeapi"
)

// scaleWriter puts and removes the harness's objects as one of its clients:
// with Mooncake's pings, over the Mooncake protocol on a connection of its
// own, as master_bench's BatchPut does; with gRPC's, through moonbench's
// client.
type scaleWriter struct {
	s     *scaleRun
	owner *scaleClient
	mc    *mckeeper.Client // nil: gRPC
}

// scaleCallTimeout bounds a writer's call: a write may wait for the
// export's flow control.
const scaleCallTimeout = 30 * time.Second

func (s *scaleRun) newWriter(owner *scaleClient) *scaleWriter {
	w := &scaleWriter{s: s, owner: owner}
	if s.cfg.scalePings == scalePingsMooncake {
		w.mc = mckeeper.NewClient(s.views.MooncakeMaster)
	}
	return w
}

// close closes the writer's connection, if it has one of its own.
func (w *scaleWriter) close() {
	if w.mc != nil {
		w.mc.Close()
	}
}

// failed is told of a call that failed as a whole: a Mooncake writer looks
// the master up again, as its client would.
func (w *scaleWriter) failed(ctx context.Context) {
	if w.mc != nil {
		_ = w.mc.SwitchMaster(ctx)
	}
}

// put starts and ends one 4 KiB object, one replica, at each key,
// answering how many were written, or the error of a call that failed as a
// whole.
func (w *scaleWriter) put(ctx context.Context, keys []string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, scaleCallTimeout)
	defer cancel()
	if w.mc == nil {
		return w.putGRPC(ctx, keys)
	}
	sizes := make([]uint64, len(keys))
	for i := range sizes {
		sizes[i] = scaleObject
	}
	rs, err := mckeeper.Call[[]mc.Expected[[]mc.ReplicaDescriptor]](ctx, w.mc, "BatchPutStart",
		mc.BatchPutStartArgs{ClientID: w.owner.uuid, Keys: keys, SliceLengths: sizes, Config: mc.ReplicateConfig{ReplicaNum: 1}})
	if err != nil {
		return 0, err
	}
	if len(rs) != len(keys) {
		return 0, fmt.Errorf("BatchPutStart of %d keys answered %d results", len(keys), len(rs))
	}
	metas := make([]mc.ObjectMeta, 0, len(keys))
	for i, r := range rs {
		if r.Err == 0 {
			metas = append(metas, mc.ObjectMeta{Key: keys[i]})
		}
	}
	if len(metas) == 0 {
		return 0, nil
	}
	ends, err := mckeeper.Call[[]mc.Expected[mc.Void]](ctx, w.mc, "BatchPutEnd", mc.BatchPutEndArgs{ClientID: w.owner.uuid, Metas: metas})
	if err != nil {
		return 0, err
	}
	ok := 0
	for _, e := range ends {
		if e.Err == 0 {
			ok++
		}
	}
	return ok, nil
}

func (w *scaleWriter) putGRPC(ctx context.Context, keys []string) (int, error) {
	items := make([]client.PutStartItem, len(keys))
	for i, k := range keys {
		items[i] = client.PutStartItem{Key: k, SliceLengths: []uint64{scaleObject}, Config: client.ReplicateConfig{ReplicaNum: 1}, ClientID: w.owner.id}
	}
	rs, err := w.s.lc.cl.BatchPutStart(ctx, items)
	if err != nil {
		return 0, err
	}
	started := make([]string, 0, len(keys))
	for i, r := range rs {
		if r.Err == nil {
			started = append(started, keys[i])
		}
	}
	if len(started) == 0 {
		return 0, nil
	}
	errs, err := w.s.lc.cl.BatchPutEnd(ctx, w.owner.id, started)
	if err != nil {
		return 0, err
	}
	ok := 0
	for _, e := range errs {
		if e == nil {
			ok++
		}
	}
	return ok, nil
}

// remove removes keys, forcing past leases.
func (w *scaleWriter) remove(ctx context.Context, keys []string) error {
	ctx, cancel := context.WithTimeout(ctx, scaleCallTimeout)
	defer cancel()
	if w.mc == nil {
		_, err := w.s.lc.cl.BatchRemove(ctx, keys, true)
		return err
	}
	rs, err := mckeeper.Call[[]mc.Expected[mc.Void]](ctx, w.mc, "BatchRemove", mc.BatchRemoveArgs{Keys: keys, Force: true})
	if err != nil {
		return err
	}
	if len(rs) != len(keys) {
		return fmt.Errorf("BatchRemove of %d keys answered %d results", len(keys), len(rs))
	}
	var errs []error
	for i, r := range rs {
		if r.Err != 0 && errcode.Code(r.Err) != errcode.ObjectNotFound {
			errs = append(errs, errcode.New(errcode.Code(r.Err), "BatchRemove of %q", keys[i]))
		}
	}
	return errors.Join(errs...)
}
