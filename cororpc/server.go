package cororpc

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/moonraft/moonraft/structpack"
)

// Handler answers one call. It returns the struct_pack body of the
// function's result, or a coro_rpc error code (not ErrcOK) and message.
type Handler interface {
	Call(ctx context.Context, functionID uint32, body []byte) (result []byte, errc Errc, msg string)
}

// Inliner is what a Handler may also be. Inline reports whether a call of
// functionID is quick (a read served from memory): such a call that
// arrives when nothing else of its connection is in flight or waiting is
// run by the connection's reader itself, which saves waking a worker; a
// slow one run so would hold up the requests behind it.
type Inliner interface {
	Inline(functionID uint32) bool
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
type Server struct {
	Handler     Handler
	Logger      Logger
	MaxInFlight int // per connection; 0 means 256
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
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Go(func() { s.serveConn(ctx, c) })
	}
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
	inliner, _ := s.Handler.(Inliner)
	r := bufio.NewReader(c)
	for {
		req, err := ReadRequest(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
				s.Logger.Warn("mooncake protocol: closing connection", "remote", c.RemoteAddr().String(), "error", err)
			}
			break
		}
		if inliner != nil && inFlight.Load() == 0 && r.Buffered() == 0 && inliner.Inline(req.Header.FunctionID) {
			w.send(s.answer(ctx, req))
			continue
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
	h := RespHeader{Magic: Magic, Seq: req.Header.Seq}
	var body []byte
	if req.Header.SerializeType != 0 {
		h.Errc = ErrcProtocolError
		body = errorBody("unknown serialize type")
	} else {
		var errc Errc
		var msg string
		body, errc, msg = s.Handler.Call(ctx, req.Header.FunctionID, req.Body)
		if errc != ErrcOK {
			h.Errc = errc
			body = errorBody(msg)
		}
	}
	return AppendResponse(nil, Response{Header: h, Body: body})
}

// errorBody is what coro_rpc sends after an error code: the message,
// struct_pack-encoded.
func errorBody(msg string) []byte {
	b, _ := structpack.Marshal(msg) // a string always encodes
	return b
}
