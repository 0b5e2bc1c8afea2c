package transport

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/service"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// DefaultMaxInFlightPerClient is the default of Limits.MaxInFlightPerClient.
const DefaultMaxInFlightPerClient = 256

// Limits bound what one request, or one client, may ask of a server, so
// that going past them is a clear error rather than memory exhaustion.
// Zero fields take the defaults.
type Limits struct {
	// MaxMessageBytes caps one gRPC message each way (default
	// MaxMessageBytes, 16 MiB). gRPC refuses a larger request before
	// decoding it; the Go client reports INVALID_PARAMS.
	MaxMessageBytes int
	// MaxBatch is the most items one batch RPC may carry (default
	// MaxBatch, 10,000); more is INVALID_PARAMS.
	MaxBatch int
	// MaxRegexLen is the longest regex GetReplicaListByRegex and
	// RemoveByRegex take (default and upper bound fsm.MaxRegexLen);
	// longer is INVALID_PARAMS.
	MaxRegexLen int
	// MaxInFlightPerClient is how many requests one client may have in
	// progress on this node at once (default 256; negative: no cap). A
	// client is its client_id where the request has one, else its
	// connection's address. Past the cap: TOO_MANY_REQUESTS.
	MaxInFlightPerClient int
}

// WithDefaults fills zero fields with the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxMessageBytes == 0 {
		l.MaxMessageBytes = moonraftpb.MaxMessageBytes
	}
	if l.MaxBatch == 0 {
		l.MaxBatch = MaxBatch
	}
	if l.MaxRegexLen == 0 {
		l.MaxRegexLen = fsm.MaxRegexLen
	}
	if l.MaxInFlightPerClient == 0 {
		l.MaxInFlightPerClient = DefaultMaxInFlightPerClient
	}
	return l
}

// Validate reports a limit out of range (after WithDefaults).
func (l Limits) Validate() error {
	l = l.WithDefaults()
	switch {
	case l.MaxMessageBytes < moonraftpb.MinMessageBytes:
		return errcode.New(errcode.InvalidParams, "max message size %d is below the minimum of %d bytes (a snapshot chunk must fit)", l.MaxMessageBytes, moonraftpb.MinMessageBytes)
	case l.MaxBatch < 1:
		return errcode.New(errcode.InvalidParams, "max batch %d must be at least 1", l.MaxBatch)
	case l.MaxRegexLen < 1 || l.MaxRegexLen > fsm.MaxRegexLen:
		return errcode.New(errcode.InvalidParams, "max regex length %d must be within 1..%d", l.MaxRegexLen, fsm.MaxRegexLen)
	}
	return nil
}

// ServerConfig configures NewServer.
type ServerConfig struct {
	// Admin serves membership, leadership transfer and snapshots; nil (a
	// server with no Raft group behind it) answers them
	// UNAVAILABLE_IN_CURRENT_MODE.
	Admin  service.Admin
	Limits Limits
	// AdminToken, when set, must come with every admin RPC (AdminMethod)
	// as the metadata "authorization: Bearer <token>"; without it, or with
	// another, the call is refused with PERMISSION_DENIED. Data RPCs never
	// need it.
	AdminToken string
	// Observe, if set, is called after every RPC with its short method
	// name, the answer's code (an errcode name, or GRPC_<code> for a call
	// that failed in gRPC itself) and its duration (metrics).
	Observe func(method, code string, d time.Duration)
}

// tokenEqual compares in constant time (over digests, so the length of the
// configured token does not leak either).
func tokenEqual(got, want string) bool {
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// guard is the server side of auth, limits and metrics, as interceptors.
type guard struct {
	cfg      ServerConfig
	mu       sync.Mutex
	inFlight map[string]int
}

func newGuard(cfg ServerConfig) *guard {
	cfg.Limits = cfg.Limits.WithDefaults()
	return &guard{cfg: cfg, inFlight: map[string]int{}}
}

func (g *guard) authorize(ctx context.Context, method string) error {
	if g.cfg.AdminToken == "" || !moonraftpb.AdminMethod(method) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get(moonraftpb.AuthHeader) {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if ok && tokenEqual(strings.TrimSpace(tok), g.cfg.AdminToken) {
			return nil
		}
	}
	if len(md.Get(moonraftpb.AuthHeader)) == 0 {
		return errcode.New(errcode.PermissionDenied, "%s is an admin RPC and this node requires the admin token (moonctl --admin-token-file)", path.Base(method))
	}
	return errcode.New(errcode.PermissionDenied, "%s is an admin RPC and the admin token given is wrong", path.Base(method))
}

// acquire takes one in-flight slot of the caller, or refuses.
func (g *guard) acquire(ctx context.Context, req any) (release func(), err error) {
	max := g.cfg.Limits.MaxInFlightPerClient
	if max < 0 {
		return func() {}, nil
	}
	key, who := "", ""
	if r, ok := req.(interface{ GetClientId() string }); ok && r.GetClientId() != "" {
		key, who = "c:"+r.GetClientId(), "client "+r.GetClientId()
	} else if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		key, who = "a:"+p.Addr.String(), "connection "+p.Addr.String()
	} else {
		return func() {}, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight[key] >= max {
		return nil, errcode.New(errcode.TooManyRequests,
			"%s has %d requests in flight on this node, the limit is %d; this one was not applied, retry when earlier ones finish",
			who, g.inFlight[key], max)
	}
	g.inFlight[key]++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.inFlight[key]--; g.inFlight[key] <= 0 {
			delete(g.inFlight, key)
		}
	}, nil
}

func (g *guard) observe(method string, start time.Time, resp any, err error) {
	if g.cfg.Observe == nil {
		return
	}
	code := errcode.OK.String()
	switch {
	case err != nil:
		if st := moonraftpb.DetailStatus(err); st != nil {
			code = errcode.Code(st.GetCode()).String()
		} else {
			code = "GRPC_" + strings.ToUpper(status.Code(err).String())
		}
	case resp != nil:
		if r, ok := resp.(interface{ GetStatus() *moonraftpb.Status }); ok {
			code = errcode.Code(r.GetStatus().GetCode()).String()
		}
	}
	g.cfg.Observe(path.Base(method), code, time.Since(start))
}

func (g *guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() { g.observe(info.FullMethod, start, resp, err) }()
	if err := g.authorize(ctx, info.FullMethod); err != nil {
		return nil, grpcError(statusOf(err))
	}
	release, err := g.acquire(ctx, req)
	if err != nil {
		return nil, grpcError(statusOf(err))
	}
	defer release()
	return handler(ctx, req)
}

func (g *guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	start := time.Now()
	defer func() { g.observe(info.FullMethod, start, nil, err) }()
	if err := g.authorize(ss.Context(), info.FullMethod); err != nil {
		return grpcError(statusOf(err))
	}
	release, err := g.acquire(ss.Context(), nil)
	if err != nil {
		return grpcError(statusOf(err))
	}
	defer release()
	return handler(srv, ss)
}

// ReadTokenFile reads an admin token from a file (surrounding whitespace
// dropped); an empty file is an error, never "no token".
func ReadTokenFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", errcode.New(errcode.FileNotFound, "admin token file: %v", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", errcode.New(errcode.InvalidParams, "admin token file %s is empty", p)
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", errcode.New(errcode.InvalidParams, "admin token file %s holds more than one line", p)
	}
	return tok, nil
}
