package cororpc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moonraft/moonraft/structpack"
)

// Handler answers one call: it appends the struct_pack body of the
// function's result to dst (the answer's frame, so the body is encoded
// once, in place) and returns it, or returns a coro_rpc error code (not
// ErrcOK) and message, and what it appended is dropped. It must not keep
// dst.
type Handler interface {
	Call(ctx context.Context, functionID uint32, body, dst []byte) (out []byte, errc Errc, msg string)
}

// Inliner is what a Handler may also be. CallInline answers a quick call
// (a read served from memory) on the reader of its connection, which
// saves waking a worker, or reports done false without answering: the
// call is slow, or would wait for something, and goes to a worker. It
// must not wait: the reader may be an event loop that serves many
// connections. The server tries it for a call that arrives when nothing
// else of its connection is at a worker. dst and out are Call's.
type Inliner interface {
	CallInline(ctx context.Context, functionID uint32, body, dst []byte) (out []byte, errc Errc, msg string, done bool)
}

// Logger is what the server logs through (hclog's and slog's loggers both
// are one).
type Logger interface {
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
}

// Server serves coro_rpc connections: every request of a connection runs
// at once (up to MaxInFlight at a time), and its answer is written when it
// is ready, so a slow call does not hold back the ones behind it.
//
// On Linux, TCP connections are read by event loops (reactor_linux.go),
// each serving its share of them from one goroutine; elsewhere each
// connection has a reader goroutine of its own.
type Server struct {
	Handler     Handler
	Logger      Logger
	MaxInFlight int // per connection; 0 means 256
	// Loops is the number of event loops (on Linux): 0 means
	// DefaultLoops(); a negative number means none, a reader goroutine per
	// connection.
	Loops int
	// Observe, if set, is told of each call answered: its function and
	// how long the handler took (the call's wait for the connection's
	// earlier calls aside).
	Observe func(functionID uint32, d time.Duration)
}

// Serve accepts connections on l until ctx ends or l fails; it closes
// them all before returning.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	loops, err := s.startLoops(ctx, &wg)
	if err != nil {
		s.Logger.Warn("mooncake protocol: no event loop, a goroutine reads each connection", "error", err)
	}
	defer func() {
		for _, r := range loops {
			r.stop()
		}
	}()
	for i := 0; ; i++ {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if len(loops) > 0 && loops[i%len(loops)].add(c) {
			continue
		}
		wg.Go(func() { s.serveConn(ctx, c) })
	}
}

// DefaultLoops is Server.Loops' default: one event loop per two of
// GOMAXPROCS, at least one.
func DefaultLoops() int {
	return max(1, runtime.GOMAXPROCS(0)/2)
}

func (s *Server) startLoops(ctx context.Context, wg *sync.WaitGroup) ([]*reactor, error) {
	n := s.Loops
	if n == 0 {
		n = DefaultLoops()
	}
	var loops []*reactor
	for range n {
		r, err := newReactor(ctx, s)
		if err != nil || r == nil {
			return loops, err
		}
		wg.Go(r.run)
		loops = append(loops, r)
	}
	return loops, nil
}

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		c.Close()
	}()
	limit := s.MaxInFlight
	if limit <= 0 {
		limit = 256
	}
	// Workers live as long as the connection and are started as calls need
	// them (up to limit): a goroutine per call would grow a fresh stack for
	// every call, the reflection of the codec being deep. Each writes its
	// own answer (no hand-off to a writer goroutine).
	w := &connWriter{c: c, fail: cancel}
	work := make(chan Request)
	workers := 0
	var calls sync.WaitGroup
	var inFlight atomic.Int32 // calls handed to workers and not yet answered
	worker := func(req Request) {
		w.send(s.answer(ctx, req))
		inFlight.Add(-1)
		for req := range work {
			w.send(s.answer(ctx, req))
			inFlight.Add(-1)
		}
	}
	r := bufio.NewReader(c)
	for {
		req, err := ReadRequest(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
				s.Logger.Warn("mooncake protocol: closing connection", "remote", c.RemoteAddr().String(), "error", err)
			}
			break
		}
		if inFlight.Load() == 0 && r.Buffered() == 0 {
			if frame, ok := s.appendInline(nil, ctx, req); ok {
				w.send(frame)
				continue
			}
		}
		inFlight.Add(1)
		select {
		case work <- req: // an idle worker took it
			continue
		default:
		}
		if workers < limit {
			workers++
			calls.Go(func() { worker(req) })
			continue
		}
		select {
		case work <- req:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	calls.Wait()
}

// connWriter writes a connection's answers as their calls finish. A call
// that finds nobody writing writes at once; answers that finish while a
// write is under way are gathered and go in the next write (one system
// call for them all), written by the call that was writing.
type connWriter struct {
	c    net.Conn
	fail func() // ends the connection after a failed write

	mu      sync.Mutex
	pending []byte // answers waiting for the next write
	spare   []byte // the buffer of the last write, reused
	writing bool
	failed  bool
}

func (w *connWriter) send(frame []byte) {
	w.mu.Lock()
	if w.failed {
		w.mu.Unlock()
		return
	}
	w.pending = append(w.pending, frame...)
	if w.writing {
		w.mu.Unlock()
		return
	}
	w.writing = true
	for len(w.pending) > 0 && !w.failed {
		b := w.pending
		w.pending = w.spare[:0]
		w.mu.Unlock()
		_, err := w.c.Write(b)
		w.mu.Lock()
		w.spare = b
		if err != nil {
			w.failed = true
			w.fail()
		}
	}
	w.writing = false
	w.mu.Unlock()
}

// MsgForwarded marks a request one moonraft node forwarded to another
// (coro_rpc's message type is 0 otherwise): it is never forwarded again.
const MsgForwarded uint8 = 'M'

type forwardedKey struct{}

// Forwarded reports whether the call being handled came marked
// MsgForwarded.
func Forwarded(ctx context.Context) bool {
	f, _ := ctx.Value(forwardedKey{}).(bool)
	return f
}

// answer runs one call and frames its result or error.
func (s *Server) answer(ctx context.Context, req Request) []byte {
	if req.Header.MsgType == MsgForwarded {
		ctx = context.WithValue(ctx, forwardedKey{}, true)
	}
	start := time.Now()
	frame, _ := appendFrame(nil, req, func(dst []byte) ([]byte, Errc, string, bool) {
		out, errc, msg := s.Handler.Call(ctx, req.Header.FunctionID, req.Body, dst)
		return out, errc, msg, true
	})
	s.observe(req, start)
	return frame
}

func (s *Server) observe(req Request, start time.Time) {
	if s.Observe != nil {
		s.Observe(req.Header.FunctionID, time.Since(start))
	}
}

// appendInline appends the answer of req to dst if the handler answers it
// inline (see Inliner).
func (s *Server) appendInline(dst []byte, ctx context.Context, req Request) ([]byte, bool) {
	inliner, ok := s.Handler.(Inliner)
	if !ok {
		return dst, false
	}
	start := time.Now()
	out, done := appendFrame(dst, req, func(dst []byte) ([]byte, Errc, string, bool) {
		return inliner.CallInline(ctx, req.Header.FunctionID, req.Body, dst)
	})
	if done {
		s.observe(req, start)
	}
	return out, done
}

// appendFrame appends the frame answering req to dst: call appends the
// body after the header, which is written once the body's length is
// known, so an answer is encoded once, in place. With an error code the
// body is the message, struct_pack-encoded, as coro_rpc sends it. If call
// is not done, dst comes back as it was.
func appendFrame(dst []byte, req Request, call func(dst []byte) ([]byte, Errc, string, bool)) ([]byte, bool) {
	start := len(dst)
	head := start + RespHeaderLen
	dst = append(dst, make([]byte, RespHeaderLen)...)
	out, errc, msg, done := dst, ErrcProtocolError, "unknown serialize type", true
	if req.Header.SerializeType == 0 {
		out, errc, msg, done = call(dst)
	}
	if !done {
		return dst[:start], false
	}
	if errc != ErrcOK {
		out, _ = structpack.AppendMarshal(out[:head], msg) // a string always encodes
	}
	putRespHeader(out[start:head], RespHeader{Magic: Magic, Errc: errc, Seq: req.Header.Seq}, len(out)-head, 0)
	return out, true
}
