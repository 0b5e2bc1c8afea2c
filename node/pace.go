package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
)

// pacer is the export's flow control (docs/OPERATIONS.md, "When writes
// outpace etcd"). The leader acknowledges a write once a quorum has it,
// not once etcd holds its OpLog entry, so writes faster than etcd takes
// entries grow a backlog: what a rebuild from a snapshot plus etcd would
// miss. Under the soft bound, in entries and in the age of the oldest
// entry etcd has not taken, a write goes at once. Past it a write waits,
// first come first served, until the backlog has room for its entries, so
// the admitted rate follows the rate at which etcd takes them. A write
// that would wait past its deadline is answered TOO_MANY_REQUESTS at once,
// unapplied. Reads, and writes that add no entry, are never paced.
//
// While etcd is unreachable there is no rate to follow: writes go on until
// the hard bound (--export-ring), then are refused with
// ETCD_OPERATION_ERROR saying since when etcd has failed and why.
//
// The leader's own bulk REMOVEs (release.go) yield to client writes: they
// go while the backlog stays under a backgroundShare of the soft bound, so
// the writes beside them find room and go at once unless etcd's rate falls
// below that share of itself. Once a client write has to wait, a waiting release takes its
// turn among the writes, first come first served, so writers that outpace
// etcd on their own do not starve it.
type pacer struct {
	softEntries uint64
	softAge     time.Duration
	hard        uint64
	// maxWait bounds the wait of a write without a deadline (a Mooncake
	// client's deadline is not on the wire).
	maxWait time.Duration
	// backlog is the entries applied and not taken by etcd; nowMs is the
	// command clock, against which an entry's age is taken.
	backlog func() uint64
	nowMs   func() int64
	now     func() time.Time

	mu       sync.Mutex
	active   bool   // this node leads and exports
	reserved uint64 // entries of admitted writes not yet applied
	queue    []*paceWaiter
	queued   uint64 // entries of the writes in queue
	// background holds the releases waiting for room under their share
	// of the bound while no client write waits; they join queue, ahead of the
	// first write that must wait.
	background []*paceWaiter
	oldestMs   int64 // command time of the oldest entry etcd has not taken; 0: none
	down       error // etcd's last failure; nil once it takes entries again
	downSince  time.Time
	rate       rateMeter
	paced      uint64 // writes that waited (metrics)
	refused    uint64 // writes refused for the backlog (metrics)
}

type paceWaiter struct {
	need     uint64
	ready    chan struct{}
	admitted bool
}

const (
	// undeadlinedPaceWait bounds the wait of a write without a deadline:
	// a Mooncake client's RPC timeout is not on the wire. Its coro_rpc
	// client waits 30 s by default; a follower forwarding the call gives
	// it 12 s (mooncakeapi's forwardTimeout), time for this wait and the
	// answer.
	undeadlinedPaceWait = 10 * time.Second
	// paceMargin is kept from a write's deadline for its own trip through
	// the log once admitted.
	paceMargin = 100 * time.Millisecond
	// rateWindow is how long the take rate is measured over before it is
	// folded into the estimate, with rateWeight: the estimate remembers
	// about rateWindow/rateWeight of etcd's rate. Folded half and half, a
	// dip of two seconds halved it: while 5,000 clients left at 3M objects
	// the export's rate dipped for 2–6 s every 10–12 s (the leader's
	// collections, the expiry's ticks) with etcd idle, the backlog's bound
	// in entries fell under the REMOVEs waiting, and writes were refused
	// for waits of 7–14 s that never came (docs/BENCHMARKS.md).
	rateWindow = time.Second
	rateWeight = 1.0 / 8
)

// admit waits until a write adding need entries may go and returns what
// counts it out once applied.
func (p *pacer) admit(ctx context.Context, need uint64) (release func(), err error) {
	if need == 0 {
		return func() {}, nil
	}
	p.mu.Lock()
	if err := p.overHard(need); err != nil {
		p.refused++
		p.mu.Unlock()
		return nil, err
	}
	if len(p.queue) == 0 && p.free(need) {
		p.reserved += need
		p.mu.Unlock()
		return p.releaser(need), nil
	}
	// This write must wait: the releases waiting in the background take
	// their turn ahead of it.
	for _, bw := range p.background {
		p.enqueue(bw)
	}
	p.background = nil
	budget := timeoutOf(ctx, p.maxWait) - paceMargin
	if wait, known := p.expectedWait(need); budget <= 0 || known && wait > budget {
		err := p.tooMany(need, wait, known)
		p.refused++
		p.mu.Unlock()
		return nil, err
	}
	w := p.enqueue(&paceWaiter{need: need, ready: make(chan struct{})})
	p.paced++
	p.mu.Unlock()

	if p.wait(ctx, w, budget) {
		return p.releaser(need), nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refused++
	if ctx.Err() != nil {
		return nil, errcode.New(errcode.TooManyRequests, "the write's deadline passed while it waited for etcd to take the OpLog backlog; it was not applied")
	}
	wait, known := p.expectedWait(need)
	return nil, p.tooMany(need, wait, known)
}

// admitBackground is admit for the leader's bulk REMOVEs: it waits until
// ctx is done for room under its share of the soft bound, or for its turn among
// the client writes once one waits (the pacer's comment).
func (p *pacer) admitBackground(ctx context.Context, need uint64) (release func(), err error) {
	if need == 0 {
		return func() {}, nil
	}
	p.mu.Lock()
	if err := p.overHard(need); err != nil {
		p.mu.Unlock()
		return nil, err
	}
	w := &paceWaiter{need: need, ready: make(chan struct{})}
	if len(p.queue) > 0 {
		p.enqueue(w)
	} else {
		p.background = append(p.background, w)
		p.admitWaiting()
	}
	p.mu.Unlock()
	if p.wait(ctx, w, timeoutOf(ctx, p.maxWait)) {
		return p.releaser(need), nil
	}
	return nil, errcode.New(errcode.TooManyRequests, "no room for %d deferred REMOVEs in the OpLog backlog before the release's deadline", need)
}

// backgroundShare is the share of the soft bound the leader's bulk
// REMOVEs may fill: a quarter. The bound follows etcd's take rate, so
// etcd may slow to a quarter of its rate before the backlog they left
// makes a client write wait. At a half, 5,000 clients leaving at six
// million objects refused 5 probe writes of 25,536 with 2 s deadlines
// when etcd's rate fell 2.2-fold (docs/RELIABILITY.md, finding 35).
const backgroundShare = 4

// releaseSize is the most deferred REMOVEs one release should ask for: half
// of their share of the bound, so that one admitted under that share
// leaves room for client writes however small the bound.
func (p *pacer) releaseSize() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(1, p.bound()/backgroundShare/2)
}

func (p *pacer) enqueue(w *paceWaiter) *paceWaiter {
	p.queue = append(p.queue, w)
	p.queued += p.cost(w.need)
	return w
}

// wait waits for w's admission, ctx or budget, whichever comes first, and
// withdraws w if it was not admitted.
func (p *pacer) wait(ctx context.Context, w *paceWaiter, budget time.Duration) (admitted bool) {
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case <-w.ready:
	case <-ctx.Done():
	case <-t.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if w.admitted {
		return true
	}
	if i := slices.Index(p.queue, w); i >= 0 {
		p.queue = slices.Delete(p.queue, i, i+1)
		p.queued -= p.cost(w.need)
	}
	if i := slices.Index(p.background, w); i >= 0 {
		p.background = slices.Delete(p.background, i, i+1)
	}
	p.admitWaiting() // those behind it may fit now
	return false
}

// free reports whether a write of need entries fits under the soft bound.
func (p *pacer) free(need uint64) bool { return p.fits(need, p.bound()) }

// fits reports whether a write of need entries fits under bound entries
// and the age bound.
func (p *pacer) fits(need, bound uint64) bool {
	if !p.active || p.down != nil {
		return true
	}
	b := p.backlog() + p.reserved
	if b == 0 {
		return true
	}
	if b+min(p.cost(need), bound/4) > bound {
		return false
	}
	// Without a measured rate the age is held to its bound directly.
	return p.rate.perSec > 0 || p.oldestMs == 0 || time.Duration(p.nowMs()-p.oldestMs)*time.Millisecond < p.softAge
}

// bound is the soft bound in entries: --export-soft-entries, or fewer when
// etcd takes entries so slowly that a backlog of that many would be older
// than --export-soft-age. Held to it, the backlog's age stays near its
// bound, and writes go as etcd makes room rather than all at once each
// time the oldest entry goes under the age.
func (p *pacer) bound() uint64 {
	if p.rate.perSec <= 0 {
		return p.softEntries
	}
	return max(1, min(p.softEntries, uint64(p.rate.perSec*p.softAge.Seconds())))
}

// cost is what a write of need entries counts for against the soft bound
// while it waits: at most a quarter of the bound, so a larger one (an
// unmount of many objects) goes once the backlog is down to three
// quarters, not only once it is empty, which steady writers may never let
// it be; and the writes behind it do not count it whole.
func (p *pacer) cost(need uint64) uint64 { return min(need, p.softEntries/4) }

// overHard refuses a write that would take the backlog past the hard
// bound, saying which case it is.
func (p *pacer) overHard(need uint64) error {
	if !p.active {
		return nil
	}
	b := p.backlog() + p.reserved
	if b+need <= p.hard {
		return nil
	}
	if p.down != nil {
		return errcode.New(errcode.EtcdOperationError,
			"etcd has not taken OpLog entries for %s (last error: %v): %d wait for it and the bound is %d (--export-ring); writes are refused until etcd is reachable again",
			p.now().Sub(p.downSince).Round(time.Second), p.down, b, p.hard)
	}
	return errcode.New(errcode.EtcdOperationError,
		"%d OpLog entries wait for etcd, which takes ~%.0f a second; the bound is %d (--export-ring): writes are refused until the export catches up",
		b, p.rate.perSec, p.hard)
}

// expectedWait is how long a write of need entries arriving now would
// wait at the measured take rate; known is false before a rate is measured.
func (p *pacer) expectedWait(need uint64) (time.Duration, bool) {
	if p.rate.perSec <= 0 {
		return 0, false
	}
	ahead := p.queued + p.cost(need)
	if b, bound := p.backlog()+p.reserved, p.bound(); b > bound {
		ahead += b - bound
	}
	return time.Duration(float64(ahead) / p.rate.perSec * float64(time.Second)), true
}

func (p *pacer) tooMany(need uint64, wait time.Duration, known bool) error {
	est := "etcd's take rate is not measured yet"
	if known {
		est = fmt.Sprintf("it would wait ~%s at the ~%.0f entries a second etcd takes", wait.Round(time.Millisecond), p.rate.perSec)
	}
	return errcode.New(errcode.TooManyRequests,
		"%d OpLog entries wait for etcd (soft bound %d entries or %s old, --export-soft-entries and --export-soft-age): this write of %d entries cannot be admitted before its deadline (%s); it was not applied, retry after a short wait",
		p.backlog()+p.reserved, p.softEntries, p.softAge, need, est)
}

func (p *pacer) releaser(need uint64) func() {
	return func() {
		p.mu.Lock()
		p.reserved -= need
		p.admitWaiting()
		p.mu.Unlock()
	}
}

// admitWaiting lets in the waiting writes, oldest first, while they fit;
// then, while no write waits, the background releases that fit under
// their share of the bound.
func (p *pacer) admitWaiting() {
	for len(p.queue) > 0 && p.free(p.queue[0].need) {
		w := p.queue[0]
		p.queue = p.queue[1:]
		p.queued -= p.cost(w.need)
		p.let(w)
	}
	for len(p.queue) == 0 && len(p.background) > 0 && p.fits(p.background[0].need, p.bound()/backgroundShare) {
		p.let(p.background[0])
		p.background = p.background[1:]
	}
}

func (p *pacer) let(w *paceWaiter) {
	p.reserved += w.need
	w.admitted = true
	close(w.ready)
}

// start and stop bracket this node's export as leader; stopped, it paces
// nothing (a write then meets Raft's own answer).
func (p *pacer) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active, p.down, p.oldestMs, p.rate = true, nil, 0, rateMeter{}
}

func (p *pacer) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active = false
	p.admitWaiting()
}

// took records a transaction of k entries etcd acknowledged.
func (p *pacer) took(k uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = nil
	p.rate.took(k, p.now())
	p.admitWaiting()
}

// failed records a failed export call: etcd is unreachable, so nothing is
// paced until it takes entries again.
func (p *pacer) failed(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down == nil {
		p.downSince = p.now()
	}
	p.down = err
	p.admitWaiting()
}

// idle records that the exporter waited for entries: a rate measured
// across such a wait is a floor of etcd's, not its measure.
func (p *pacer) idle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate.idle = true
}

// setOldest records the command time of the oldest entry etcd has not
// taken.
func (p *pacer) setOldest(pending fsm.Pending) {
	ms, ok := pending.OldestMs()
	if !ok {
		ms = 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.oldestMs = ms
	p.admitWaiting()
}

// paceStats is the pacer's state for status and metrics.
type paceStats struct {
	Waiting  int     // writes waiting now
	TakeRate float64 // entries a second etcd takes, as measured
	// EtcdError is etcd's last failure while it is down, "" while it
	// takes entries.
	EtcdError string
	Paced     uint64 // writes that waited, since start
	Refused   uint64 // writes refused for the backlog, since start
}

// EtcdDown: the export's last etcd call failed.
func (ps paceStats) EtcdDown() bool { return ps.EtcdError != "" }

func (p *pacer) stats() paceStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	ps := paceStats{Waiting: len(p.queue), TakeRate: p.rate.perSec, Paced: p.paced, Refused: p.refused}
	if p.down != nil {
		ps.EtcdError = p.down.Error()
	}
	return ps
}

// rateMeter estimates the rate at which etcd takes entries, from windows
// of about rateWindow. A window in which the exporter was busy throughout
// measures etcd; one in which it waited for entries only shows etcd can
// take at least that much.
type rateMeter struct {
	start   time.Time
	entries uint64
	idle    bool
	perSec  float64
}

func (r *rateMeter) took(k uint64, now time.Time) {
	if r.start.IsZero() {
		r.start, r.idle = now, false
	}
	r.entries += k
	el := now.Sub(r.start)
	if el < rateWindow {
		return
	}
	s := float64(r.entries) / el.Seconds()
	switch {
	case r.perSec == 0:
		r.perSec = s
	case r.idle:
		r.perSec = max(r.perSec, s)
	default:
		r.perSec += (s - r.perSec) * rateWeight
	}
	r.start, r.entries, r.idle = now, 0, false
}

// entriesOf is how many OpLog entries a client command adds: the pacer's
// measure of it. Commands that finish work already admitted (PutEnd,
// PutRevoke) or add none are 0 and never wait. So are bulk removals
// (unmounts, RemoveAll): at most bulkDirect of their REMOVEs go to the
// ring at once, the rest take their turns in the deferred queue
// (release.go), so a client leaving with many segments is answered at
// once, not paced behind its own removals.
func entriesOf(c fsm.Command) uint64 {
	switch c := c.(type) {
	case *fsm.PutStart, *fsm.Remove:
		return 1 // the PUT_END to come, the REMOVE
	case *fsm.UpsertStart:
		return 2 // the old copy's REMOVE and the PUT_END to come
	case *fsm.Batch:
		var n uint64
		for _, b := range c.Cmds {
			n += entriesOf(b)
		}
		return n
	}
	return 0
}

// backlog is the OpLog entries applied here and not yet taken by etcd.
func (n *Node) backlog() uint64 {
	applied, exported := n.sm.appliedSeq.Load(), n.exportedSeq.Load()
	if exported >= applied {
		return 0
	}
	return applied - exported
}
