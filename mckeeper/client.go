package mckeeper

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/errcode"
	mc "github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/structpack"
)

// Resolver returns the master's Mooncake-protocol address (host:port).
type Resolver func(ctx context.Context) (string, error)

// Client is a connection to the Mooncake master, found through a Resolver
// and dialled again when it breaks. It is safe for concurrent use.
type Client struct {
	resolve Resolver

	mu   sync.Mutex      // guards the fields below
	conn *cororpc.Client // nil until dialled and after Close
	addr string          // the master's, "" until looked up
	last Dial            // the last dial's, successful or not
}

// Dial is how one connection to the master was made: a lookup of the
// master's address that takes seconds means etcd kept the client waiting;
// a connection that does, the master's listen queue (the client sends its
// SYN again 1, 3 and 7 s later).
type Dial struct {
	At     time.Time     // when it began; zero: none yet
	Addr   string        // the address dialled; "" if the lookup failed
	LookUp time.Duration // 0 if the address known was dialled again
	Dial   time.Duration // the connection's
	Err    string        // "" once connected
}

// NewClient returns a Client that finds its master through resolve. It
// connects at its first call.
func NewClient(resolve Resolver) *Client {
	return &Client{resolve: resolve}
}

// Close closes the connection; a later call dials again.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// Call calls function name with args, within ctx, and decodes its answer
// into an R. The connection is dialled, the master looked up first if need
// be, when there is none or it broke.
func Call[R any](ctx context.Context, c *Client, name string, args any) (R, error) {
	var r R
	body, err := structpack.Marshal(args)
	if err != nil {
		return r, err
	}
	conn, addr, err := c.connect(ctx)
	if err != nil {
		return r, err
	}
	resp, err := conn.Call(ctx, mc.FunctionID(name), body)
	switch {
	case err != nil:
		return r, fmt.Errorf("%s to %s: %w", name, addr, err)
	case resp.Header.Errc != cororpc.ErrcOK:
		return r, fmt.Errorf("%s to %s: coro_rpc error %d: %s", name, addr, resp.Header.Errc, resp.Body)
	}
	if err := structpack.Unmarshal(resp.Body, &r); err != nil {
		return r, fmt.Errorf("%s to %s: %w", name, addr, err)
	}
	return r, nil
}

// CallExpected is Call of a function that answers one expected value: the
// value, or the master's error code as an error.
func CallExpected[T any](ctx context.Context, c *Client, name string, args any) (T, error) {
	r, err := Call[mc.Expected[T]](ctx, c, name, args)
	if err == nil && r.Err != 0 {
		err = errcode.New(errcode.Code(r.Err), "%s: the master answered %v", name, errcode.Code(r.Err))
	}
	return r.Value, err
}

// connect returns the connection and its address, dialling the master
// again if the connection broke.
func (c *Client) connect(ctx context.Context) (*cororpc.Client, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil || c.conn.Err() != nil {
		if err := c.dial(ctx, c.addr == ""); err != nil {
			return nil, "", err
		}
	}
	return c.conn, c.addr, nil
}

// SwitchMaster looks the master up again and connects to it, as a client
// does when its master stops answering.
func (c *Client) SwitchMaster(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dial(ctx, true)
}

// LastDial is how the last connection to the master was made, or failed.
func (c *Client) LastDial() Dial {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// dial replaces the connection with a new one to the master, looked up
// first if lookUp. c.mu is held.
func (c *Client) dial(ctx context.Context, lookUp bool) (err error) {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	c.last = Dial{At: time.Now()}
	defer func() {
		if err != nil {
			c.last.Err = err.Error()
		}
	}()
	if lookUp {
		addr, err := c.resolve(ctx)
		c.last.LookUp = time.Since(c.last.At)
		if err != nil {
			return fmt.Errorf("looking up the master: %w", err)
		}
		c.addr = addr
	}
	c.last.Addr = c.addr
	dctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	t0 := time.Now()
	conn, err := cororpc.Dial(dctx, c.addr, 0)
	c.last.Dial = time.Since(t0)
	if err != nil {
		return err
	}
	c.conn = conn
	return nil
}
