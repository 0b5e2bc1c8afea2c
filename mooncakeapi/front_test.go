package mooncakeapi

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/structpack"
)

// followerOf is a follower's view of the leader: its Mooncake address.
type followerOf struct{ addr atomic.Value }

func (l *followerOf) IsLeader() bool                        { return false }
func (l *followerOf) ViewVersion() uint64                   { return 0 }
func (l *followerOf) LeaderMooncakeAddr() string            { return l.addr.Load().(string) }
func (l *followerOf) AwaitLeader(ctx context.Context) error { return nil }

// fakeLeader serves Mooncake frames on loopback: each request it reads is
// counted, then answered "done" or, if dies, the connection is closed
// without an answer, as a leader that stops after reading a call.
func fakeLeader(t *testing.T, dies bool) (addr string, got *atomic.Int64) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	got = &atomic.Int64{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					req, err := cororpc.ReadRequest(r)
					if err != nil {
						return
					}
					got.Add(1)
					if dies {
						return
					}
					resp := cororpc.Response{Header: cororpc.RespHeader{Seq: req.Header.Seq}, Body: []byte("done")}
					if _, err := c.Write(cororpc.AppendResponse(nil, resp)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), got
}

// TestForwardAcrossLeaderChange: a follower forwards a call to a leader
// that reads it and dies, and meanwhile learns of a new leader. A read is
// sent again to the new leader and answered; a write, which the old
// leader may have run, is not sent again: its client hears io_error.
func TestForwardAcrossLeaderChange(t *testing.T) {
	for _, tc := range []struct {
		call  string
		again bool
	}{
		{"GetReplicaList", true},
		{"Ping", true},
		{"PutStart", false},
	} {
		t.Run(tc.call, func(t *testing.T) {
			old, oldGot := fakeLeader(t, true)
			next, nextGot := fakeLeader(t, false)
			lead := &followerOf{}
			lead.addr.Store(old)
			f := NewFront(nil, lead, slog.New(slog.DiscardHandler), 5000)
			defer f.Close()
			go func() { // the follower hears of the new leader a moment later
				for oldGot.Load() == 0 {
					time.Sleep(time.Millisecond)
				}
				lead.addr.Store(next)
			}()
			out, errc, msg := f.Call(context.Background(), FunctionID(tc.call), nil, nil)
			assert.EqualValues(t, 1, oldGot.Load())
			if tc.again {
				require.Equal(t, cororpc.ErrcOK, errc, msg)
				assert.Equal(t, "done", string(out))
				assert.EqualValues(t, 1, nextGot.Load())
			} else {
				assert.Equal(t, cororpc.ErrcIOError, errc, "the write's outcome is unknown")
				assert.Zero(t, nextGot.Load(), "a write that may have run is not sent again")
			}
		})
	}
}

// pingLeader leads; with stepsDown it steps down during its Ping, answering
// as a node that no longer leads. The rest of service.Data is never called
// here.
type pingLeader struct {
	service.Data
	stepsDown bool
	leads     atomic.Bool
}

func (s *pingLeader) IsLeader() bool                    { return s.leads.Load() }
func (s *pingLeader) ViewVersion() uint64               { return map[bool]uint64{true: 7}[s.leads.Load()] }
func (s *pingLeader) LeaderMooncakeAddr() string        { return "" }
func (s *pingLeader) AwaitLeader(context.Context) error { return nil }
func (s *pingLeader) Ping(context.Context, string) (bool, error) {
	if s.stepsDown {
		s.leads.Store(false)
		return false, errcode.New(errcode.NotLeader, "not the leader")
	}
	return false, nil
}

// TestInlinePing: the leader's event loop answers a Ping itself; one
// answered by a leader that stepped down meanwhile is not sent back with
// its "not the leader" (master_bench takes a failed Ping as fatal): Call
// answers it instead, forwarding it to the new leader.
func TestInlinePing(t *testing.T) {
	body, err := structpack.Marshal(UUID{First: 1, Second: 2})
	require.NoError(t, err)
	for _, stepsDown := range []bool{false, true} {
		s := &pingLeader{stepsDown: stepsDown}
		s.leads.Store(true)
		f := NewFront(s, s, slog.New(slog.DiscardHandler), 5000)
		out, errc, _, done := f.CallInline(context.Background(), FunctionID("Ping"), body, nil)
		f.Close()
		if stepsDown {
			assert.False(t, done, "the answer of a node that stepped down during the call")
			continue
		}
		require.True(t, done, "a Ping answered on the loop")
		require.Equal(t, cororpc.ErrcOK, errc)
		var r Expected[PingResponse]
		require.NoError(t, structpack.Unmarshal(out, &r))
		assert.Equal(t, PingResponse{ViewVersionID: 7, ClientStatus: ClientOK}, r.Value)
	}
}
