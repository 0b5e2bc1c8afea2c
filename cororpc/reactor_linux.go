//go:build linux

package cororpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// reactor serves TCP connections from one goroutine that waits in
// epoll_wait for all of them, reads what arrived, answers the quick calls
// itself and writes their answers in one write per connection, as the C++
// master's event loops do. Go's own network poller would wake a goroutine
// per request and park it again after, through the scheduler: for a read
// of a few microseconds that costs more than the read itself (futex
// wake-ups, spinning threads, the system monitor woken from its sleep;
// measured in docs/BENCHMARKS.md), on a machine whose cores the clients
// share. Slow calls go to workers of their connection, as in serveConn.
type reactor struct {
	s      *Server
	ctx    context.Context
	epfd   int
	wakefd int // an eventfd, written to stop the loop
	limit  int // calls at workers (and queued for them) per connection
	// answers gathers the quick calls' answers of one read (the loop's
	// alone): the socket takes them, or they are copied to the
	// connection's out.
	answers []byte
	// scratch is the read buffer of the connections that hold no part of
	// a request (the loop's alone).
	scratch []byte
	// clock and yield are time.Now and runtime.Gosched but in tests.
	clock func() time.Time
	yield func()

	mu    sync.Mutex
	conns map[int32]*rconn // by file descriptor
	dead  bool             // the loop ended: it takes no more connections

	workers sync.WaitGroup // of every connection
}

// rconn is one connection of a reactor. Only the loop reads it; answers
// are written under mu by whoever has one (the loop or a worker).
type rconn struct {
	r      *reactor
	fd     int
	remote string
	ctx    context.Context
	cancel context.CancelFunc
	in     []byte // part of a request, read and not yet parsed (the loop's alone)

	mu       sync.Mutex
	out      []byte    // answer bytes the socket has not taken yet
	queue    []Request // calls waiting for a worker
	inFlight int       // calls queued or at a worker, not yet answered
	// workers run while c has calls queued, and end when it has none: an
	// idle connection keeps no goroutine (10,000 clients that mounted
	// once and only ping since would keep 10,000).
	workers int
	events  uint32 // what epoll watches for
	eof     bool   // the client sent its last request
	closed  bool
}

const (
	evIn  = syscall.EPOLLIN | syscall.EPOLLRDHUP
	evOut = syscall.EPOLLOUT

	// yieldEvery is how long the loop runs, serving and waiting in
	// epoll_wait, before it passes through Go's scheduler. A goroutine
	// that never does looks to the runtime's monitor like one that has run
	// for 10 ms without a break: the monitor takes its P while it waits
	// in epoll_wait, hands the P to another thread, and then wakes every
	// 20 µs for a millisecond or more. Without the pass, the monitor took
	// a busy loop's P ~200 times a second and a Get cost the leader 33 µs
	// of CPU instead of 28.5 (master_bench Get at 4 clients, 2026-11-26).
	yieldEvery = 4 * time.Millisecond

	readChunk = 16 << 10
	// outLimit is the answer bytes a connection may have waiting for its
	// socket before the loop stops reading its requests: a client that
	// sends without reading must not grow the server's memory.
	outLimit = 4 << 20
)

func newReactor(ctx context.Context, s *Server) (*reactor, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	wakefd, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errno != 0 {
		syscall.Close(epfd)
		return nil, fmt.Errorf("eventfd2: %w", errno)
	}
	r := &reactor{s: s, ctx: ctx, epfd: epfd, wakefd: int(wakefd), conns: map[int32]*rconn{}, limit: s.MaxInFlight,
		clock: time.Now, yield: runtime.Gosched}
	if r.limit <= 0 {
		r.limit = 256
	}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, r.wakefd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(r.wakefd)}); err != nil {
		syscall.Close(epfd)
		syscall.Close(r.wakefd)
		return nil, fmt.Errorf("epoll_ctl: %w", err)
	}
	return r, nil
}

// add takes c over: its socket moves from Go's poller to the loop's. It
// reports false, leaving c as it was, if c is not a TCP connection or its
// descriptor cannot be had.
func (r *reactor) add(c net.Conn) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	fd := -1
	if err := raw.Control(func(f uintptr) { fd = dupCloexec(int(f)) }); err != nil || fd < 0 {
		return false
	}
	cc := &rconn{r: r, fd: fd, remote: c.RemoteAddr().String(), events: evIn}
	cc.ctx, cc.cancel = context.WithCancel(r.ctx)
	r.mu.Lock()
	if r.dead {
		r.mu.Unlock()
		cc.cancel()
		syscall.Close(fd)
		return false
	}
	r.conns[int32(fd)] = cc
	r.mu.Unlock()
	c.Close() // the duplicate keeps the socket open, outside Go's poller
	if err := syscall.EpollCtl(r.epfd, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: evIn, Fd: int32(fd)}); err != nil {
		r.s.Logger.Warn("mooncake protocol: closing a connection the event loop cannot watch", "remote", cc.remote, "error", err)
		cc.close()
	}
	return true
}

// dupCloexec duplicates fd (-1 if it cannot); the duplicate shares the
// socket and its non-blocking mode.
func dupCloexec(fd int) int {
	nfd, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if errno != 0 {
		return -1
	}
	return int(nfd)
}

// stop ends the loop; from any goroutine.
func (r *reactor) stop() {
	one := [8]byte{1}
	syscall.Write(r.wakefd, one[:])
}

// run is the loop. It returns after stop, once it closed every connection
// and their workers are done.
func (r *reactor) run() {
	defer r.shutdown()
	events := make([]syscall.EpollEvent, 128)
	last := r.clock()
	for {
		if now := r.clock(); now.Sub(last) > yieldEvery {
			r.yield()
			last = now
		}
		n, err := syscall.EpollWait(r.epfd, events, -1)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			r.s.Logger.Error("mooncake protocol: the event loop's epoll_wait failed; its connections close", "error", err)
			return
		}
		for _, ev := range events[:n] {
			if int(ev.Fd) == r.wakefd {
				return // only stop writes to it
			}
			r.mu.Lock()
			c := r.conns[ev.Fd]
			r.mu.Unlock()
			if c == nil {
				continue
			}
			if ev.Events&evOut != 0 {
				c.flush()
			}
			if ev.Events&^evOut != 0 {
				r.readable(c)
			}
		}
	}
}

func (r *reactor) shutdown() {
	r.mu.Lock()
	r.dead = true
	conns := make([]*rconn, 0, len(r.conns))
	for _, c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	r.workers.Wait()
	syscall.Close(r.epfd)
	syscall.Close(r.wakefd)
}

// readable reads what c has, answers the quick calls among the requests it
// completes (all their answers in one write) and queues the others for
// c's workers. A connection keeps a buffer of its own only while it holds
// part of a request; otherwise it reads into the loop's, so an idle
// connection costs no read buffer (10,000 clients would hold 320 MB).
func (r *reactor) readable(c *rconn) {
	own := len(c.in) > 0
	in := c.in
	if !own {
		in = r.scratch[:0]
	}
	if cap(in)-len(in) < readChunk {
		grown := make([]byte, len(in), max(2*cap(in), 2*readChunk))
		copy(grown, in)
		in = grown
	}
	if own {
		c.in = in
	} else if cap(in) <= 4*readChunk { // a large request's buffer is not kept
		r.scratch = in
	}
	n, err := syscall.Read(c.fd, in[len(in):cap(in)])
	switch {
	case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR):
		return
	case err != nil:
		if !errors.Is(err, syscall.ECONNRESET) {
			r.s.Logger.Warn("mooncake protocol: closing connection", "remote", c.remote, "error", err)
		}
		c.close()
		return
	case n == 0 && c.eof: // a hang-up after the end: nobody to answer
		c.close()
		return
	case n == 0:
		c.ended()
		return
	}
	in = in[:len(in)+n]
	answers := r.answers[:0]
	defer func() {
		if cap(answers) <= 4*readChunk { // a large answer's buffer is not kept
			r.answers = answers[:0]
		}
	}()
	off := 0
	for {
		req, used, err := parseRequest(in[off:])
		if err != nil {
			r.s.Logger.Warn("mooncake protocol: closing connection", "remote", c.remote, "error", err)
			c.send(answers)
			c.close()
			return
		}
		if used == 0 {
			break
		}
		off += used
		if !c.busy() {
			var done bool
			if answers, done = r.s.appendInline(answers, c.ctx, req); done {
				continue
			}
		}
		// The body aliases the read buffer, which the next read overwrites.
		req.Body = append([]byte(nil), req.Body...)
		req.Attachment = append([]byte(nil), req.Attachment...)
		c.enqueue(req)
	}
	c.send(answers)
	switch rest := in[off:]; {
	case len(rest) == 0:
		c.in = nil
	case own:
		c.in = in[:copy(in, rest)]
	default: // part of a request: c holds it until the rest comes
		c.in = append(make([]byte, 0, max(len(rest)+readChunk, 2*readChunk)), rest...)
	}
}

// ended is the client's end of its requests: c closes once the calls at
// its workers are answered and the answers written.
func (c *rconn) ended() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eof = true
	c.rearm()
}

// busy reports whether any of c's calls is at a worker: a quick call then
// goes there too rather than overtake it.
func (c *rconn) busy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inFlight > 0
}

// enqueue hands req to c's workers, starting one if fewer than the limit
// run.
func (c *rconn) enqueue(req Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.queue = append(c.queue, req)
	c.inFlight++
	if c.workers < c.r.limit {
		c.workers++
		c.r.workers.Go(c.worker)
	}
	c.rearm()
}

func (c *rconn) worker() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.queue) > 0 && !c.closed {
		req := c.queue[0]
		c.queue[0] = Request{}
		c.queue = c.queue[1:]
		c.mu.Unlock()
		frame := c.r.s.answer(c.ctx, req)
		c.mu.Lock()
		c.inFlight--
		c.write(frame)
		c.rearm()
	}
	c.workers--
}

// send writes answer bytes, or keeps them behind earlier ones.
func (c *rconn) send(b []byte) {
	if len(b) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.write(b)
	c.rearm()
}

// write, under mu, writes what the socket takes and keeps the rest for
// EPOLLOUT.
func (c *rconn) write(b []byte) {
	if c.closed {
		return
	}
	if len(c.out) > 0 {
		c.out = append(c.out, b...)
		return
	}
	n, err := writeSome(c.fd, b)
	if err != nil {
		c.closeLocked()
		return
	}
	c.out = append(c.out, b[n:]...)
}

// flush writes what waits in out, after EPOLLOUT.
func (c *rconn) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	n, err := writeSome(c.fd, c.out)
	if err != nil {
		c.closeLocked()
		return
	}
	c.out = c.out[:copy(c.out, c.out[n:])]
	c.rearm()
}

// writeSome writes b until done or until the socket takes no more (then
// n < len(b) and no error).
func writeSome(fd int, b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n, err := syscall.Write(fd, b[done:])
		switch {
		case errors.Is(err, syscall.EINTR):
		case errors.Is(err, syscall.EAGAIN):
			return done, nil
		case err != nil:
			return done, err
		default:
			done += n
		}
	}
	return done, nil
}

// rearm, under mu, sets what epoll watches c for: its requests unless
// they ended, too many calls are queued or too many answer bytes wait (the
// client is not reading), and the socket's room while answer bytes wait.
// After the client's last request it closes c once nothing is left to
// answer or write.
func (c *rconn) rearm() {
	if c.closed {
		return
	}
	if c.eof && c.inFlight == 0 && len(c.out) == 0 {
		c.closeLocked()
		return
	}
	var ev uint32
	if !c.eof && len(c.queue) < c.r.limit && len(c.out) < outLimit {
		ev |= evIn
	}
	if len(c.out) > 0 {
		ev |= evOut
	}
	if ev == c.events {
		return
	}
	c.events = ev
	if err := syscall.EpollCtl(c.r.epfd, syscall.EPOLL_CTL_MOD, c.fd, &syscall.EpollEvent{Events: ev, Fd: int32(c.fd)}); err != nil {
		c.r.s.Logger.Warn("mooncake protocol: closing a connection the event loop cannot watch", "remote", c.remote, "error", err)
		c.closeLocked()
	}
}

func (c *rconn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked()
}

// closeLocked closes c's socket, under mu: calls at workers see their
// context end, and answers that come after are dropped.
func (c *rconn) closeLocked() {
	if c.closed {
		return
	}
	c.closed = true
	c.cancel()
	c.r.mu.Lock()
	if c.r.conns[int32(c.fd)] == c {
		delete(c.r.conns, int32(c.fd))
	}
	c.r.mu.Unlock()
	syscall.Close(c.fd) // also takes it out of epoll: it has no duplicate left
	c.queue = nil
}
