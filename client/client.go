package client

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/moonraft/moonraft/errcode"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	firstBackoff          = 20 * time.Millisecond
	defaultMaxBackoff     = time.Second
	defaultConnectTimeout = 2 * time.Second
)

// Config configures a Client.
type Config struct {
	// Endpoints are the gRPC addresses (host:port) of the masters. Leaders
	// named by NOT_LEADER answers are added as they are learnt.
	Endpoints []string
	// DialOptions are added after the defaults (insecure credentials,
	// MaxMessageBytes each way, reconnect backoff capped at 1 s), so they may
	// override them, e.g. with TLS credentials.
	DialOptions []grpc.DialOption
	// MaxBackoff caps the wait between retries (default 1 s).
	MaxBackoff time.Duration
	// ConnectTimeout bounds the wait for a connection to one endpoint before
	// the next one is tried (default 2 s), so an unreachable node that drops
	// packets cannot hold a call until its deadline.
	ConnectTimeout time.Duration
	// TLS, if set, secures every connection (transport.TLSFiles.ClientConfig builds
	// one); nil is plaintext. DialOptions may still override it.
	TLS *tls.Config
	// AdminToken is sent with admin RPCs (moonraftpb.AdminMethod) as
	// "authorization: Bearer <token>"; data RPCs never carry it.
	AdminToken string
	// LeaderCheckAfter is how long a call waits at one endpoint before the
	// client asks every endpoint for its status (default 400 ms; negative:
	// never). Once the endpoint does not answer and another serves as the
	// leader, the call is ended as if its connection had failed after it
	// was sent (see the package doc): a leader that died or stopped answers
	// nothing.
	LeaderCheckAfter time.Duration
	// MaxMessageBytes caps a request (default moonraftpb.MaxMessageBytes, at
	// least moonraftpb.MinMessageBytes); a larger one fails with INVALID_PARAMS before it is
	// sent. Answers may be up to four times as large.
	MaxMessageBytes int
}

// Client calls a moonraft cluster: it finds the leader, follows NOT_LEADER
// answers and retries what is safe to retry (see the package doc).
type Client struct {
	maxBackoff, connectTimeout, checkAfter time.Duration
	dialOpts                               []grpc.DialOption
	maxSend, maxRecv                       int

	mu        sync.Mutex
	endpoints []string
	conns     map[string]*grpc.ClientConn
	current   string // the endpoint tried first: the last known leader
	closed    bool
	checks    map[string]*leaderCheck // by the endpoint that does not answer
}

// Dial returns a Client for cfg. It does not connect: connections are made
// on first use, so Dial succeeds while the cluster is down.
func Dial(cfg Config) (*Client, error) {
	c := &Client{
		maxBackoff:     cfg.MaxBackoff,
		connectTimeout: cfg.ConnectTimeout,
		checkAfter:     cfg.LeaderCheckAfter,
		conns:          map[string]*grpc.ClientConn{},
		checks:         map[string]*leaderCheck{},
	}
	if c.checkAfter == 0 {
		c.checkAfter = defaultLeaderCheckAfter
	}
	if c.maxBackoff <= 0 {
		c.maxBackoff = defaultMaxBackoff
	}
	if c.connectTimeout <= 0 {
		c.connectTimeout = defaultConnectTimeout
	}
	c.maxSend = cfg.MaxMessageBytes
	if c.maxSend <= 0 {
		c.maxSend = moonraftpb.MaxMessageBytes
	}
	if c.maxSend < moonraftpb.MinMessageBytes {
		return nil, errcode.New(errcode.InvalidParams, "client message limit %d is below the minimum of %d bytes", c.maxSend, moonraftpb.MinMessageBytes)
	}
	c.maxRecv = 4 * c.maxSend
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	c.dialOpts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(c.maxRecv), grpc.MaxCallSendMsgSize(c.maxSend)),
		grpc.WithChainUnaryInterceptor(tokenUnary(cfg.AdminToken)),
		grpc.WithChainStreamInterceptor(tokenStream(cfg.AdminToken)),
		// gRPC's default reconnect backoff grows to 2 minutes; a restarted
		// master should be found again within a second.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: c.connectTimeout,
		}),
	}, cfg.DialOptions...)
	for _, ep := range cfg.Endpoints {
		if ep == "" || slices.Contains(c.endpoints, ep) {
			continue
		}
		if _, err := c.connLocked(ep); err != nil {
			_ = c.Close()
			return nil, err
		}
		c.endpoints = append(c.endpoints, ep)
	}
	if len(c.endpoints) == 0 {
		return nil, errcode.New(errcode.InvalidParams, "no endpoints: give at least one master address")
	}
	c.current = c.endpoints[0]
	return c, nil
}

// Close closes every connection; calls in flight fail.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for ep, cc := range c.conns {
		errs = append(errs, cc.Close())
		delete(c.conns, ep)
	}
	return errors.Join(errs...)
}

// Endpoints returns the known endpoints, learnt leaders included.
func (c *Client) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.endpoints)
}

func (c *Client) connLocked(ep string) (*grpc.ClientConn, error) {
	if cc, ok := c.conns[ep]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(ep, c.dialOpts...)
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "endpoint %q: %v", ep, err)
	}
	c.conns[ep] = cc
	return cc, nil
}

func (c *Client) conn(ep string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errcode.New(errcode.InvalidParams, "client is closed")
	}
	return c.connLocked(ep)
}

// follow makes addr, named by a NOT_LEADER answer, the endpoint tried
// first, and reports whether it did: not when addr's connection has failed.
// For half a heartbeat timeout after a leader dies its followers still name
// it; a call sent there would only fail and back off.
func (c *Client) follow(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.downLocked(addr) {
		return false
	}
	if !slices.Contains(c.endpoints, addr) {
		c.endpoints = append(c.endpoints, addr)
	}
	c.current = addr
	return true
}

// skip moves on from ep to the next endpoint whose connection has not
// failed, ep itself if every other one's has (to the next one if ep's has
// too), unless another call has already moved on.
func (c *Client) skip(ep string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current != ep {
		return
	}
	i := slices.Index(c.endpoints, ep)
	c.current = c.endpoints[(i+1)%len(c.endpoints)]
	for k := 1; k <= len(c.endpoints); k++ {
		if next := c.endpoints[(i+k)%len(c.endpoints)]; !c.downLocked(next) {
			c.current = next
			return
		}
	}
}

// downLocked reports whether ep's connection has failed and gRPC waits to
// connect again: a dead or unreachable node.
func (c *Client) downLocked(ep string) bool {
	cc, ok := c.conns[ep]
	return ok && cc.GetState() == connectivity.TransientFailure
}

func (c *Client) pick() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current
}

// ready waits until cc is connected, has failed to connect, or
// connectTimeout has passed (false). A failed connection is reported ready:
// the RPC then fails at once with the connection's error, unsent.
func (c *Client) ready(ctx context.Context, cc *grpc.ClientConn) bool {
	ctx, cancel := context.WithTimeout(ctx, c.connectTimeout)
	defer cancel()
	for {
		s := cc.GetState()
		switch s {
		case connectivity.Ready, connectivity.TransientFailure, connectivity.Shutdown:
			return true
		case connectivity.Idle:
			cc.Connect()
		}
		if !cc.WaitForStateChange(ctx, s) {
			return false
		}
	}
}
