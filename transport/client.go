package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const (
	firstBackoff          = 20 * time.Millisecond
	defaultMaxBackoff     = time.Second
	defaultConnectTimeout = 2 * time.Second
)

// ClientConfig configures a Client.
type ClientConfig struct {
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
	// TLS, if set, secures every connection (TLSFiles.ClientConfig builds
	// one); nil is plaintext. DialOptions may still override it.
	TLS *tls.Config
	// AdminToken is sent with admin RPCs (AdminMethod) as
	// "authorization: Bearer <token>"; data RPCs never carry it.
	AdminToken string
	// MaxMessageBytes caps a request (default MaxMessageBytes, at least
	// MinMessageBytes); a larger one fails with INVALID_PARAMS before it is
	// sent. Answers may be up to four times as large.
	MaxMessageBytes int
}

// Client calls a moonraft cluster: it finds the leader, follows NOT_LEADER
// answers and retries what is safe to retry (see the package doc).
type Client struct {
	maxBackoff, connectTimeout time.Duration
	dialOpts                   []grpc.DialOption
	maxSend, maxRecv           int

	mu        sync.Mutex
	endpoints []string
	conns     map[string]*grpc.ClientConn
	current   string // the endpoint tried first: the last known leader
	closed    bool
}

// Dial returns a Client for cfg. It does not connect: connections are made
// on first use, so Dial succeeds while the cluster is down.
func Dial(cfg ClientConfig) (*Client, error) {
	c := &Client{
		maxBackoff:     cfg.MaxBackoff,
		connectTimeout: cfg.ConnectTimeout,
		conns:          map[string]*grpc.ClientConn{},
	}
	if c.maxBackoff <= 0 {
		c.maxBackoff = defaultMaxBackoff
	}
	if c.connectTimeout <= 0 {
		c.connectTimeout = defaultConnectTimeout
	}
	c.maxSend = cfg.MaxMessageBytes
	if c.maxSend <= 0 {
		c.maxSend = MaxMessageBytes
	}
	if c.maxSend < MinMessageBytes {
		return nil, errcode.New(errcode.InvalidParams, "client message limit %d is below the minimum of %d bytes", c.maxSend, MinMessageBytes)
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

// follow makes addr, named by a NOT_LEADER answer, the endpoint tried first.
func (c *Client) follow(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.endpoints, addr) {
		c.endpoints = append(c.endpoints, addr)
	}
	c.current = addr
}

// skip moves on from ep to the next endpoint, unless another call has
// already moved on.
func (c *Client) skip(ep string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current == ep {
		i := slices.Index(c.endpoints, ep)
		c.current = c.endpoints[(i+1)%len(c.endpoints)]
	}
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

// permanent is an attempt's error that ends the call as it is.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }

// attemptFunc makes one attempt of a call on one endpoint; the call option
// records whether the request reached a server. It returns the server's
// answer, or the gRPC error.
type attemptFunc func(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption) (*moonraftpb.Status, error)

// do runs attempt until an answer is final, following NOT_LEADER at once
// and backing off on anything retryable, until ctx is done; it then returns
// the last error. idempotent says whether a request that may have reached a
// server (and been applied) may be sent again.
func (c *Client) do(ctx context.Context, idempotent bool, attempt attemptFunc) error {
	delay := firstBackoff
	var last error
	redirected := false
	for {
		if err := ctx.Err(); err != nil {
			return expired(ctx, last)
		}
		ep := c.pick()
		cc, err := c.conn(ep)
		if err != nil {
			return err
		}
		var st *moonraftpb.Status
		if c.ready(ctx, cc) {
			var p peer.Peer
			st, err = attempt(ctx, moonraftpb.NewMasterClient(cc), grpc.Peer(&p))
			if err != nil && detailStatus(err) != nil {
				st, err = detailStatus(err), nil
			}
			if err != nil {
				if perm, ok := errors.AsType[permanent](err); ok {
					return perm.err
				}
				rerr, retry := c.rpcError(ep, err, p.Addr != nil, idempotent)
				if retry && last != nil && (ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded) {
					// The call's deadline cut a retry short: the answer
					// before it says why the call failed, the cut does not.
					rerr = last
				}
				if !retry || ctx.Err() != nil {
					if ctx.Err() != nil && p.Addr != nil {
						// ep took the request and gave no answer in the call's
						// whole time: it may be paused (a stopped process
						// still accepts connections). The next call starts
						// at another node, which redirects it back if ep
						// still leads.
						c.skip(ep)
					}
					return rerr
				}
				last = rerr
			}
		} else if ctx.Err() == nil {
			last = errcode.New(errcode.UnavailableInCurrentStatus, "no connection to %s within %v", ep, c.connectTimeout)
		}
		if st != nil {
			err := errorOf(st)
			switch errcode.Of(err) {
			case errcode.OK:
				return nil
			case errcode.NotLeader:
				last = err
				if addr := st.GetLeaderGrpcAddr(); addr != "" && addr != ep {
					c.follow(addr)
					if !redirected {
						redirected = true
						continue
					}
				} else {
					c.skip(ep)
				}
			case errcode.UnavailableInCurrentStatus:
				last = err
				c.skip(ep)
			case errcode.TooManyRequests:
				// Not applied, and the same node is the one to ask again,
				// once this client's earlier calls have finished.
				last = err
			default:
				return err
			}
		} else {
			c.skip(ep)
		}
		// Jitter over the upper half of the delay, so clients that lost the same
		// leader do not all come back at once.
		d := delay/2 + rand.N(delay/2+1)
		select {
		case <-ctx.Done():
			return expired(ctx, last)
		case <-time.After(d):
		}
		delay = min(2*delay, c.maxBackoff)
	}
}

func expired(ctx context.Context, last error) error {
	if last != nil {
		return last
	}
	return errcode.New(errcode.UnavailableInCurrentStatus, "%v before any master answered", ctx.Err())
}

// rpcError turns a gRPC error from ep into an *errcode.Error and says
// whether the call may be retried. sent says whether the request got onto a
// connection: a request that did not was certainly not applied.
func (c *Client) rpcError(ep string, err error, sent, idempotent bool) (error, bool) {
	if st := detailStatus(err); st != nil {
		return errorOf(st), st.GetRetryable()
	}
	s := status.Convert(err)
	switch {
	case !sent:
		return errcode.New(errcode.UnavailableInCurrentStatus, "cannot reach %s: %s", ep, s.Message()), true
	case c.refusedForSize(s):
		return errcode.New(errcode.InvalidParams, "%s refused the request: it is over the server's message size limit (%s); it was not applied", ep, s.Message()), false
	case !idempotent:
		return errcode.New(errcode.OutcomeUnknown,
			"outcome unknown: the request reached %s but its answer was lost (%s: %s), so it may have been applied; check with GetReplicaList/ExistKey before retrying",
			ep, s.Code(), s.Message()), false
	}
	switch s.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return errcode.New(errcode.UnavailableInCurrentStatus, "%s: %s: %s", ep, s.Code(), s.Message()), true
	case codes.ResourceExhausted:
		return errcode.New(errcode.InvalidParams, "%s: message over the size limit: %s", ep, s.Message()), false
	}
	return errcode.New(errcode.InternalError, "%s: %s: %s", ep, s.Code(), s.Message()), false
}

// recvTooLarge matches gRPC's refusal of a message over a receive limit:
// "grpc: received message larger than max (N vs. M)".
var recvTooLarge = regexp.MustCompile(`received message larger than max \((\d+) vs\. (\d+)\)`)

// refusedForSize reports whether s is the server refusing the request for
// its size, before decoding (so before applying) it. The same words come
// from this client refusing an answer over its own limit, which says
// nothing about the request; that one names this client's limit, M, which
// is never the server's default (answers may be four times a request).
func (c *Client) refusedForSize(s *status.Status) bool {
	if s.Code() != codes.ResourceExhausted {
		return false
	}
	m := recvTooLarge.FindStringSubmatch(s.Message())
	return m != nil && m[2] != strconv.Itoa(c.maxRecv)
}

// detailStatus is the Status a server put in the details of a gRPC error
// (a failed stream), or nil.
func detailStatus(err error) *moonraftpb.Status {
	for _, d := range status.Convert(err).Details() {
		if st, ok := d.(*moonraftpb.Status); ok {
			return st
		}
	}
	return nil
}

type response interface {
	proto.Message
	GetStatus() *moonraftpb.Status
}

// call is do for a unary RPC: rpc is a method expression of
// moonraftpb.MasterClient, such as moonraftpb.MasterClient.PutStart.
func call[Req proto.Message, Resp response](ctx context.Context, c *Client, idempotent bool,
	rpc func(moonraftpb.MasterClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req,
) (Resp, error) {
	var resp Resp
	// Checked here, not left to gRPC: gRPC fails an unencodable or
	// oversized request only after opening its stream, which looks like a
	// request that may have been sent.
	b, err := proto.MarshalOptions{}.Marshal(req)
	if err != nil {
		return resp, errcode.New(errcode.InvalidParams, "request cannot be encoded: %v", err)
	}
	if len(b) > c.maxSend {
		return resp, errcode.New(errcode.InvalidParams, "request is %d bytes, over the %d-byte message limit", len(b), c.maxSend)
	}
	err = c.do(ctx, idempotent, func(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption) (*moonraftpb.Status, error) {
		r, err := rpc(mc, ctx, req, sent)
		if err != nil {
			return nil, err
		}
		resp = r
		return r.GetStatus(), nil
	})
	return resp, err
}

// ReplicateConfig says how a put is replicated.
type ReplicateConfig struct {
	ReplicaNum       uint32
	SoftPin          bool
	PreferredSegment string // a segment name; "" for any
}

func (r ReplicateConfig) pb() *moonraftpb.ReplicateConfig {
	return &moonraftpb.ReplicateConfig{ReplicaNum: r.ReplicaNum, WithSoftPin: r.SoftPin, PreferredSegment: r.PreferredSegment}
}

// KeyReplicas is one key found by GetReplicaListByRegex.
type KeyReplicas struct {
	Key          string
	Replicas     []oplog.ReplicaDesc
	LeaseUntilMs int64
}

// ExistResult is one answer of BatchExistKey.
type ExistResult struct {
	Exists       bool
	LeaseUntilMs int64
	Err          error
}

// ReplicaListResult is one answer of BatchGetReplicaList.
type ReplicaListResult struct {
	Replicas     []oplog.ReplicaDesc
	LeaseUntilMs int64
	Err          error
}

// PutStartItem is one put of BatchPutStart.
type PutStartItem struct {
	Key          string
	SliceLengths []uint64
	Config       ReplicateConfig
	ClientID     string
}

// PutStartResult is one answer of BatchPutStart.
type PutStartResult struct {
	Replicas []oplog.ReplicaDesc
	Err      error
}

// ExistKey reports whether key has a complete replica and the read lease granted.
func (c *Client) ExistKey(ctx context.Context, key string) (bool, int64, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.ExistKey, &moonraftpb.ExistKeyRequest{Key: key})
	if err != nil {
		return false, 0, err
	}
	return r.GetExists(), r.GetLeaseUntilMs(), nil
}

// GetReplicaList returns where key's replicas are and the read lease granted.
func (c *Client) GetReplicaList(ctx context.Context, key string) ([]oplog.ReplicaDesc, int64, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.GetReplicaList, &moonraftpb.GetReplicaListRequest{Key: key})
	if err != nil {
		return nil, 0, err
	}
	return replicasFromPB(r.GetReplicas()), r.GetLeaseUntilMs(), nil
}

// GetReplicaListByRegex returns every complete object whose key matches re (RE2), by key.
func (c *Client) GetReplicaListByRegex(ctx context.Context, re string) ([]KeyReplicas, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.GetReplicaListByRegex, &moonraftpb.GetReplicaListByRegexRequest{Regex: re})
	if err != nil {
		return nil, err
	}
	out := make([]KeyReplicas, len(r.GetObjects()))
	for i, o := range r.GetObjects() {
		out[i] = KeyReplicas{Key: o.GetKey(), Replicas: replicasFromPB(o.GetReplicas()), LeaseUntilMs: o.GetLeaseUntilMs()}
	}
	return out, nil
}

// BatchExistKey is ExistKey for many keys: one result per key, in order.
// The error is for the batch as a whole.
func (c *Client) BatchExistKey(ctx context.Context, keys []string) ([]ExistResult, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.BatchExistKey, &moonraftpb.BatchExistKeyRequest{Keys: keys})
	if err != nil {
		return nil, err
	}
	if err := checkCount(len(r.GetResults()), len(keys)); err != nil {
		return nil, err
	}
	out := make([]ExistResult, len(keys))
	for i, it := range r.GetResults() {
		out[i] = ExistResult{Exists: it.GetExists(), LeaseUntilMs: it.GetLeaseUntilMs(), Err: errorOf(it.GetStatus())}
	}
	return out, nil
}

// BatchGetReplicaList is GetReplicaList for many keys: one result per key,
// in order. The error is for the batch as a whole.
func (c *Client) BatchGetReplicaList(ctx context.Context, keys []string) ([]ReplicaListResult, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.BatchGetReplicaList, &moonraftpb.BatchGetReplicaListRequest{Keys: keys})
	if err != nil {
		return nil, err
	}
	if err := checkCount(len(r.GetResults()), len(keys)); err != nil {
		return nil, err
	}
	out := make([]ReplicaListResult, len(keys))
	for i, it := range r.GetResults() {
		out[i] = ReplicaListResult{Replicas: replicasFromPB(it.GetReplicas()), LeaseUntilMs: it.GetLeaseUntilMs(), Err: errorOf(it.GetStatus())}
	}
	return out, nil
}

// PutStart allocates the replicas of a new object. It is never resent once
// it may have reached the leader: a lost answer is OUTCOME_UNKNOWN.
func (c *Client) PutStart(ctx context.Context, key string, sliceLengths []uint64, cfg ReplicateConfig, clientID string) ([]oplog.ReplicaDesc, error) {
	return c.start(ctx, moonraftpb.MasterClient.PutStart, PutStartItem{key, sliceLengths, cfg, clientID})
}

// UpsertStart puts key if absent and overwrites it if present (rules in
// docs/STATE_MACHINE.md). Like PutStart it is never resent once it may have
// reached the leader: a lost answer is OUTCOME_UNKNOWN.
func (c *Client) UpsertStart(ctx context.Context, key string, sliceLengths []uint64, cfg ReplicateConfig, clientID string) ([]oplog.ReplicaDesc, error) {
	return c.start(ctx, moonraftpb.MasterClient.UpsertStart, PutStartItem{key, sliceLengths, cfg, clientID})
}

type startRPC = func(moonraftpb.MasterClient, context.Context, *moonraftpb.PutStartRequest, ...grpc.CallOption) (*moonraftpb.PutStartResponse, error)

func (c *Client) start(ctx context.Context, rpc startRPC, it PutStartItem) ([]oplog.ReplicaDesc, error) {
	r, err := call(ctx, c, false, rpc, it.pb())
	if err != nil {
		return nil, err
	}
	return replicasFromPB(r.GetReplicas()), nil
}

func (it PutStartItem) pb() *moonraftpb.PutStartRequest {
	return &moonraftpb.PutStartRequest{Key: it.Key, SliceLengths: it.SliceLengths, Config: it.Config.pb(), ClientId: it.ClientID}
}

// PutEnd completes a put; retried freely, since completing a complete
// object again is OK.
func (c *Client) PutEnd(ctx context.Context, key, clientID string) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.PutEnd, &moonraftpb.PutEndRequest{Key: key, ClientId: clientID})
	return err
}

// PutRevoke abandons a put (not resent: a second one would find nothing).
func (c *Client) PutRevoke(ctx context.Context, key, clientID string) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.PutRevoke, &moonraftpb.PutRevokeRequest{Key: key, ClientId: clientID})
	return err
}

// BatchPutStart is PutStart for many objects: one result per item, in
// order. The error is for the batch as a whole.
func (c *Client) BatchPutStart(ctx context.Context, items []PutStartItem) ([]PutStartResult, error) {
	return c.batchStart(ctx, moonraftpb.MasterClient.BatchPutStart, items)
}

// BatchUpsertStart is UpsertStart for many objects, one log entry: one
// result per item, in order. The error is for the batch as a whole.
func (c *Client) BatchUpsertStart(ctx context.Context, items []PutStartItem) ([]PutStartResult, error) {
	return c.batchStart(ctx, moonraftpb.MasterClient.BatchUpsertStart, items)
}

type batchStartRPC = func(moonraftpb.MasterClient, context.Context, *moonraftpb.BatchPutStartRequest, ...grpc.CallOption) (*moonraftpb.BatchPutStartResponse, error)

func (c *Client) batchStart(ctx context.Context, rpc batchStartRPC, items []PutStartItem) ([]PutStartResult, error) {
	req := &moonraftpb.BatchPutStartRequest{Items: make([]*moonraftpb.PutStartRequest, len(items))}
	for i, it := range items {
		req.Items[i] = it.pb()
	}
	r, err := call(ctx, c, false, rpc, req)
	if err != nil {
		return nil, err
	}
	if err := checkCount(len(r.GetResults()), len(items)); err != nil {
		return nil, err
	}
	out := make([]PutStartResult, len(items))
	for i, it := range r.GetResults() {
		out[i] = PutStartResult{Replicas: replicasFromPB(it.GetReplicas()), Err: errorOf(it.GetStatus())}
	}
	return out, nil
}

// BatchPutEnd is PutEnd for many keys of one client: one error per key.
func (c *Client) BatchPutEnd(ctx context.Context, clientID string, keys []string) ([]error, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.BatchPutEnd, &moonraftpb.BatchPutEndRequest{Keys: keys, ClientId: clientID})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// BatchPutRevoke is PutRevoke for many keys of one client: one error per key.
func (c *Client) BatchPutRevoke(ctx context.Context, clientID string, keys []string) ([]error, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.BatchPutRevoke, &moonraftpb.BatchPutRevokeRequest{Keys: keys, ClientId: clientID})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// UpsertEnd completes an upsert; retried freely, as PutEnd is.
func (c *Client) UpsertEnd(ctx context.Context, key, clientID string) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.UpsertEnd, &moonraftpb.PutEndRequest{Key: key, ClientId: clientID})
	return err
}

// UpsertRevoke abandons an upsert: the object goes, old value included.
// Not resent, as PutRevoke is not.
func (c *Client) UpsertRevoke(ctx context.Context, key, clientID string) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.UpsertRevoke, &moonraftpb.PutRevokeRequest{Key: key, ClientId: clientID})
	return err
}

// BatchUpsertEnd is UpsertEnd for many keys of one client: one error per key.
func (c *Client) BatchUpsertEnd(ctx context.Context, clientID string, keys []string) ([]error, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.BatchUpsertEnd, &moonraftpb.BatchPutEndRequest{Keys: keys, ClientId: clientID})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// BatchUpsertRevoke is UpsertRevoke for many keys of one client: one error per key.
func (c *Client) BatchUpsertRevoke(ctx context.Context, clientID string, keys []string) ([]error, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.BatchUpsertRevoke, &moonraftpb.BatchPutRevokeRequest{Keys: keys, ClientId: clientID})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// BatchRemove is Remove for many keys, one log entry: one error per key.
// Not resent: a second one would find the removed keys gone.
func (c *Client) BatchRemove(ctx context.Context, keys []string, force bool) ([]error, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.BatchRemove, &moonraftpb.BatchRemoveRequest{Keys: keys, Force: force})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// Remove deletes key; force ignores its read lease.
func (c *Client) Remove(ctx context.Context, key string, force bool) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.Remove, &moonraftpb.RemoveRequest{Key: key, Force: force})
	return err
}

// RemoveByRegex deletes the objects whose key matches re and says how many.
func (c *Client) RemoveByRegex(ctx context.Context, re string, force bool) (uint64, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.RemoveByRegex, &moonraftpb.RemoveByRegexRequest{Regex: re, Force: force})
	return r.GetRemoved(), err
}

// RemoveAll deletes every object and says how many.
func (c *Client) RemoveAll(ctx context.Context, force bool) (uint64, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.RemoveAll, &moonraftpb.RemoveAllRequest{Force: force})
	return r.GetRemoved(), err
}

// MountSegment registers a segment of clientID (idempotent).
func (c *Client) MountSegment(ctx context.Context, clientID string, seg fsm.SegmentSpec) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.MountSegment, &moonraftpb.MountSegmentRequest{ClientId: clientID, Segment: segmentToPB(seg)})
	return err
}

// ReMountSegment re-registers all of clientID's segments after NEED_REMOUNT.
func (c *Client) ReMountSegment(ctx context.Context, clientID string, segs []fsm.SegmentSpec) error {
	req := &moonraftpb.ReMountSegmentRequest{ClientId: clientID, Segments: make([]*moonraftpb.Segment, len(segs))}
	for i, s := range segs {
		req.Segments[i] = segmentToPB(s)
	}
	_, err := call(ctx, c, true, moonraftpb.MasterClient.ReMountSegment, req)
	return err
}

// UnmountSegment removes a segment and the replicas on it (not resent: a
// second one would find no segment).
func (c *Client) UnmountSegment(ctx context.Context, clientID, segmentID string) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.UnmountSegment, &moonraftpb.UnmountSegmentRequest{ClientId: clientID, SegmentId: segmentID})
	return err
}

// GracefulUnmountSegment stops allocations on clientID's segment at once
// and has it unmounted once nothing on it is leased or written, or after
// grace at the latest (0: the server's bound). Not resent: once the
// segment is gone a second one finds none.
func (c *Client) GracefulUnmountSegment(ctx context.Context, clientID, segmentID string, grace time.Duration) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.GracefulUnmountSegment, &moonraftpb.GracefulUnmountSegmentRequest{
		ClientId: clientID, SegmentId: segmentID, GracePeriodMs: grace.Milliseconds()})
	return err
}

// SegmentStatus is QuerySegmentStatus's answer.
type SegmentStatus struct {
	State        string // OK or GRACEFULLY_UNMOUNTING
	Segment      fsm.SegmentSpec
	ClientID     string
	UsedBytes    uint64
	Objects      uint64
	DrainUntilMs int64 // while GRACEFULLY_UNMOUNTING
}

// QuerySegmentStatus describes the segment named name, or, with byID, the
// segment with id name.
func (c *Client) QuerySegmentStatus(ctx context.Context, name string, byID bool) (SegmentStatus, error) {
	req := &moonraftpb.QuerySegmentStatusRequest{SegmentName: name}
	if byID {
		req = &moonraftpb.QuerySegmentStatusRequest{SegmentId: name}
	}
	r, err := call(ctx, c, true, moonraftpb.MasterClient.QuerySegmentStatus, req)
	if err != nil {
		return SegmentStatus{}, err
	}
	return segmentStateFromPB(r.GetSegment()), nil
}

// ListSegments describes every mounted segment, by id.
func (c *Client) ListSegments(ctx context.Context) ([]SegmentStatus, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.ListSegments, &moonraftpb.ListSegmentsRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]SegmentStatus, len(r.GetSegments()))
	for i, st := range r.GetSegments() {
		out[i] = segmentStateFromPB(st)
	}
	return out, nil
}

// ServiceReady returns the server's version once a node answers.
func (c *Client) ServiceReady(ctx context.Context) (string, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.ServiceReady, &moonraftpb.ServiceReadyRequest{})
	return r.GetVersion(), err
}

// PingResult is a Ping's answer.
type PingResult struct {
	// NeedRemount: the master has no session for the client; call
	// ReMountSegment (KeepAlive does).
	NeedRemount bool
	TTLMs       int64 // the session TTL
	// ViewVersion is the term the serving leader was promoted in: a new
	// value means a failover happened since the last ping.
	ViewVersion uint64
}

// Ping renews clientID's session.
func (c *Client) Ping(ctx context.Context, clientID string) (PingResult, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.Ping, &moonraftpb.PingRequest{ClientId: clientID})
	if err != nil {
		return PingResult{}, err
	}
	return PingResult{
		NeedRemount: r.GetClientStatus() == moonraftpb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT,
		TTLMs:       r.GetTtlMs(),
		ViewVersion: r.GetViewVersion(),
	}, nil
}

// Status asks one node, by its endpoint, for its status; no retry.
func (c *Client) Status(ctx context.Context, endpoint string) (*moonraftpb.NodeStatus, error) {
	return c.status(ctx, endpoint, false)
}

// Progress is Status without the digests, which cost the node a pass over
// its whole state: for polling applied indexes.
func (c *Client) Progress(ctx context.Context, endpoint string) (*moonraftpb.NodeStatus, error) {
	return c.status(ctx, endpoint, true)
}

func (c *Client) status(ctx context.Context, endpoint string, skipDigests bool) (*moonraftpb.NodeStatus, error) {
	cc, err := c.conn(endpoint)
	if err != nil {
		return nil, err
	}
	r, err := moonraftpb.NewMasterClient(cc).Status(ctx, &moonraftpb.StatusRequest{SkipDigests: skipDigests})
	if err != nil {
		e, _ := c.rpcError(endpoint, err, true, true)
		return nil, e
	}
	if err := errorOf(r.GetStatus()); err != nil {
		return nil, err
	}
	return r.GetNode(), nil
}

// StatusAll asks every known endpoint (Endpoints) for its status at once;
// the i-th status or error is the i-th endpoint's.
func (c *Client) StatusAll(ctx context.Context) ([]*moonraftpb.NodeStatus, []error) {
	eps := c.Endpoints()
	sts, errs := make([]*moonraftpb.NodeStatus, len(eps)), make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() { sts[i], errs[i] = c.Status(ctx, ep) })
	}
	wg.Wait()
	return sts, errs
}

// Members lists the Raft configuration.
func (c *Client) Members(ctx context.Context) ([]*moonraftpb.Member, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.Members, &moonraftpb.MembersRequest{})
	if err != nil {
		return nil, err
	}
	return r.GetMembers(), nil
}

// AddVoter adds server id at raftAddr as a voter and records its client
// address grpcAddr (if not ""); retried, since adding the same voter again
// leaves the configuration as it is.
func (c *Client) AddVoter(ctx context.Context, id, raftAddr, grpcAddr string) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.AddVoter, &moonraftpb.AddVoterRequest{Id: id, RaftAddr: raftAddr, GrpcAddr: grpcAddr})
	return err
}

// RemoveServer removes server id from the configuration; retried like AddVoter.
func (c *Client) RemoveServer(ctx context.Context, id string) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.RemoveServer, &moonraftpb.RemoveServerRequest{Id: id})
	return err
}

// TransferLeadership hands leadership to id ("" for any voter). Not resent:
// a second transfer would move leadership away from the new leader.
func (c *Client) TransferLeadership(ctx context.Context, id string) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.TransferLeadership, &moonraftpb.TransferLeadershipRequest{Id: id})
	return err
}

// SnapshotSave writes a fresh snapshot of the leader's state into w. It is
// retried (at the leader) only until the first byte reaches w.
func (c *Client) SnapshotSave(ctx context.Context, w io.Writer) error {
	return c.do(ctx, true, func(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption) (*moonraftpb.Status, error) {
		stream, err := mc.SnapshotSave(ctx, &moonraftpb.SnapshotSaveRequest{}, sent)
		if err != nil {
			return nil, err
		}
		written := false
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return statusOf(nil), nil
			}
			if err != nil {
				if written {
					e, _ := c.rpcError("the leader", err, true, true)
					return nil, permanent{e}
				}
				return nil, err
			}
			written = true
			if _, err := w.Write(chunk.GetData()); err != nil {
				return nil, permanent{errcode.New(errcode.FileWriteFail, "writing the snapshot: %v", err)}
			}
		}
	})
}

// SnapshotRestore uploads the snapshot read from r and restores the cluster
// from it. A restore that may have reached the leader is not resent
// (OUTCOME_UNKNOWN); one refused by a follower is resent to the leader only
// if r is an io.Seeker, rewound to where it started.
func (c *Client) SnapshotRestore(ctx context.Context, r io.Reader) error {
	seeker, _ := r.(io.Seeker)
	var start int64
	if seeker != nil {
		var err error
		if start, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			seeker = nil
		}
	}
	consumed := false
	var refused error
	return c.do(ctx, false, func(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption) (*moonraftpb.Status, error) {
		if consumed {
			if seeker == nil {
				return nil, permanent{errcode.New(errcode.InvalidParams,
					"the snapshot was refused (%v) and cannot be sent again: its reader cannot be rewound; pass an io.ReadSeeker such as an *os.File", refused)}
			}
			if _, err := seeker.Seek(start, io.SeekStart); err != nil {
				return nil, permanent{errcode.New(errcode.FileReadFail, "rewinding the snapshot: %v", err)}
			}
		}
		st, err := c.restoreOnce(ctx, mc, sent, r, &consumed)
		refused = err
		if st != nil {
			refused = errorOf(st)
		}
		return st, err
	})
}

func (c *Client) restoreOnce(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption, r io.Reader, consumed *bool) (*moonraftpb.Status, error) {
	// Cancelling the stream on a read error tells the server the upload is
	// incomplete, so it restores nothing.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := mc.SnapshotRestore(ctx, sent)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, SnapshotChunkBytes)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			*consumed = true
			// io.EOF here means the server has answered already (e.g.
			// NOT_LEADER): CloseAndRecv below returns its answer.
			if err := stream.Send(&moonraftpb.SnapshotChunk{Data: buf[:n]}); err != nil {
				break
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return nil, permanent{errcode.New(errcode.FileReadFail, "reading the snapshot: %v", rerr)}
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return resp.GetStatus(), nil
}

func checkCount(got, want int) error {
	if got != want {
		return errcode.New(errcode.InternalError, "the master answered %d results for %d items", got, want)
	}
	return nil
}

func itemErrors[R interface{ GetStatus() *moonraftpb.Status }](res []R, n int) ([]error, error) {
	if err := checkCount(len(res), n); err != nil {
		return nil, err
	}
	out := make([]error, n)
	for i, it := range res {
		out[i] = errorOf(it.GetStatus())
	}
	return out, nil
}
