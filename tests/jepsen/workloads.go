package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
)

const (
	regKeys = 20 // small, so register ops collide

	regSegBytes   = 16 << 20
	setSegBytes   = 16 << 20
	leaseSegBytes = 64 << 20
	leaseSegs     = 2 // per lease client
	// A lease object is leaseSlices × leaseSlice. The lease objects fill the
	// capacity to leasePrefillPct before the faults start; paced puts then
	// push usage over the high watermark, so eviction runs every few
	// seconds for the rest of the run.
	leaseSlices = 4
	leaseSlice  = 1 << 20
	// Reads go to the newest acknowledged keys, removes also to older
	// ones. Puts are paced so the lease objects turn over in about half a
	// minute, far longer than a lease (5 s): most lease objects are then
	// unleased and eviction takes them, never needing the soft-pinned
	// objects of the other workloads.
	leaseHot        = 4
	leaseWarm       = 40
	leasePutGap     = time.Second // per lease client
	leaseRemoveGap  = 3 * time.Second
	leasePrefillPct = 90 // of the capacity, filled with lease objects before the faults start
)

// workloadConfig says how many clients each workload runs.
type workloadConfig struct {
	registerClients, setClients, leaseClients int
	opTimeout                                 time.Duration
	// setKeep > 0 bounds each set client's acknowledged keys: past it the
	// client removes instead of putting, so the state stops growing (the
	// soak, which judges the nodes' memory).
	setKeep int
	// registerGap > 0 paces each register client: the soak's length would
	// otherwise give porcupine millions of ops (4 million in 30 minutes
	// took more memory than the machine has to check).
	registerGap time.Duration
}

// workers runs every client of every workload.
type workers struct {
	cfg  workloadConfig
	rec  *recorder
	eps  []string
	seed uint64

	regNext [regKeys]atomic.Uint64 // next value written per register key: distinct, so reads identify writes

	leaseMu    sync.Mutex
	leaseAcked []string // acknowledged lease keys, oldest first

	clients []*client
	wg      sync.WaitGroup
}

// client is one workload client: its own connection, client id (session)
// and segments, kept alive by a moonclient.Keeper.
type client struct {
	w        *workers
	idx      int // index in the history (porcupine's ClientId)
	workload string
	id       string
	segs     []fsm.SegmentSpec
	cl       *moonclient.Client
	keeper   *moonclient.Keeper
	rng      *rand.Rand
	// readers are clients that first try node i: a correct follower
	// answers NOT_LEADER and the reader moves on to the leader, but a node
	// that wrongly answers reads itself keeps the reader (and its stale
	// answers) there, where the checkers see them.
	readers []*moonclient.Client

	setN         int       // set: keys put so far
	setAcked     []string  // set: acknowledged and not yet removed
	leaseN       int       // lease: keys put so far
	leaseLastOK  *Op       // lease: this client's last read that granted a lease
	leaseNextPut time.Time // lease: puts are paced
	// lease: removes of older keys are paced
	leaseNextRemove time.Time
}

func newWorkers(cfg workloadConfig, rec *recorder, eps []string, seed uint64) *workers {
	return &workers{cfg: cfg, rec: rec, eps: eps, seed: seed}
}

// setup creates every client, mounts its segments and starts its keeper.
func (w *workers) setup(ctx context.Context) error {
	add := func(workload string, n, segs int, segBytes uint64) error {
		for k := 0; k < n; k++ {
			idx := len(w.clients)
			c := &client{w: w, idx: idx, workload: workload, id: fmt.Sprintf("%s-%d", workload, k),
				rng: rand.New(rand.NewPCG(w.seed, uint64(idx)+1))}
			for s := 0; s < segs; s++ {
				c.segs = append(c.segs, fsm.SegmentSpec{ID: fmt.Sprintf("seg-%s-%d", c.id, s), Name: fmt.Sprintf("host-%s-%d", c.id, s),
					Base: uint64(s+1) << 40, Size: segBytes})
			}
			var err error
			if c.cl, err = moonclient.Dial(moonclient.Config{Endpoints: w.eps, MaxBackoff: 500 * time.Millisecond, ConnectTimeout: time.Second}); err != nil {
				return err
			}
			w.clients = append(w.clients, c)
			for i := range w.eps {
				rotated := append(append([]string{}, w.eps[i:]...), w.eps[:i]...)
				r, err := moonclient.Dial(moonclient.Config{Endpoints: rotated, MaxBackoff: 500 * time.Millisecond, ConnectTimeout: time.Second})
				if err != nil {
					return err
				}
				c.readers = append(c.readers, r)
			}
			for _, s := range c.segs {
				if err := retry(ctx, func(ctx context.Context) error { return c.cl.MountSegment(ctx, c.id, s) }); err != nil {
					return fmt.Errorf("mount %s for %s: %w", s.ID, c.id, err)
				}
			}
		}
		return nil
	}
	if err := add(WRegister, w.cfg.registerClients, 1, regSegBytes); err != nil {
		return err
	}
	if err := add(WSet, w.cfg.setClients, 1, setSegBytes); err != nil {
		return err
	}
	if err := add(WLease, w.cfg.leaseClients, leaseSegs, leaseSegBytes); err != nil {
		return err
	}
	for _, c := range w.clients {
		// The keepers outlive the workload: sessions must not expire
		// before the end-of-run checks.
		c.keeper = c.cl.KeepAlive(context.Background(), c.id, c.segs, 0)
	}
	// Fill the cluster close to its high watermark now, so eviction starts
	// soon after the faults do.
	var capacity uint64
	var leasers []*client
	for _, c := range w.clients {
		for _, s := range c.segs {
			capacity += s.Size
		}
		if c.workload == WLease {
			leasers = append(leasers, c)
		}
	}
	n := int(capacity * leasePrefillPct / 100 / (leaseSlices * leaseSlice))
	for i := 0; i < n && len(leasers) > 0 && ctx.Err() == nil; i++ {
		leasers[i%len(leasers)].leasePut()
	}
	return ctx.Err()
}

// retry calls fn with a short deadline until it succeeds or ctx is done.
func retry(ctx context.Context, fn func(context.Context) error) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := fn(cctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// run starts every client's loop; they stop starting ops when ctx is done.
func (w *workers) run(ctx context.Context) {
	for _, c := range w.clients {
		w.wg.Go(func() {
			for ctx.Err() == nil {
				switch c.workload {
				case WRegister:
					c.registerOp()
					if w.cfg.registerGap > 0 {
						_ = sleepCtx(ctx, w.cfg.registerGap)
					}
				case WSet:
					c.setOp()
					_ = sleepCtx(ctx, 20*time.Millisecond)
				case WLease:
					c.leaseOp()
					_ = sleepCtx(ctx, 10*time.Millisecond)
				}
			}
		})
	}
}

// wait waits for the ops in flight to end.
func (w *workers) wait() { w.wg.Wait() }

// close stops the keepers and closes the connections.
func (w *workers) close() {
	for _, c := range w.clients {
		if c.keeper != nil {
			c.keeper.Stop()
		}
		_ = c.cl.Close()
		for _, r := range c.readers {
			_ = r.Close()
		}
	}
}

func (c *client) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.w.cfg.opTimeout)
}

// unknown reports whether err leaves open whether a write was applied:
// OUTCOME_UNKNOWN (the request may have reached a leader that was lost, or
// its deadline passed in flight) or an error without a Mooncake code. Every
// other code is an answer: the state machine's verdict, or a refusal
// (NOT_LEADER, UNAVAILABLE_IN_CURRENT_STATUS, ETCD_OPERATION_ERROR) before
// anything was proposed.
func unknown(err error) bool {
	c := errcode.Of(err)
	return c == errcode.OutcomeUnknown || c == errcode.InternalError
}

// absent reports whether err says a key has no complete object: a read of
// it (or a remove) finds nothing visible.
func absent(err error) bool {
	c := errcode.Of(err)
	return c == errcode.ObjectNotFound || c == errcode.ReplicaIsNotReady
}

// put is PutStart + PutEnd of one object of size sum(slices), as one op.
//
//   - PutStart fails: the op failed. If the failure leaves open whether the
//     PutStart applied, PutEnd is still never sent, so the object can never
//     become visible; a PutRevoke frees the key.
//   - PutEnd fails: if a PutRevoke then succeeds the object was still
//     PROCESSING, so the PutEnd never applied: failed. Otherwise the put may
//     or may not have completed: unknown.
func (c *client) put(workload, kind, key string, slices []uint64, rc moonclient.ReplicateConfig) *Op {
	var size uint64
	for _, s := range slices {
		size += s
	}
	rec := c.w.rec
	op := rec.invoke(workload, c.idx, kind, key, size, false)
	ctx, cancel := c.ctx()
	_, err := c.cl.PutStart(ctx, key, slices, rc, c.id)
	cancel()
	if err != nil {
		steps := "put_start=" + codeName(err)
		if unknown(err) {
			steps += " revoke=" + codeName(c.revoke(key))
		}
		rec.complete(op, outcome{status: StatusFail, err: err, steps: steps})
		return op
	}
	ctx, cancel = c.ctx()
	err = c.cl.PutEnd(ctx, key, c.id)
	cancel()
	if err == nil {
		rec.complete(op, outcome{status: StatusOK, steps: "put_start=OK put_end=OK"})
		return op
	}
	rerr := c.revoke(key)
	steps := "put_start=OK put_end=" + codeName(err) + " revoke=" + codeName(rerr)
	if rerr == nil {
		rec.complete(op, outcome{status: StatusFail, err: err, steps: steps})
	} else {
		rec.complete(op, outcome{status: StatusUnknown, err: err, steps: steps})
	}
	return op
}

// upsert is UpsertStart + UpsertEnd, as one op; unlike put it never
// revokes, so an upsert that started but did not end leaves the key being
// written (unreadable) until another upsert takes it over or it is
// reclaimed. The steps say whether the start was answered OK, which the
// register checker needs: a started upsert has ended the old value.
func (c *client) upsert(workload, kind, key string, size uint64, rc moonclient.ReplicateConfig) *Op {
	rec := c.w.rec
	op := rec.invoke(workload, c.idx, kind, key, size, false)
	ctx, cancel := c.ctx()
	_, err := c.cl.UpsertStart(ctx, key, []uint64{size}, rc, c.id)
	cancel()
	switch {
	case err != nil && unknown(err):
		rec.complete(op, outcome{status: StatusUnknown, err: err, steps: "upsert_start=" + codeName(err)})
		return op
	case err != nil:
		rec.complete(op, outcome{status: StatusFail, err: err, steps: "upsert_start=" + codeName(err)})
		return op
	}
	ctx, cancel = c.ctx()
	err = c.cl.UpsertEnd(ctx, key, c.id)
	cancel()
	steps := "upsert_start=OK upsert_end=" + codeName(err)
	if err == nil {
		rec.complete(op, outcome{status: StatusOK, steps: steps})
	} else {
		rec.complete(op, outcome{status: StatusUnknown, err: err, steps: steps})
	}
	return op
}

func (c *client) revoke(key string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.cl.PutRevoke(ctx, key, c.id)
}

// get is GetReplicaList: ok with the size and lease when found, ok with
// value 0 when the key has no complete object, fail otherwise.
func (c *client) get(workload, kind, key string) *Op {
	rec := c.w.rec
	op := rec.invoke(workload, c.idx, kind, key, 0, false)
	ctx, cancel := c.ctx()
	descs, lease, err := c.readers[c.rng.IntN(len(c.readers))].GetReplicaList(ctx, key)
	cancel()
	switch {
	case err == nil:
		rec.complete(op, outcome{status: StatusOK, value: objectSize(descs), lease: lease})
	case absent(err):
		rec.complete(op, outcome{status: StatusOK, err: err})
	default:
		rec.complete(op, outcome{status: StatusFail, err: err})
	}
	return op
}

// objectSize is the size of the first replica: every replica holds the
// whole object.
func objectSize(descs []oplog.ReplicaDesc) uint64 {
	if len(descs) == 0 {
		return 0
	}
	var n uint64
	for _, b := range descs[0].Buffers {
		n += b.Size
	}
	return n
}

// remove is Remove: ok; info when the answer says nothing was removed
// because there was nothing visible (or, unforced, it was leased); unknown
// or fail otherwise.
func (c *client) remove(workload, key string, force bool) *Op {
	rec := c.w.rec
	op := rec.invoke(workload, c.idx, "remove", key, 0, force)
	ctx, cancel := c.ctx()
	err := c.cl.Remove(ctx, key, force)
	cancel()
	switch {
	case err == nil:
		rec.complete(op, outcome{status: StatusOK})
	case absent(err) || errcode.Of(err) == errcode.ObjectHasLease:
		rec.complete(op, outcome{status: StatusInfo, err: err})
	case unknown(err):
		rec.complete(op, outcome{status: StatusUnknown, err: err})
	default:
		rec.complete(op, outcome{status: StatusFail, err: err})
	}
	return op
}

func regKey(i int) string { return fmt.Sprintf("reg/k%02d", i) }

// registerOp: a write (put), upsert, read or forced remove of one of
// regKeys keys. Every write and upsert of a key uses a size never used
// before for it, so a read names the write it saw.
func (c *client) registerOp() {
	k := c.rng.IntN(regKeys)
	key := regKey(k)
	rc := moonclient.ReplicateConfig{ReplicaNum: 1, SoftPin: true, PreferredSegment: c.segs[0].Name}
	switch r := c.rng.IntN(10); {
	case r < 3:
		c.put(WRegister, "write", key, []uint64{c.w.regNext[k].Add(1)}, rc)
	case r < 4:
		c.upsert(WRegister, "upsert", key, c.w.regNext[k].Add(1), rc)
	case r < 8:
		c.get(WRegister, "read", key)
	default:
		c.remove(WRegister, key, true)
	}
}

// setOp: puts of fresh keys; one op in ten (every op past setKeep keys)
// force-removes one of this client's acknowledged keys (the checker knows
// which from the history).
func (c *client) setOp() {
	full := c.w.cfg.setKeep > 0 && len(c.setAcked) >= c.w.cfg.setKeep
	if len(c.setAcked) > 0 && (full || c.rng.IntN(10) == 0) {
		i := c.rng.IntN(len(c.setAcked))
		key := c.setAcked[i]
		c.setAcked = append(c.setAcked[:i], c.setAcked[i+1:]...)
		c.remove(WSet, key, true)
		return
	}
	c.setN++
	key := fmt.Sprintf("set/%s/%06d", c.id, c.setN)
	// Small objects (their number grows all run long), of a size the
	// final read can check.
	op := c.put(WSet, "put", key, []uint64{uint64(128 + c.setN%128)},
		moonclient.ReplicateConfig{ReplicaNum: 2, SoftPin: true, PreferredSegment: c.segs[0].Name})
	if op.Status == StatusOK {
		c.setAcked = append(c.setAcked, key)
	}
}

// leaseOp: puts of big fresh objects (no soft pin, so they are what
// eviction takes), reads of the newest ones (which take leases), and
// unforced removes — half of them of the key this client read last, while
// its lease should hold.
func (c *client) leaseOp() {
	w := c.w
	w.leaseMu.Lock()
	acked := w.leaseAcked
	w.leaseMu.Unlock()
	r := c.rng.IntN(20)
	switch {
	case len(acked) == 0 || r < 6 && time.Now().After(c.leaseNextPut):
		c.leaseNextPut = time.Now().Add(leasePutGap)
		c.leasePut()
	case r < 13:
		// Mostly the newest keys; a quarter of the reads go to any key, so
		// the keys eviction takes have often been leased before.
		key := acked[len(acked)-1-c.rng.IntN(min(leaseHot, len(acked)))]
		if c.rng.IntN(4) == 0 {
			key = acked[c.rng.IntN(len(acked))]
		}
		op := c.get(WLease, "get", key)
		if op.Status == StatusOK && op.LeaseUntilMs > 0 {
			c.leaseLastOK = op
		}
	default:
		// Mostly the key just read, whose lease must refuse the remove;
		// now and then an older key, which a remove may take (paced, so
		// removes do not empty the cluster faster than puts fill it).
		if time.Now().After(c.leaseNextRemove) {
			c.leaseNextRemove = time.Now().Add(leaseRemoveGap)
			key := acked[len(acked)-1-c.rng.IntN(min(leaseWarm, len(acked)))]
			c.remove(WLease, key, false)
			return
		}
		if read := c.leaseLastOK; read != nil {
			c.leaseLastOK = nil
			// A remove left without an answer (no leader, a timeout) is
			// tried again while the lease lasts: across a failover, the
			// next leader must refuse it too.
			op := c.remove(WLease, read.Key, false)
			if (op.Status == StatusUnknown || op.Status == StatusFail) && time.Now().UnixMilli() < read.LeaseUntilMs {
				c.leaseLastOK = read
			}
		}
	}
}

// leasePut puts a fresh lease object: no soft pin, so it is what eviction
// takes first.
func (c *client) leasePut() {
	c.leaseN++
	key := fmt.Sprintf("lease/%s/%06d", c.id, c.leaseN)
	slices := make([]uint64, leaseSlices)
	for i := range slices {
		slices[i] = leaseSlice
	}
	op := c.put(WLease, "put", key, slices,
		moonclient.ReplicateConfig{ReplicaNum: 1, PreferredSegment: c.segs[c.leaseN%len(c.segs)].Name})
	if op.Status == StatusOK {
		c.w.leaseMu.Lock()
		c.w.leaseAcked = append(c.w.leaseAcked, key)
		c.w.leaseMu.Unlock()
	}
}
