package oplog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/moonraft/moonraft/errcode"
)

// Follower defaults.
const (
	DefaultGapTimeout   = 2 * time.Second
	DefaultBatchLimit   = 1000
	DefaultMaxBuffered  = 100_000
	DefaultKeySeqRetain = time.Hour
)

// Feed reads that fail (etcd unreachable) are retried with this backoff;
// they are not the follower's to give up on.
const (
	retryMin = 50 * time.Millisecond
	retryMax = 5 * time.Second
)

// FollowerConfig configures a Follower. Zero values take the defaults.
type FollowerConfig struct {
	Feed Feed
	// GapTimeout is how long an out-of-order entry waits for the missing
	// ones before the gap is re-read from the Feed.
	GapTimeout time.Duration
	// BatchLimit is the ReadSince page size.
	BatchLimit int
	// MaxBuffered bounds the reorder buffer, and the renewals kept for keys
	// whose entry has not come yet. An entry arriving when the buffer is
	// full is not kept (it is still in the Feed) and the gap is re-read at
	// once.
	MaxBuffered int
	// KeySeqRetain is how long, in entry timestamps, a removed key's
	// key_sequence_id is remembered: the leader's KeySeqRetainMs. Shorter is
	// safe (a weaker check); longer would reject a key the leader forgot and
	// restarted at 1.
	KeySeqRetain time.Duration
	Logger       hclog.Logger // nil discards
	// Now is the clock, in ms, that renewals are compared with: a renewal
	// whose deadlines have both passed grants nothing and is dropped.
	Now func() int64
}

// ObjectState is a complete object as the follower knows it.
type ObjectState struct {
	Size    uint64
	KeySeq  uint64        // key_sequence_id of the PUT_END
	Payload PutEndPayload // shared with the follower: do not modify
	// Deadlines from lease_renewals/, 0 until a renewal is seen.
	LeaseTimeoutMs, SoftPinTimeoutMs int64
}

// FollowerStats describes a follower's progress.
type FollowerStats struct {
	AppliedSeq   uint64
	Objects      int
	Duplicates   uint64 // entries dropped because seq <= applied (or already buffered)
	Reordered    uint64 // entries that arrived early and were buffered
	Buffered     int    // entries in the reorder buffer now
	WaitingFor   uint64 // the seq the buffer waits for; 0 when nothing is buffered
	GapRereads   uint64 // gaps re-read from the Feed
	Overflowed   uint64 // early entries not buffered because the buffer was full
	Resyncs      uint64 // watches restarted (compaction, broken stream)
	EntryResyncs uint64 // bad entries replaced by a good value re-read from the Feed
	Renewals     uint64 // lease renewals applied
	LastError    string // the last problem seen, fatal or not
}

// Follower is a read-only replica of the object set that follows the OpLog
// in etcd alone (seed 004's OpLogWatcher and OpLogApplier): for observers
// outside the Raft group, and the baseline Raft replication is measured
// against. Run is its only writer; the read methods are safe concurrently
// with it.
type Follower struct {
	cfg FollowerConfig
	log hclog.Logger

	mu        sync.RWMutex
	applied   uint64
	objects   map[string]ObjectState
	stats     FollowerStats // counters; Stats fills in the rest
	advanced  chan struct{} // closed and replaced when applied has grown
	published uint64        // applied when advanced was last closed
	started   bool
	done      chan struct{} // closed when Run returns
	runErr    error

	// Owned by Run's goroutine.
	pending    map[uint64]Record  // early entries by seq
	early      map[string]Renewal // renewals of keys whose PUT_END has not come yet
	tombs      map[string]tombstone
	tombQueue  []queuedTomb // in removal order, for expiry
	overflowAt uint64       // applied+1 when an overflow last forced a re-read
	rereadNow  bool
}

// tombstone is a removed key's last key_sequence_id and the timestamp of
// the entry that removed it.
type tombstone struct {
	keySeq uint64
	atMs   int64
}

type queuedTomb struct {
	key string
	tombstone
}

// NewFollower returns a follower at seq 0 with no objects.
func NewFollower(cfg FollowerConfig) *Follower {
	if cfg.GapTimeout <= 0 {
		cfg.GapTimeout = DefaultGapTimeout
	}
	if cfg.BatchLimit <= 0 {
		cfg.BatchLimit = DefaultBatchLimit
	}
	if cfg.MaxBuffered <= 0 {
		cfg.MaxBuffered = DefaultMaxBuffered
	}
	if cfg.KeySeqRetain <= 0 {
		cfg.KeySeqRetain = DefaultKeySeqRetain
	}
	if cfg.Now == nil {
		cfg.Now = func() int64 { return time.Now().UnixMilli() }
	}
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Follower{
		cfg:      cfg,
		log:      log,
		objects:  map[string]ObjectState{},
		advanced: make(chan struct{}),
		done:     make(chan struct{}),
		pending:  map[uint64]Record{},
		early:    map[string]Renewal{},
		tombs:    map[string]tombstone{},
	}
}

// Seed sets the state the follower starts from: the complete objects known
// at appliedSeq (from a snapshot). It must be called before Run.
func (f *Follower) Seed(appliedSeq uint64, objects map[string]ObjectState) error {
	m := make(map[string]ObjectState, len(objects))
	for k, o := range objects {
		switch {
		case k == "":
			return errcode.New(errcode.InvalidParams, "follower seed: empty key")
		case o.KeySeq == 0:
			return errcode.New(errcode.InvalidParams, "follower seed: key %q has key_sequence_id 0", k)
		case o.Size != o.Payload.Size:
			return errcode.New(errcode.InvalidParams, "follower seed: key %q has size %d but its payload says %d", k, o.Size, o.Payload.Size)
		}
		m[k] = o
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started {
		return errcode.New(errcode.UnavailableInCurrentStatus, "follower seed: the follower is already running")
	}
	f.applied, f.objects = appliedSeq, m
	f.publishLocked()
	return nil
}

// AppliedSeq is the seq of the last entry applied.
func (f *Follower) AppliedSeq() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied
}

// Get returns the object at key. It grants no lease: the follower is read
// only and renews nothing.
func (f *Follower) Get(key string) (ObjectState, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	o, ok := f.objects[key]
	return o, ok
}

// Len is the number of objects.
func (f *Follower) Len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.objects)
}

// ObjectSetDigest is the ObjectSetHasher digest of the objects, equal to the
// leader's FSM.ObjectSetDigest at the same applied seq.
func (f *Follower) ObjectSetDigest() [32]byte {
	type item struct {
		key          string
		size, keySeq uint64
	}
	f.mu.RLock()
	items := make([]item, 0, len(f.objects))
	for k, o := range f.objects {
		items = append(items, item{k, o.Size, o.KeySeq})
	}
	f.mu.RUnlock()
	// Sorted outside the lock, so Run is not held up.
	slices.SortFunc(items, func(a, b item) int { return cmp.Compare(a.key, b.key) })
	h := NewObjectSetHasher()
	for _, it := range items {
		h.Add(it.key, it.size, it.keySeq)
	}
	return h.Sum()
}

// Stats returns the follower's counters.
func (f *Follower) Stats() FollowerStats {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := f.stats
	s.AppliedSeq = f.applied
	s.Objects = len(f.objects)
	if s.Buffered > 0 {
		s.WaitingFor = f.applied + 1
	}
	return s
}

// WaitFor blocks until AppliedSeq >= seq, ctx ends, or Run has returned
// short of seq.
func (f *Follower) WaitFor(ctx context.Context, seq uint64) error {
	for {
		f.mu.RLock()
		applied, advanced := f.applied, f.advanced
		f.mu.RUnlock()
		if applied >= seq {
			return nil
		}
		select {
		case <-advanced:
		case <-f.done:
			f.mu.RLock()
			applied, runErr := f.applied, f.runErr
			f.mu.RUnlock()
			if applied >= seq {
				return nil
			}
			return errcode.New(errcode.UnavailableInCurrentStatus,
				"follower stopped at seq %d, short of %d (%v)", applied, seq, runErr)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run follows the Feed: it reads the OpLog from AppliedSeq in pages, then
// the lease renewals, then watches from the revision of the last page, and
// applies entries strictly in seq order. A broken watch is resynced the
// same way. Run returns nil when ctx ends, or an error for a bad entry (one
// that does not decode, fails its checksum, or breaks its key's sequence)
// after one attempt to re-read it from the Feed. A Follower runs once.
func (f *Follower) Run(ctx context.Context) (err error) {
	f.mu.Lock()
	started := f.started
	f.started = true
	f.mu.Unlock()
	if started {
		return errcode.New(errcode.UnavailableInCurrentStatus, "follower: Run was already called")
	}
	defer func() {
		if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			err = nil
		}
		f.mu.Lock()
		f.runErr = err
		if err != nil {
			f.stats.LastError = err.Error()
		}
		f.mu.Unlock()
		close(f.done)
	}()
	if f.cfg.Feed == nil {
		return errcode.New(errcode.InvalidParams, "follower: no Feed configured")
	}
	f.log.Info("following the oplog", "from_seq", f.AppliedSeq())
	var fails int // watches in a row that failed before delivering anything
	for {
		rev, err := f.catchUp(ctx)
		if err != nil {
			return err
		}
		delivered, err := f.follow(ctx, rev)
		var wf watchFailure
		if !errors.As(err, &wf) {
			return err
		}
		f.mu.Lock()
		f.stats.Resyncs++
		f.stats.LastError = wf.Error()
		f.mu.Unlock()
		f.log.Warn("watch failed; re-reading and watching again", "applied_seq", f.applied, "error", wf.err)
		if delivered {
			fails = 0
			continue
		}
		// A watch that fails at once, again and again, must not spin.
		if fails++; fails > 1 {
			if err := sleep(ctx, backoff(fails-1)); err != nil {
				return err
			}
		}
	}
}

// watchFailure is why a watch ended other than by ctx: Run resyncs.
type watchFailure struct{ err error }

func (w watchFailure) Error() string { return fmt.Sprintf("follower: watch failed: %v", w.err) }

// catchUp reads the OpLog from applied and then the renewals, and returns
// the revision to watch from.
func (f *Follower) catchUp(ctx context.Context) (int64, error) {
	rev, err := f.readFrom(ctx)
	if err != nil {
		return 0, err
	}
	var rs []Renewal
	err = f.retry(ctx, "read lease renewals", func() (err error) {
		rs, _, err = f.cfg.Feed.ReadRenewals(ctx)
		return err
	})
	if err != nil {
		return 0, err
	}
	// The watch starts at the last page's revision, not the renewals'
	// (later) one: an entry put in between would otherwise wait for a gap
	// re-read. Renewals in between come again, and applying one is
	// idempotent.
	f.renew(rs)
	return rev, nil
}

// readFrom reads pages from applied and offers them, while pages come back
// full and applied keeps up with them; past a gap the Feed cannot fill, one
// page is enough (the rest would only be buffered). It returns the
// revision of the last page.
func (f *Follower) readFrom(ctx context.Context) (int64, error) {
	after := f.applied
	for {
		var recs []Record
		var rev int64
		err := f.retry(ctx, "read the oplog", func() (err error) {
			recs, rev, err = f.cfg.Feed.ReadSince(ctx, after, f.cfg.BatchLimit)
			return err
		})
		if err != nil {
			return 0, err
		}
		for _, r := range recs {
			if err := f.offer(ctx, r); err != nil {
				return 0, err
			}
		}
		f.publish()
		// f.applied == after guards against a Feed returning old records.
		if len(recs) < f.cfg.BatchLimit || f.applied < recs[len(recs)-1].Seq || f.applied == after {
			return rev, nil
		}
		after = f.applied
	}
}

// follow consumes the watch from rev until ctx ends, the watch fails
// (watchFailure) or an entry is bad. delivered says whether the watch
// delivered any event.
func (f *Follower) follow(ctx context.Context, rev int64) (delivered bool, err error) {
	wctx, cancel := context.WithCancel(ctx)
	ch := f.cfg.Feed.Watch(wctx, rev)
	defer func() {
		cancel()
		for range ch { // the Feed closes it once wctx ends; nothing of it outlives Run
		}
	}()
	// The gap timer runs while entries are buffered, restarting whenever
	// applied moves: GapTimeout is how long no progress is tolerated.
	gap := time.NewTimer(f.cfg.GapTimeout)
	gap.Stop() // armed below, only while entries are buffered
	defer gap.Stop()
	armed, armedAt := false, uint64(0)
	for {
		if f.rereadNow {
			if err := f.rereadGap(ctx, "reorder buffer full"); err != nil {
				return delivered, err
			}
		}
		switch {
		case len(f.pending) == 0:
			if armed {
				gap.Stop()
				armed = false
			}
		case !armed || armedAt != f.applied:
			gap.Reset(f.cfg.GapTimeout)
			armed, armedAt = true, f.applied
		}
		select {
		case <-ctx.Done():
			return delivered, ctx.Err()
		case ev, ok := <-ch:
			if ctx.Err() != nil {
				// The Feed ends the watch, maybe with an error, when ctx ends.
				return delivered, ctx.Err()
			}
			if !ok {
				return delivered, watchFailure{errors.New("the watch ended")}
			}
			for _, r := range ev.Records {
				if err := f.offer(ctx, r); err != nil {
					return delivered, err
				}
			}
			f.renew(ev.Renewals)
			f.publish()
			if ev.Err != nil {
				return delivered, watchFailure{ev.Err}
			}
			delivered = true
		case <-gap.C:
			armed = false
			if err := f.rereadGap(ctx, "gap timeout"); err != nil {
				return delivered, err
			}
		}
	}
}

// rereadGap reads the OpLog from applied to fill the gap before the
// buffered entries.
func (f *Follower) rereadGap(ctx context.Context, why string) error {
	f.rereadNow = false
	missing := f.applied + 1
	f.mu.Lock()
	f.stats.GapRereads++
	f.mu.Unlock()
	f.log.Debug("re-reading a gap", "reason", why, "missing_seq", missing, "buffered", len(f.pending))
	if _, err := f.readFrom(ctx); err != nil {
		return err
	}
	if len(f.pending) > 0 {
		err := errcode.New(errcode.OplogEntryNotFound,
			"follower: entry %d is missing from the watch and from the feed (%d later entries wait); if it was cleaned up, restart from a newer snapshot",
			f.applied+1, len(f.pending))
		f.mu.Lock()
		f.stats.LastError = err.Error()
		f.mu.Unlock()
		f.log.Warn("gap not filled", "missing_seq", f.applied+1, "buffered", len(f.pending))
	}
	return nil
}

// offer takes one record from a read or the watch: a duplicate is dropped,
// an early one buffered, the next one applied along with the buffered ones
// that follow it.
func (f *Follower) offer(ctx context.Context, r Record) error {
	if r.Seq <= f.applied {
		f.count(&f.stats.Duplicates)
		return nil
	}
	if r.Seq > f.applied+1 {
		if _, ok := f.pending[r.Seq]; ok {
			f.count(&f.stats.Duplicates)
			return nil
		}
		if len(f.pending) >= f.cfg.MaxBuffered {
			// Left to the Feed: the re-read fetches it once the gap is filled.
			f.count(&f.stats.Overflowed)
			if f.overflowAt != f.applied+1 {
				f.overflowAt, f.rereadNow = f.applied+1, true
			}
			return nil
		}
		f.pending[r.Seq] = r
		f.mu.Lock()
		f.stats.Reordered++
		f.stats.Buffered = len(f.pending)
		f.mu.Unlock()
		return nil
	}
	for {
		if err := f.applyChecked(ctx, r); err != nil {
			return err
		}
		next, ok := f.pending[f.applied+1]
		if !ok {
			return nil
		}
		delete(f.pending, next.Seq)
		f.mu.Lock()
		f.stats.Buffered = len(f.pending)
		f.mu.Unlock()
		r = next
	}
}

func (f *Follower) count(c *uint64) {
	f.mu.Lock()
	*c++
	f.mu.Unlock()
}

// applyChecked applies the next record. A bad one gets one second chance:
// the value is re-read from the Feed, as a watch may have delivered a torn
// or stale value; if that is bad too, following stops.
func (f *Follower) applyChecked(ctx context.Context, r Record) error {
	err := f.apply(r)
	if err == nil {
		return nil
	}
	f.log.Warn("bad oplog entry; re-reading it", "seq", r.Seq, "error", err)
	var recs []Record
	rerr := f.retry(ctx, "re-read a bad entry", func() (err error) {
		recs, _, err = f.cfg.Feed.ReadSince(ctx, r.Seq-1, 1)
		return err
	})
	if rerr != nil {
		return rerr
	}
	note := " (the feed no longer has it)"
	if len(recs) == 1 && recs[0].Seq == r.Seq {
		if err = f.apply(recs[0]); err == nil {
			f.count(&f.stats.EntryResyncs)
			f.log.Info("bad entry replaced by the value re-read from the feed", "seq", r.Seq)
			return nil
		}
		note = " (so is the value re-read from the feed)"
	}
	msg := err.Error()
	var e *errcode.Error
	if errors.As(err, &e) {
		msg = e.Msg // the code goes in front again below
	}
	return errcode.New(errcode.Of(err), "follower stopped: entry %d is bad%s, applied seq is %d: %s",
		r.Seq, note, f.applied, msg)
}

// apply checks the record with seq applied+1 and applies it, or changes
// nothing and says what is wrong.
func (f *Follower) apply(r Record) error {
	e, err := Decode(r.Value)
	if err != nil {
		return err
	}
	if e.SequenceID != r.Seq {
		return errcode.New(errcode.InvalidParams, "oplog entry stored under seq %d has sequence_id %d", r.Seq, e.SequenceID)
	}
	if err := e.Verify(); err != nil {
		return err
	}
	var p PutEndPayload
	if e.OpType == OpPutEnd {
		if p, err = DecodePutEndPayload(e.Payload); err != nil {
			return err
		}
	}
	o, live := f.objects[e.Key] // Run's goroutine is the only writer: no lock to read
	last := o.KeySeq
	if t, ok := f.tombs[e.Key]; !live && ok && !f.expired(t, e.TimestampMs) {
		last = t.keySeq
	}
	if e.KeySequenceID <= last {
		return errcode.New(errcode.InvalidParams, "key %q: key_sequence_id %d after %d", e.Key, e.KeySequenceID, last)
	}

	f.expireTombs(e.TimestampMs)
	var r0 Renewal
	if e.OpType == OpPutEnd && len(f.early) > 0 {
		if r0 = f.early[e.Key]; r0.Key != "" && expiredRenewal(r0, f.cfg.Now()) {
			r0 = Renewal{}
		}
		delete(f.early, e.Key)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if e.OpType == OpPutEnd {
		delete(f.tombs, e.Key) // its queue entry stays and is skipped at expiry
		f.objects[e.Key] = ObjectState{Size: p.Size, KeySeq: e.KeySequenceID, Payload: p,
			LeaseTimeoutMs: r0.LeaseTimeoutMs, SoftPinTimeoutMs: r0.SoftPinTimeoutMs}
		if r0.Key != "" {
			f.stats.Renewals++
		}
	} else {
		// A REMOVE of a key never seen is normal: the leader also exports
		// the removal of PROCESSING objects.
		delete(f.objects, e.Key)
		t := tombstone{e.KeySequenceID, e.TimestampMs}
		f.tombs[e.Key] = t
		f.tombQueue = append(f.tombQueue, queuedTomb{e.Key, t})
	}
	f.applied = r.Seq
	return nil
}

// expireTombs forgets the key sequences of keys removed KeySeqRetain
// before nowMs, as the leader does; the leader forgets no earlier, so a key
// it restarts at 1 is never still remembered here.
func (f *Follower) expireTombs(nowMs int64) {
	i := 0
	for ; i < len(f.tombQueue); i++ {
		q := f.tombQueue[i]
		if !f.expired(q.tombstone, nowMs) {
			break
		}
		// The key may have come back since, or been removed again.
		if f.tombs[q.key] == q.tombstone {
			delete(f.tombs, q.key)
		}
	}
	f.tombQueue = f.tombQueue[i:]
}

func (f *Follower) expired(t tombstone, nowMs int64) bool {
	return t.atMs+f.cfg.KeySeqRetain.Milliseconds() <= nowMs
}

// renew raises known objects' deadlines to the renewals'. A renewal of an
// unknown key is kept until the key's PUT_END (or its own expiry): the
// leader writes renewals beside the export, so one may come first.
func (f *Follower) renew(rs []Renewal) {
	if len(rs) == 0 {
		return
	}
	now := f.cfg.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range rs {
		if expiredRenewal(r, now) {
			continue
		}
		o, ok := f.objects[r.Key]
		if !ok {
			f.park(r, now)
			continue
		}
		o.LeaseTimeoutMs = max(o.LeaseTimeoutMs, r.LeaseTimeoutMs)
		o.SoftPinTimeoutMs = max(o.SoftPinTimeoutMs, r.SoftPinTimeoutMs)
		f.objects[r.Key] = o
		f.stats.Renewals++
	}
}

// park keeps r for a key not seen yet, within MaxBuffered: expired ones
// make room, and past that the renewal is dropped.
func (f *Follower) park(r Renewal, now int64) {
	if p, ok := f.early[r.Key]; ok {
		r.LeaseTimeoutMs = max(r.LeaseTimeoutMs, p.LeaseTimeoutMs)
		r.SoftPinTimeoutMs = max(r.SoftPinTimeoutMs, p.SoftPinTimeoutMs)
	} else if len(f.early) >= f.cfg.MaxBuffered {
		maps.DeleteFunc(f.early, func(_ string, p Renewal) bool { return expiredRenewal(p, now) })
		if len(f.early) >= f.cfg.MaxBuffered {
			return
		}
	}
	f.early[r.Key] = r
}

// expiredRenewal says whether r grants nothing any more.
func expiredRenewal(r Renewal, now int64) bool {
	return r.LeaseTimeoutMs <= now && r.SoftPinTimeoutMs <= now
}

// publish wakes WaitFor callers if applied has grown: once per batch, not
// per entry, to keep a channel allocation off the per-entry path.
func (f *Follower) publish() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publishLocked()
}

func (f *Follower) publishLocked() {
	if f.applied != f.published {
		close(f.advanced)
		f.advanced = make(chan struct{})
		f.published = f.applied
	}
}

// retry calls read until it succeeds or ctx ends, backing off; a Feed
// error is an unreachable etcd, not a reason to stop following.
func (f *Follower) retry(ctx context.Context, what string, read func() error) error {
	for n := 1; ; n++ {
		err := read()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		f.mu.Lock()
		f.stats.LastError = fmt.Sprintf("follower: %s: %v", what, err)
		f.mu.Unlock()
		f.log.Warn("feed read failed; retrying", "op", what, "attempt", n, "error", err)
		if err := sleep(ctx, backoff(n)); err != nil {
			return err
		}
	}
}

// backoff is the wait before retry n (n >= 1).
func backoff(n int) time.Duration {
	d := retryMin
	for ; n > 1 && d < retryMax; n-- {
		d *= 2
	}
	return min(d, retryMax)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
