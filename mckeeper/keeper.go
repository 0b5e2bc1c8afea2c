// Package mckeeper keeps a Mooncake client's segments mounted and its
// session alive over the Mooncake master protocol, as Mooncake's own client
// does (client_service.cpp, Client::StorageHeartbeatThreadMain, Mooncake
// 3b5a594): a ping a second after the last one's answer, on the client's
// own connection, each call waiting up to coro_rpc's default 30 s for its
// answer; after three failed pings in a row, the master's address looked
// up anew (an HA client reads master_view in etcd) and a new connection;
// NEED_REMOUNT answered with a remount of every segment, which reports what
// the pings saw before it (Remount). Its LeaderMonitorThread, which watches
// master_view and switches master at once, is not modelled. moonbench's
// scale harness runs thousands of them, as a cluster serving Mooncake's
// clients has, and writes through Clients of its own, as master_bench
// does.
package mckeeper

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mc "github.com/moonraft/moonraft/mooncakeapi"
)

const (
	// PingEvery is the wait after a ping, answered or not (Mooncake's
	// success_ping_interval_ms and fail_ping_interval_ms).
	PingEvery = time.Second
	// CallTimeout is the longest a call waits for its answer, and a dial
	// for its connection: coro_rpc's defaults (request_timeout_duration,
	// connect_timeout_duration), which Mooncake's master client keeps
	// unless MC_RPC_TIMEOUT_MS or MC_RPC_CONNECT_TIMEOUT_MS is set
	// (master_client.h, ApplyRpcTimeoutEnvOverrides).
	CallTimeout = 30 * time.Second
	// maxPingFails failed pings in a row send the client to look the
	// master up again (max_ping_fail_count).
	maxPingFails = 3
)

// Keeper is one Mooncake client's mounts and heartbeat.
type Keeper struct {
	id   mc.UUID
	segs []mc.Segment
	c    *Client

	mu        sync.Mutex // guards the fields below
	lastErr   error
	cancel    context.CancelFunc
	done      chan struct{}
	onRemount func(Remount)

	remounts atomic.Int64
}

// Remount is a remount the master asked for, with what the client's pings
// had seen before it: whether the master forgot a client that kept
// pinging, or the pings had stopped reaching it.
type Remount struct {
	At time.Time // when the NEED_REMOUNT answer was read
	// Silence is the longest the master can have gone without a ping from
	// the client in the silenceWindow before At: from the sending of a
	// ping it answered OK to the next answered OK, or to At; 0 if none had
	// been since Start. Under the session TTL, the master forgot a client
	// that was pinging.
	Silence time.Duration
	// SinceOK is from the sending of the last ping answered OK to At: under
	// Silence, the longest silence ended before the last ping answered OK.
	SinceOK time.Duration
	// Took is how long the ping answered NEED_REMOUNT waited for its
	// answer: a long wait means it was held on its way or at the master.
	Took    time.Duration
	Failed  int    // pings failed since the last answered OK
	LastErr string // the last failed ping's error, "" if none
	// LastDial is the client's last connection to the master before At.
	LastDial Dial
}

// OnRemount has f called after each remount the master asks for (by the
// Keeper's goroutine: f must not block). It must come before Start.
func (k *Keeper) OnRemount(f func(Remount)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.onRemount = f
}

// New returns a Keeper for client id, whose segments are segs, that finds
// its master through resolve. It neither connects nor pings until Mount
// and Start.
func New(id mc.UUID, segs []mc.Segment, resolve Resolver) *Keeper {
	return &Keeper{id: id, segs: segs, c: NewClient(resolve)}
}

// Mount mounts every segment (connecting first if need be); on error it
// may be called again.
func (k *Keeper) Mount(ctx context.Context) error {
	for _, s := range k.segs {
		if err := k.call(ctx, "MountSegment", mc.MountArgs{Segment: s, ClientID: k.id}); err != nil {
			return err
		}
	}
	return nil
}

// Start starts the heartbeat: a ping now, then every second, until Stop.
func (k *Keeper) Start(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	k.mu.Lock()
	k.cancel, k.done = cancel, make(chan struct{})
	onRemount := k.onRemount
	k.mu.Unlock()
	go k.run(ctx, onRemount)
}

// Stop ends the heartbeat and closes the connection, as a client process
// that exits does.
func (k *Keeper) Stop() {
	k.mu.Lock()
	cancel, done := k.cancel, k.done
	k.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	k.c.Close()
}

// Remounts is how many times the master told the client to remount and
// the remount succeeded.
func (k *Keeper) Remounts() int { return int(k.remounts.Load()) }

// Err is the error of the last ping (or its remount), nil if it succeeded.
func (k *Keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lastErr
}

func (k *Keeper) run(ctx context.Context, onRemount func(Remount)) {
	defer close(k.done)
	var (
		fails   int    // in a row, toward a switch of master
		failed  int    // since the last ping answered OK
		lastErr string // the last failed ping's
		quiet   silences
	)
	for {
		sent := time.Now()
		p, err := k.ping(ctx)
		if ctx.Err() != nil {
			return
		}
		k.mu.Lock()
		k.lastErr = err
		k.mu.Unlock()
		if p.remounted && onRemount != nil {
			onRemount(Remount{At: p.answered, Silence: quiet.longest(p.answered), SinceOK: quiet.since(p.answered), Took: p.answered.Sub(sent),
				Failed: failed, LastErr: lastErr, LastDial: p.dial})
		}
		if err == nil {
			fails, failed, lastErr = 0, 0, ""
			quiet.ok(sent)
		} else if fails, failed, lastErr = fails+1, failed+1, err.Error(); fails >= maxPingFails && k.c.SwitchMaster(ctx) == nil {
			fails = 0
			continue // Mooncake's client pings a new master at once
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(PingEvery):
		}
	}
}

// pinged is what a ping saw.
type pinged struct {
	remounted bool      // the master said NEED_REMOUNT, and the remount succeeded
	answered  time.Time // when the ping's answer was read
	dial      Dial      // the connection's, as the ping was answered
}

// ping pings, and remounts if the master says so.
func (k *Keeper) ping(ctx context.Context) (pinged, error) {
	pctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	r, err := CallExpected[mc.PingResponse](pctx, k.c, "Ping", k.id)
	p := pinged{answered: time.Now(), dial: k.c.LastDial()}
	if err != nil || r.ClientStatus != mc.ClientNeedRemount {
		return p, err
	}
	if err := k.call(ctx, "ReMountSegment", mc.ReMountArgs{Segments: k.segs, ClientID: k.id}); err != nil {
		return p, err
	}
	k.remounts.Add(1)
	p.remounted = true
	return p, nil
}

// call calls a function answering Expected<void>.
func (k *Keeper) call(ctx context.Context, name string, args any) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	_, err := CallExpected[mc.Void](ctx, k.c, name, args)
	return err
}

const (
	// A longGap between pings answered OK is kept for silenceWindow,
	// three of Mooncake's default session TTLs (10 s).
	longGap       = 2 * PingEvery
	silenceWindow = 30 * time.Second
)

// silences tracks the gaps between a client's pings answered OK: how long
// the master can have gone without hearing from it. The last one before a
// NEED_REMOUNT may well be short: a ping the master answers OK just after
// it drained the pings for a Tick that expires the session.
type silences struct {
	answered time.Time // when the last ping answered OK was sent
	long     []gap     // over longGap, ended within silenceWindow
}

type gap struct {
	d   time.Duration
	end time.Time
}

// ok notes that a ping sent at t was answered OK.
func (s *silences) ok(t time.Time) {
	if !s.answered.IsZero() && t.Sub(s.answered) > longGap {
		s.long = append(s.long, gap{t.Sub(s.answered), t})
	}
	s.answered = t
	s.long = slices.DeleteFunc(s.long, func(g gap) bool { return t.Sub(g.end) > silenceWindow })
}

// since is the time from the sending of the last ping answered OK to t; 0
// if none has been.
func (s *silences) since(t time.Time) time.Duration {
	if s.answered.IsZero() {
		return 0
	}
	return t.Sub(s.answered)
}

// longest is the longest gap in the silenceWindow before t, the one
// running at t included; 0 if no ping has been answered OK.
func (s *silences) longest(t time.Time) time.Duration {
	if s.answered.IsZero() {
		return 0
	}
	d := s.since(t)
	for _, g := range s.long {
		if t.Sub(g.end) <= silenceWindow {
			d = max(d, g.d)
		}
	}
	return d
}
