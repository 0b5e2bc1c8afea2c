package node

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// ReadMode says how the leader proves that a read is linearizable.
type ReadMode string

const (
	// ReadLease answers from the leader's state while it holds a read lease
	// that a quorum round confirmed: no round trip per read.
	ReadLease ReadMode = "lease"
	// ReadQuorum runs a quorum round for every read (concurrent reads share
	// one).
	ReadQuorum ReadMode = "quorum"
)

// leaseDriftMargin is the part of the heartbeat timeout the read lease
// leaves unused, for the difference in rate between the leader's and the
// followers' monotonic clocks (docs/OPERATIONS.md, "Read modes").
const leaseDriftMargin = 0.1

// maxReadLease is the longest read lease that is safe with heartbeat
// timeout hb.
func maxReadLease(hb time.Duration) time.Duration {
	return time.Duration(float64(hb) * (1 - leaseDriftMargin))
}

// leadership confirms this node's leadership for reads: by quorum rounds
// (logRound) that concurrent callers share, and in lease mode by the read
// lease those rounds establish.
//
// Why the lease holds: a hashicorp/raft follower that knows a leader refuses
// every other candidate (unless that leader asked it to vote, in a
// leadership transfer) until its heartbeat timer finds no contact for a
// whole heartbeat timeout. Every member of a quorum that acknowledged a
// heartbeat sent after time t0 therefore helps elect nobody else before
// t0 + heartbeat timeout by its clock; the lease ends sooner, at t0 + dur,
// where t0 is taken before the round starts and dur leaves a margin for
// clock drift. The leader's own refusal lasts only while it leads, so a
// read also checks that this node is still the leader. What would break the
// reasoning is handled where it happens: a restarted follower has forgotten
// its leader (New waits dur before starting Raft), a leadership transfer
// makes followers vote at once and a snapshot restore swaps the state
// (suspend around each). A membership change needs nothing: hashicorp/raft
// changes one server at a time, and every majority of the new configuration
// holds a member of the old majority that confirmed the lease.
type leadership struct {
	verify func() error     // one quorum round (logRound)
	term   func() uint64    // Raft's current term
	now    func() time.Time // monotonic
	dur    time.Duration    // lease length; 0 in quorum mode

	mu      sync.Mutex
	waiting []chan error // callers of confirm for the next round
	running bool         // a goroutine is running rounds
	renew   bool         // a background round is wanted

	until     time.Time // the lease holds while now is before until
	leaseTerm uint64    // the term the lease was confirmed in
	epoch     uint64    // bumped by drop: rounds begun earlier confirm nothing
	suspended int       // > 0: no lease is held or established

	rounds atomic.Uint64 // quorum rounds run (metrics)
}

// leaseToken identifies the lease a read started under.
type leaseToken uint64

// confirm returns once a quorum round that began after the call has
// confirmed this node's leadership (or failed): what a linearizable read
// needs before it reads. Concurrent callers share rounds.
func (l *leadership) confirm(ctx context.Context) error {
	ch := make(chan error, 1)
	l.mu.Lock()
	l.waiting = append(l.waiting, ch)
	l.startLocked()
	l.mu.Unlock()
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// startLocked starts the round goroutine unless it runs. It ends when no
// round is wanted; a round returns once Raft has shut down (Node.wait), so
// it cannot outlive Raft.
func (l *leadership) startLocked() {
	if !l.running {
		l.running = true
		go l.run()
	}
}

func (l *leadership) run() {
	for {
		l.mu.Lock()
		batch := l.waiting
		l.waiting = nil
		if len(batch) == 0 && !l.renew {
			l.running = false
			l.mu.Unlock()
			return
		}
		l.renew = false
		epoch := l.epoch
		l.mu.Unlock()

		start, term := l.now(), l.term()
		err := l.verify()
		l.rounds.Add(1)
		l.mu.Lock()
		if err == nil && l.dur > 0 && l.epoch == epoch && l.suspended == 0 {
			l.until, l.leaseTerm = start.Add(l.dur), term
		}
		l.mu.Unlock()
		for _, ch := range batch {
			ch <- err
		}
	}
}

// lease reports whether this node holds a read lease now.
func (l *leadership) lease() (leaseToken, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return leaseToken(l.epoch), l.validLocked(l.now())
}

// holds reports whether the lease a read started under (tok) still holds:
// called after the read, so a pause between lease and the read cannot
// serve a state that a new leader may have changed meanwhile. While it
// holds with less than renewBelow of it left and no round runs, it starts
// one in the background (any round renews the lease), so steady reads
// never wait for one; only reads call it, so an idle leader lets its lease
// lapse and pays one round at the next read.
func (l *leadership) holds(tok leaseToken) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now() // taken after the read, it answers both questions (a reading is ~50 ns in a VM)
	if leaseToken(l.epoch) != tok || !l.validLocked(now) {
		return false
	}
	if !l.running && l.until.Sub(now) < time.Duration(float64(l.dur)*renewBelow) {
		l.renew = true
		l.startLocked()
	}
	return true
}

// renewBelow is the share of the lease left below which a read starts a
// renewal. A round is a log entry behind every write queued before it, so
// under a heavy write load it took longer than half the lease (135 ms at
// the defaults); the lease lapsed, a few hundred pings waited for the next
// round together and then ran together, and the leader's other goroutines
// waited behind them (RELIABILITY finding 27). Starting at three quarters
// leaves a round 200 ms, for one more barrier entry every 70 ms while reads
// flow.
const renewBelow = 0.75

func (l *leadership) validLocked(now time.Time) bool {
	return l.dur > 0 && l.suspended == 0 && now.Before(l.until) && l.leaseTerm == l.term()
}

// drop ends the lease now; a round already running cannot re-establish it.
func (l *leadership) drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropLocked()
}

func (l *leadership) dropLocked() {
	l.epoch++
	l.until = time.Time{}
}

// suspend drops the lease and keeps it from being established until the
// returned func is called: around anything that lets a quorum elect
// another leader, or changes the state, without the usual log order.
func (l *leadership) suspend() (resume func()) {
	l.mu.Lock()
	l.suspended++
	l.dropLocked()
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.suspended--
			l.mu.Unlock()
		})
	}
}

// remaining is how long the lease still holds (0 without one).
func (l *leadership) remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.validLocked(now) {
		return 0
	}
	return l.until.Sub(now)
}

// logRound is one leadership round: a Barrier entry, appended after the
// round began, commits only once a quorum has acknowledged an append that
// carries it, in this leader's term; then every entry before it is applied
// here too. raft's VerifyLeader is not used: it also counts answers to
// heartbeats sent before it was called (replication.go, notifyAll), so a
// leader paused with such answers in its socket buffers confirms itself on
// waking although a successor was elected and wrote meanwhile
// (TestLogRoundIgnoresAcksSentBeforeIt; found by the fault suite's
// pause-leader). The entry costs a log write on a quorum: once per lease
// renewal in lease mode, once per shared round in quorum mode. It waits to
// be queued however long the leader's apply queue is full (raft answers it
// on shutdown or lost leadership); each reader waits within its deadline.
func logRound(r *raft.Raft, wait func(raft.Future) error) error {
	err := wait(r.Barrier(0))
	if errors.Is(err, raft.ErrLeadershipLost) {
		// Nothing was written: for a read this is plain "not the leader".
		return raft.ErrNotLeader
	}
	return err
}
