// Package mckeeper keeps a Mooncake client's segments mounted and its
// session alive over the Mooncake master protocol, as Mooncake's own client
// does (client_service.cpp, Client::StorageHeartbeatThreadMain, Mooncake
// 3b5a594): a ping every second on the client's own connection; after three
// failed pings in a row, the master's address looked up anew (an HA client
// reads master_view in etcd) and a new connection; NEED_REMOUNT answered
// with a remount of every segment. moonbench's scale harness runs thousands
// of them, as a cluster serving Mooncake's clients has.
package mckeeper

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/errcode"
	mc "github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/structpack"
)

const (
	// pingEvery is the wait after a ping, answered or not (Mooncake's
	// success_ping_interval_ms and fail_ping_interval_ms), and the longest
	// a call waits for its answer.
	pingEvery = time.Second
	// maxPingFails failed pings in a row send the client to look the
	// master up again (max_ping_fail_count).
	maxPingFails = 3
)

// Resolver returns the master's Mooncake-protocol address (host:port).
type Resolver func(ctx context.Context) (string, error)

// Keeper is one Mooncake client's mounts and heartbeat.
type Keeper struct {
	id      mc.UUID
	segs    []mc.Segment
	resolve Resolver

	mu      sync.Mutex      // guards the fields below
	conn    *cororpc.Client // nil until dialled and after Stop
	addr    string          // the master's, "" until looked up
	lastErr error
	cancel  context.CancelFunc
	done    chan struct{}

	remounts atomic.Int64
}

// New returns a Keeper for client id, whose segments are segs, that finds
// its master through resolve. It neither connects nor pings until Mount
// and Start.
func New(id mc.UUID, segs []mc.Segment, resolve Resolver) *Keeper {
	return &Keeper{id: id, segs: segs, resolve: resolve}
}

// Mount mounts every segment (connecting first if need be); on error it
// may be called again.
func (k *Keeper) Mount(ctx context.Context) error {
	for _, s := range k.segs {
		if _, err := call[mc.Void](ctx, k, "MountSegment", mc.MountArgs{Segment: s, ClientID: k.id}); err != nil {
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
	k.mu.Unlock()
	go k.run(ctx)
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
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.conn != nil {
		k.conn.Close()
		k.conn = nil
	}
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

func (k *Keeper) run(ctx context.Context) {
	defer close(k.done)
	fails := 0
	for {
		err := k.ping(ctx)
		if ctx.Err() != nil {
			return
		}
		k.mu.Lock()
		k.lastErr = err
		k.mu.Unlock()
		if err == nil {
			fails = 0
		} else if fails++; fails >= maxPingFails && k.switchMaster(ctx) == nil {
			fails = 0
			continue // Mooncake's client pings a new master at once
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pingEvery):
		}
	}
}

func (k *Keeper) ping(ctx context.Context) error {
	p, err := call[mc.PingResponse](ctx, k, "Ping", k.id)
	if err != nil || p.ClientStatus != mc.ClientNeedRemount {
		return err
	}
	if _, err := call[mc.Void](ctx, k, "ReMountSegment", mc.ReMountArgs{Segments: k.segs, ClientID: k.id}); err != nil {
		return err
	}
	k.remounts.Add(1)
	return nil
}

// call calls function name with args and returns its answer's value, or
// its error code as an error. The connection is dialled, the master looked
// up first if need be, when there is none or it broke.
func call[T any](ctx context.Context, k *Keeper, name string, args any) (T, error) {
	var r mc.Expected[T]
	body, err := structpack.Marshal(args)
	if err != nil {
		return r.Value, err
	}
	conn, addr, err := k.connect(ctx)
	if err != nil {
		return r.Value, err
	}
	cctx, cancel := context.WithTimeout(ctx, pingEvery)
	defer cancel()
	resp, err := conn.Call(cctx, mc.FunctionID(name), body)
	switch {
	case err != nil:
		return r.Value, fmt.Errorf("%s to %s: %w", name, addr, err)
	case resp.Header.Errc != cororpc.ErrcOK:
		return r.Value, fmt.Errorf("%s to %s: coro_rpc error %d: %s", name, addr, resp.Header.Errc, resp.Body)
	}
	if err := structpack.Unmarshal(resp.Body, &r); err != nil {
		return r.Value, fmt.Errorf("%s to %s: %w", name, addr, err)
	}
	if r.Err != 0 {
		return r.Value, errcode.New(errcode.Code(r.Err), "%s to %s: the master answered %v", name, addr, errcode.Code(r.Err))
	}
	return r.Value, nil
}

// connect returns the connection and its address, dialling the master
// again if the connection broke.
func (k *Keeper) connect(ctx context.Context) (*cororpc.Client, string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.conn == nil || k.conn.Err() != nil {
		if err := k.dial(ctx, k.addr == ""); err != nil {
			return nil, "", err
		}
	}
	return k.conn, k.addr, nil
}

// switchMaster looks the master up again and connects to it.
func (k *Keeper) switchMaster(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dial(ctx, true)
}

// dial replaces the connection with a new one to the master, looked up
// first if lookUp. k.mu is held.
func (k *Keeper) dial(ctx context.Context, lookUp bool) error {
	if k.conn != nil {
		k.conn.Close()
		k.conn = nil
	}
	if lookUp {
		addr, err := k.resolve(ctx)
		if err != nil {
			return fmt.Errorf("looking up the master: %w", err)
		}
		k.addr = addr
	}
	dctx, cancel := context.WithTimeout(ctx, pingEvery)
	defer cancel()
	conn, err := cororpc.Dial(dctx, k.addr, 0)
	if err != nil {
		return err
	}
	k.conn = conn
	return nil
}
