package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/moonraft/moonraft/errcode"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// permanent is an attempt's error that ends the call as it is.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }

// attemptFunc makes one attempt of a call on one endpoint; the call option
// records whether the request reached a server. It returns the server's
// answer, or the gRPC error.
type attemptFunc func(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption) (*moonraftpb.Status, error)

// retryMode says how do retries a call.
type retryMode struct {
	// idempotent: a request that may have reached a server (and been
	// applied) may be sent again.
	idempotent bool
	// onePass: give up once every known endpoint has been tried without an
	// answer, at once, instead of backing off and going round again
	// (TOO_MANY_REQUESTS is still retried after a backoff). A
	// Keeper's ping is tried again at its next round anyway; thousands of
	// clients backing off through an election would all come back within
	// the same few hundred milliseconds, on the new leader.
	onePass bool
}

// do runs attempt until an answer is final, following NOT_LEADER at once
// and backing off on anything retryable, until ctx is done (or, onePass,
// until every endpoint has been tried); it then returns the last error.
func (c *Client) do(ctx context.Context, mode retryMode, attempt attemptFunc) error {
	delay := firstBackoff
	var last error
	// The leaders this call was redirected to at once: each only once, so
	// that nodes naming each other do not loop without a backoff.
	var followed []string
	for tried := 1; ; tried++ {
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
			st, err = c.watched(ctx, ep, moonraftpb.NewMasterClient(cc), grpc.Peer(&p), attempt)
			if err != nil && moonraftpb.DetailStatus(err) != nil {
				st, err = moonraftpb.DetailStatus(err), nil
			}
			if err != nil {
				if perm, ok := errors.AsType[permanent](err); ok {
					return perm.err
				}
				rerr, retry := c.rpcError(ep, err, p.Addr != nil, mode.idempotent)
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
			err := moonraftpb.ErrorOf(st)
			switch errcode.Of(err) {
			case errcode.OK:
				return nil
			case errcode.NotLeader:
				last = err
				if addr := st.GetLeaderGrpcAddr(); addr != "" && addr != ep && c.follow(addr) {
					if !slices.Contains(followed, addr) {
						followed = append(followed, addr)
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
		// A refusal for this client's own calls in flight is no election:
		// it backs off and retries, one pass or not.
		if mode.onePass && errcode.Of(last) != errcode.TooManyRequests {
			if tried >= len(c.Endpoints()) {
				return last
			}
			continue
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
	if st := moonraftpb.DetailStatus(err); st != nil {
		return moonraftpb.ErrorOf(st), st.GetRetryable()
	}
	s := status.Convert(err)
	moved := errors.Is(err, errLeaderMoved)
	switch {
	case !sent:
		return errcode.New(errcode.UnavailableInCurrentStatus, "cannot reach %s: %s", ep, s.Message()), true
	case moved && !idempotent:
		return errcode.New(errcode.OutcomeUnknown,
			"outcome unknown: %v, so the request may have been applied; check with GetReplicaList/ExistKey before retrying", err), false
	case moved:
		return errcode.New(errcode.UnavailableInCurrentStatus, "%v", err), true
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

type response interface {
	proto.Message
	GetStatus() *moonraftpb.Status
}

// call is do for a unary RPC: rpc is a method expression of
// moonraftpb.MasterClient, such as moonraftpb.MasterClient.PutStart.
func call[Req proto.Message, Resp response](ctx context.Context, c *Client, idempotent bool,
	rpc func(moonraftpb.MasterClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req,
) (Resp, error) {
	return callIn(ctx, c, retryMode{idempotent: idempotent}, rpc, req)
}

// callIn is call retried as mode says.
func callIn[Req proto.Message, Resp response](ctx context.Context, c *Client, mode retryMode,
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
	err = c.do(ctx, mode, func(ctx context.Context, mc moonraftpb.MasterClient, sent grpc.CallOption) (*moonraftpb.Status, error) {
		r, err := rpc(mc, ctx, req, sent)
		if err != nil {
			return nil, err
		}
		resp = r
		return r.GetStatus(), nil
	})
	return resp, err
}
