//go:build linux

package cororpc

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLoopPassesThroughTheScheduler: an event loop that serves steadily
// yields to Go's scheduler once per yieldEvery of its clock, neither never
// (the runtime's monitor would take its P) nor on every wake-up (each pass
// costs a scheduler round).
func TestLoopPassesThroughTheScheduler(t *testing.T) {
	r, err := newReactor(context.Background(), &Server{Handler: quickReads{}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var elapsed atomic.Int64 // the loop's clock, from zero
	var yields atomic.Int32
	start := time.Now()
	r.clock = func() time.Time { return start.Add(time.Duration(elapsed.Load())) }
	r.yield = func() { yields.Add(1) }
	done := make(chan struct{})
	go func() {
		r.run()
		close(done)
	}()
	t.Cleanup(func() {
		r.stop()
		<-done
	})

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	sc, err := l.Accept()
	require.NoError(t, err)
	require.True(t, r.add(sc))

	// One call per millisecond of the loop's clock, each answered before
	// the clock moves: the loop checks its clock after each answer, at
	// the call's millisecond or the next one.
	const calls = 20
	rd := bufio.NewReader(c)
	for i := range uint32(calls) {
		_, err := c.Write(call(i, 2, i))
		require.NoError(t, err)
		resp, err := ReadResponse(rd)
		require.NoError(t, err)
		require.Equal(t, i, resp.Header.Seq)
		elapsed.Add(int64(time.Millisecond))
	}
	// 19 or 20 ms seen, a pass after each 5 (more than 4 since the last).
	assert.Eventually(t, func() bool { return yields.Load() >= 3 }, time.Second, time.Millisecond)
	assert.LessOrEqual(t, yields.Load(), int32(4))
}

// TestIdleConnectionKeepsNoWorker: once its calls are answered, a
// connection keeps no worker goroutine.
func TestIdleConnectionKeepsNoWorker(t *testing.T) {
	c := startServer(t, quickReads{}, 0)
	r := bufio.NewReader(c)
	workers := func() int {
		buf := make([]byte, 1<<20)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "cororpc.(*rconn).worker")
	}
	for seq := range uint32(3) {
		_, err := c.Write(call(seq, 1, 1)) // function 1 runs at a worker
		require.NoError(t, err)
		require.Equal(t, ErrcOK, readAnswers(t, r, 1)[0].Header.Errc)
	}
	require.Eventually(t, func() bool { return workers() == 0 }, 5*time.Second, 10*time.Millisecond, "workers left running")
}
