package cororpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// Client is one connection to a coro_rpc server on which calls run
// concurrently, matched to their answers by sequence number.
type Client struct {
	conn    net.Conn
	msgType uint8

	mu      sync.Mutex // guards the fields below and orders writes
	w       *bufio.Writer
	seq     uint32
	pending map[uint32]chan Response
	err     error // set once the connection failed; every call fails then
}

// Dial connects to addr; every request carries msgType (0, or
// MsgForwarded).
func Dial(ctx context.Context, addr string, msgType uint8) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &Client{conn: conn, msgType: msgType, w: bufio.NewWriter(conn), pending: map[uint32]chan Response{}}
	go c.readLoop()
	return c, nil
}

func (c *Client) readLoop() {
	r := bufio.NewReader(c.conn)
	for {
		resp, err := ReadResponse(r)
		if err != nil {
			c.fail(fmt.Errorf("cororpc: connection to %s: %w", c.conn.RemoteAddr(), err))
			return
		}
		c.mu.Lock()
		ch, ok := c.pending[resp.Header.Seq]
		delete(c.pending, resp.Header.Seq)
		c.mu.Unlock()
		if ok {
			ch <- resp
		}
	}
}

// fail ends the connection: pending and later calls get err.
func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		c.conn.Close()
	}
	for seq, ch := range c.pending {
		close(ch)
		delete(c.pending, seq)
	}
}

// ErrClosed is the error of calls on a client whose connection ended.
var ErrClosed = errors.New("cororpc: connection closed")

// NotSentError is a call's error when its request never left: the server
// could not be dialled, or the connection was known broken before it. The
// call did not run, so it may be sent again anywhere.
type NotSentError struct{ Err error }

func (e *NotSentError) Error() string { return e.Err.Error() }
func (e *NotSentError) Unwrap() error { return e.Err }

// Call sends a request for function id and waits for its answer, or for
// ctx. An error means the outcome is unknown (the call may have run),
// unless it is a *NotSentError.
func (c *Client) Call(ctx context.Context, id uint32, body []byte) (Response, error) {
	ch := make(chan Response, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return Response{}, &NotSentError{c.err}
	}
	c.seq++
	seq := c.seq
	c.pending[seq] = ch
	_, err := c.w.Write(AppendRequest(nil, Request{Header: ReqHeader{Seq: seq, FunctionID: id, MsgType: c.msgType}, Body: body}))
	if err == nil {
		err = c.w.Flush()
	}
	c.mu.Unlock()
	if err != nil {
		c.fail(err)
		return Response{}, err
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			if err := c.Err(); err != nil {
				return Response{}, err
			}
			return Response{}, ErrClosed
		}
		return resp, nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, seq)
		c.mu.Unlock()
		return Response{}, ctx.Err()
	}
}

// Err returns why the connection failed, or nil while it works.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	return nil
}

// Pool keeps one Client per address, dialled on first use and again after
// its connection fails.
type Pool struct {
	MsgType uint8 // of every request
	mu      sync.Mutex
	clients map[string]*Client
}

// Call calls id at addr.
func (p *Pool) Call(ctx context.Context, addr string, id uint32, body []byte) (Response, error) {
	c, err := p.client(ctx, addr)
	if err != nil {
		return Response{}, &NotSentError{err}
	}
	resp, err := c.Call(ctx, id, body)
	if err != nil && c.Err() != nil {
		p.mu.Lock()
		if p.clients[addr] == c {
			delete(p.clients, addr)
		}
		p.mu.Unlock()
	}
	return resp, err
}

func (p *Pool) client(ctx context.Context, addr string) (*Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[addr]; ok {
		return c, nil
	}
	c, err := Dial(ctx, addr, p.MsgType)
	if err != nil {
		return nil, err
	}
	if p.clients == nil {
		p.clients = map[string]*Client{}
	}
	p.clients[addr] = c
	return c, nil
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.clients {
		c.Close()
		delete(p.clients, addr)
	}
}
