package cororpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/moonraft/moonraft/structpack"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sleeper answers function 1 after the number of milliseconds in its body
// and knows no other function.
type sleeper struct{}

func (sleeper) Call(ctx context.Context, id uint32, body, dst []byte) ([]byte, Errc, string) {
	if id != 1 {
		return dst, ErrcFunctionNotRegistered, "the rpc function not registered"
	}
	select {
	case <-time.After(time.Duration(binary.LittleEndian.Uint32(body)) * time.Millisecond):
	case <-ctx.Done():
	}
	return append(dst, body...), ErrcOK, ""
}

// quickReads is sleeper with quick functions too, which the server may
// run on the connection's reader: 2 echoes its body, 3 answers as many
// bytes as its body says, and 4 echoes but always would wait when run
// inline.
type quickReads struct{ sleeper }

func (q quickReads) Call(ctx context.Context, id uint32, body, dst []byte) ([]byte, Errc, string) {
	switch id {
	case 2, 4:
		return append(dst, body...), ErrcOK, ""
	case 3:
		return append(dst, bytes.Repeat([]byte{byte(len(body))}, int(binary.LittleEndian.Uint32(body)))...), ErrcOK, ""
	}
	return q.sleeper.Call(ctx, id, body, dst)
}

func (q quickReads) CallInline(ctx context.Context, id uint32, body, dst []byte) ([]byte, Errc, string, bool) {
	if id != 2 && id != 3 {
		return dst, 0, "", false
	}
	out, errc, msg := q.Call(ctx, id, body, dst)
	return out, errc, msg, true
}

// readers are the two ways a server reads its connections: event loops,
// and a goroutine per connection.
var readers = []struct {
	name  string
	loops int
}{{"event loop", 0}, {"goroutine per connection", -1}}

// forEachReader runs test against a server of each kind.
func forEachReader(t *testing.T, test func(t *testing.T, loops int)) {
	for _, r := range readers {
		t.Run(r.name, func(t *testing.T) { test(t, r.loops) })
	}
}

func startServer(t *testing.T, h Handler, loops int) net.Conn {
	return dialServer(t, serve(t, h, loops))
}

// serve starts a server and returns its address.
func serve(t *testing.T, h Handler, loops int) string {
	return serveWith(t, &Server{Handler: h, Loops: loops})
}

// serveWith starts srv, quiet, and returns its address.
func serveWith(t *testing.T, srv *Server) string {
	srv.Logger = slog.New(slog.DiscardHandler)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- srv.Serve(ctx, l)
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return l.Addr().String()
}

func dialServer(t *testing.T, addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// readAnswers reads n answers, in the order they come, each to a
// different call.
func readAnswers(t *testing.T, r *bufio.Reader, n int) []Response {
	t.Helper()
	seen := map[uint32]bool{}
	out := make([]Response, 0, n)
	for range n {
		resp, err := ReadResponse(r)
		require.NoError(t, err)
		require.False(t, seen[resp.Header.Seq], "seq %d answered twice", resp.Header.Seq)
		seen[resp.Header.Seq] = true
		out = append(out, resp)
	}
	return out
}

func call(seq, id, sleepMs uint32) []byte {
	return AppendRequest(nil, Request{Header: ReqHeader{Seq: seq, FunctionID: id}, Body: binary.LittleEndian.AppendUint32(nil, sleepMs)})
}

func TestServerAnswersOutOfOrder(t *testing.T) {
	forEachReader(t, func(t *testing.T, loops int) {
		c := startServer(t, sleeper{}, loops)
		var frames []byte
		frames = append(frames, call(1, 1, 300)...) // slow
		frames = append(frames, call(2, 1, 0)...)
		frames = append(frames, call(3, 9, 0)...) // unknown function
		_, err := c.Write(frames)
		require.NoError(t, err)
		answers := readAnswers(t, bufio.NewReader(c), 3)
		for _, resp := range answers {
			switch resp.Header.Seq {
			case 3:
				assert.Equal(t, ErrcFunctionNotRegistered, resp.Header.Errc)
				var msg string
				require.NoError(t, structpack.Unmarshal(resp.Body, &msg))
				assert.Equal(t, "the rpc function not registered", msg)
			default:
				assert.Equal(t, ErrcOK, resp.Header.Errc)
			}
		}
		assert.Equal(t, uint32(1), answers[2].Header.Seq, "the slow call answers last, after the ones sent behind it")
	})
}

// TestInlineCallWaitsForNothing: a quick call is answered on an idle
// connection, and one sent behind a slow call still in flight is not held
// up by it.
func TestInlineCallWaitsForNothing(t *testing.T) {
	forEachReader(t, func(t *testing.T, loops int) {
		c := startServer(t, quickReads{}, loops)
		r := bufio.NewReader(c)
		_, err := c.Write(call(1, 2, 7))
		require.NoError(t, err)
		resp, err := ReadResponse(r)
		require.NoError(t, err)
		assert.Equal(t, uint32(1), resp.Header.Seq)
		assert.Equal(t, binary.LittleEndian.AppendUint32(nil, 7), resp.Body)

		_, err = c.Write(call(2, 1, 300)) // slow, on a worker
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond) // read by the server before the next
		_, err = c.Write(call(3, 2, 0))
		require.NoError(t, err)
		var seqs []uint32
		for _, resp := range readAnswers(t, r, 2) {
			assert.Equal(t, ErrcOK, resp.Header.Errc)
			seqs = append(seqs, resp.Header.Seq)
		}
		assert.Equal(t, []uint32{3, 2}, seqs, "the quick call does not wait behind the slow one")
	})
}

// TestObserve: the server tells of each call answered, once, with the
// handler's time: inline, on a worker, and a call that would have waited
// inline and was run on a worker.
func TestObserve(t *testing.T) {
	forEachReader(t, func(t *testing.T, loops int) {
		var mu sync.Mutex
		seen := map[uint32][]time.Duration{}
		addr := serveWith(t, &Server{Handler: quickReads{}, Loops: loops, Observe: func(id uint32, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			seen[id] = append(seen[id], d)
		}})
		c := dialServer(t, addr)
		r := bufio.NewReader(c)
		for seq, id := range []uint32{2, 1, 4} { // inline, a worker's 50 ms, a worker's after the inline try
			_, err := c.Write(call(uint32(seq), id, 50))
			require.NoError(t, err)
			readAnswers(t, r, 1)
		}
		mu.Lock()
		defer mu.Unlock()
		assert.Len(t, seen, 3)
		for id, ds := range seen {
			assert.Len(t, ds, 1, "function %d observed once", id)
		}
		assert.GreaterOrEqual(t, seen[1][0], 50*time.Millisecond, "the handler's time")
		assert.Less(t, seen[2][0], 50*time.Millisecond)
	})
}

// TestRequestsInPieces: requests that arrive in pieces, on several
// connections at once, are each answered with their own body: a
// connection's part of a request survives the other connections' reads.
func TestRequestsInPieces(t *testing.T) {
	forEachReader(t, func(t *testing.T, loops int) {
		addr := serve(t, quickReads{}, loops)
		const conns, n = 4, 300
		var wg sync.WaitGroup
		cs := make([]net.Conn, conns)
		for ci := range uint32(conns) {
			c := dialServer(t, addr)
			cs[ci] = c
			var frames []byte
			for seq := range uint32(n) {
				// 2 is answered inline, 4 by a worker.
				body := binary.LittleEndian.AppendUint32(nil, ci<<16|seq)
				frames = AppendRequest(frames, Request{Header: ReqHeader{Seq: seq, FunctionID: []uint32{2, 2, 4, 2}[seq%4]}, Body: body})
			}
			rng := rand.New(rand.NewPCG(1, uint64(ci)))
			wg.Go(func() {
				for b := frames; len(b) > 0; {
					k := min(len(b), 1+rng.IntN(60))
					if _, err := c.Write(b[:k]); err != nil {
						return
					}
					b = b[k:]
					if rng.IntN(10) == 0 {
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
		// The answers are read here, one connection after the other, while
		// every connection's requests still arrive in pieces.
		for ci, c := range cs {
			for _, resp := range readAnswers(t, bufio.NewReader(c), n) {
				assert.Equal(t, ErrcOK, resp.Header.Errc)
				assert.Equal(t, binary.LittleEndian.AppendUint32(nil, uint32(ci)<<16|resp.Header.Seq), resp.Body, "connection %d, seq %d", ci, resp.Header.Seq)
			}
		}
		wg.Wait()
	})
}

// TestLargeAnswersToASlowReader: a client that sends many calls with large
// answers and reads them only later gets every byte; the server holds
// back (it stops reading the connection) instead of failing it.
func TestLargeAnswersToASlowReader(t *testing.T) {
	forEachReader(t, func(t *testing.T, loops int) {
		c := startServer(t, quickReads{}, loops)
		const n, size = 24, 1 << 20
		go func() {
			for seq := range uint32(n) {
				if _, err := c.Write(call(seq, 3, size)); err != nil {
					return
				}
			}
		}()
		time.Sleep(200 * time.Millisecond) // the socket's buffers fill
		for _, resp := range readAnswers(t, bufio.NewReader(c), n) {
			require.Equal(t, bytes.Repeat([]byte{4}, size), resp.Body)
		}
	})
}

// TestHalfClosedClientGetsItsAnswers: a client that shuts its side after
// its last request still gets the answers of the calls in flight, and
// then the end of the connection.
func TestHalfClosedClientGetsItsAnswers(t *testing.T) {
	forEachReader(t, func(t *testing.T, loops int) {
		c := startServer(t, quickReads{}, loops)
		_, err := c.Write(append(call(1, 1, 100), call(2, 2, 5)...))
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		r := bufio.NewReader(c)
		answers := readAnswers(t, r, 2)
		assert.ElementsMatch(t, []uint32{1, 2}, []uint32{answers[0].Header.Seq, answers[1].Header.Seq})
		_, err = r.ReadByte()
		assert.ErrorIs(t, err, io.EOF)
	})
}

func TestServerClosesOnProtocolError(t *testing.T) {
	forEachReader(t, func(t *testing.T, loops int) {
		c := startServer(t, sleeper{}, loops)
		_, err := c.Write(append([]byte{Magic + 1}, make([]byte, ReqHeaderLen-1)...))
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err = c.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF, "a frame boundary cannot be found again: the connection closes")
	})
}

func TestClientAndPool(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Server{Handler: sleeper{}, Logger: slog.New(slog.DiscardHandler)}).Serve(ctx, l) }()
	var p Pool
	defer p.Close()
	slow := make(chan Response, 1)
	go func() {
		resp, err := p.Call(context.Background(), l.Addr().String(), 1, binary.LittleEndian.AppendUint32(nil, 200))
		assert.NoError(t, err)
		slow <- resp
	}()
	time.Sleep(20 * time.Millisecond)
	resp, err := p.Call(context.Background(), l.Addr().String(), 1, binary.LittleEndian.AppendUint32(nil, 0))
	require.NoError(t, err)
	assert.Equal(t, ErrcOK, resp.Header.Errc, "a quick call is not held behind a slow one on the same connection")
	require.Len(t, slow, 0)
	assert.Equal(t, ErrcOK, (<-slow).Header.Errc)

	tctx, tcancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	_, err = p.Call(tctx, l.Addr().String(), 1, binary.LittleEndian.AppendUint32(nil, 1000))
	tcancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_, notSent := errors.AsType[*NotSentError](err)
	assert.False(t, notSent, "a call that timed out was sent: it may have run")

	cancel()
	require.NoError(t, <-done)
	_, err = p.Call(context.Background(), l.Addr().String(), 1, binary.LittleEndian.AppendUint32(nil, 0))
	assert.Error(t, err, "the server is gone")
	// The broken connection is dropped: the next call dials, and is
	// refused before anything is sent.
	_, err = p.Call(context.Background(), l.Addr().String(), 1, binary.LittleEndian.AppendUint32(nil, 0))
	_, notSent = errors.AsType[*NotSentError](err)
	assert.True(t, notSent, "%v", err)
}

type forwardedEcho struct{}

func (forwardedEcho) Call(ctx context.Context, _ uint32, _, dst []byte) ([]byte, Errc, string) {
	if Forwarded(ctx) {
		return append(dst, 1), ErrcOK, ""
	}
	return append(dst, 0), ErrcOK, ""
}

// TestForwardedMark: a call a node forwards says so, so the node it reaches
// never forwards it again.
func TestForwardedMark(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = (&Server{Handler: forwardedEcho{}, Logger: slog.New(slog.DiscardHandler)}).Serve(ctx, l) }()
	for _, tc := range []struct {
		msgType uint8
		want    byte
	}{{0, 0}, {MsgForwarded, 1}} {
		p := Pool{MsgType: tc.msgType}
		resp, err := p.Call(context.Background(), l.Addr().String(), 1, nil)
		require.NoError(t, err)
		assert.Equal(t, []byte{tc.want}, resp.Body)
		p.Close()
	}
}

// sloppy appends bytes to dst before it fails or gives up: function 1
// appends then fails, 2 appends then is not done inline (and echoes on a
// worker).
type sloppy struct{}

func (sloppy) Call(ctx context.Context, id uint32, body, dst []byte) ([]byte, Errc, string) {
	if id == 1 {
		return append(dst, "half an answer"...), ErrcInvalidArguments, "bad arguments"
	}
	return append(dst, body...), ErrcOK, ""
}

func (sloppy) CallInline(ctx context.Context, id uint32, body, dst []byte) ([]byte, Errc, string, bool) {
	return append(dst, "would wait"...), 0, "", false
}

// TestAppendedBytesOfAFailedCallAreDropped: a handler appends its answer
// to the frame's buffer; what it appended before an error, or before
// giving up on an inline call, never reaches the client, and the answers
// around it stay whole.
func TestAppendedBytesOfAFailedCallAreDropped(t *testing.T) {
	forEachReader(t, func(t *testing.T, loops int) {
		c := startServer(t, sloppy{}, loops)
		var frames []byte
		frames = append(frames, AppendRequest(nil, Request{Header: ReqHeader{Seq: 1, FunctionID: 2}, Body: []byte("one")})...)
		frames = append(frames, AppendRequest(nil, Request{Header: ReqHeader{Seq: 2, FunctionID: 1}})...)
		frames = append(frames, AppendRequest(nil, Request{Header: ReqHeader{Seq: 3, FunctionID: 2}, Body: []byte("three")})...)
		_, err := c.Write(frames)
		require.NoError(t, err)
		got := map[uint32]Response{}
		for _, a := range readAnswers(t, bufio.NewReader(c), 3) {
			got[a.Header.Seq] = a
		}
		assert.Equal(t, "one", string(got[1].Body))
		assert.Equal(t, "three", string(got[3].Body))
		assert.Equal(t, ErrcInvalidArguments, got[2].Header.Errc)
		var msg string
		require.NoError(t, structpack.Unmarshal(got[2].Body, &msg))
		assert.Equal(t, "bad arguments", msg, "the error's body is its message alone")
	})
}
