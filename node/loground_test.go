package node

import (
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

// pauseFence makes one node of an in-memory raft group behave as a paused
// process does: the first heartbeat it sends each peer after the pause
// reaches the peer and is answered, but the answer waits (as in a socket
// buffer) until the node wakes; everything else it would send waits until
// a little after that, and what others send it fails, then and after it
// wakes (the test ends before it needs to hear them). On waking the node
// thus reads the old answers first, one interleaving a real pause allows:
// had others' calls reached it at once, a successor's heartbeat could
// depose it before it read them, as it did on a loaded CI machine.
type pauseFence struct {
	mu     sync.Mutex
	paused raft.ServerAddress // "" when nobody is paused
	deaf   raft.ServerAddress // the paused node, from its pause on: others' calls to it fail
	sent   map[raft.ServerAddress]bool
	acked  int           // first heartbeats answered while paused
	wake   chan struct{} // the held answers are read
	rest   chan struct{} // the held calls are sent
}

func (f *pauseFence) pause(addr raft.ServerAddress) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.paused, f.deaf, f.sent, f.wake, f.rest = addr, addr, map[raft.ServerAddress]bool{}, make(chan struct{}), make(chan struct{})
}

func (f *pauseFence) heartbeatsAnswered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.acked
}

func (f *pauseFence) resume() {
	f.mu.Lock()
	if f.paused == "" {
		f.mu.Unlock()
		return
	}
	f.paused = ""
	close(f.wake)
	f.mu.Unlock()
	time.Sleep(100 * time.Millisecond)
	close(f.rest)
}

// call says how a call from -> to goes now: refused, answered and held
// until answered is closed, or held until held is closed and then sent.
func (f *pauseFence) call(from, to raft.ServerAddress, heartbeat bool) (refuse bool, answered, held chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if to == f.deaf {
		return true, nil, nil
	}
	switch f.paused {
	case "":
		return false, nil, nil
	case from:
		if heartbeat && !f.sent[to] {
			f.sent[to] = true
			return false, f.wake, nil
		}
		return false, nil, f.rest
	}
	return false, nil, nil
}

type fencedTransport struct {
	*raft.InmemTransport
	fence *pauseFence
}

var errPaused = errors.New("peer paused")

func (t *fencedTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported // every append goes through AppendEntries
}

func (t *fencedTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	// raft's heartbeats carry neither entries nor a commit index.
	heartbeat := len(args.Entries) == 0 && args.LeaderCommitIndex == 0
	refuse, answered, held := t.fence.call(t.LocalAddr(), target, heartbeat)
	switch {
	case refuse:
		return errPaused
	case answered != nil:
		err := t.InmemTransport.AppendEntries(id, target, args, resp)
		t.fence.mu.Lock()
		t.fence.acked++
		t.fence.mu.Unlock()
		<-answered
		return err
	case held != nil:
		<-held
	}
	return t.InmemTransport.AppendEntries(id, target, args, resp)
}

// vote fences a (pre-)vote request: votes carry no heartbeat.
func (t *fencedTransport) vote(target raft.ServerAddress) error {
	refuse, _, held := t.fence.call(t.LocalAddr(), target, false)
	switch {
	case refuse:
		return errPaused
	case held != nil:
		<-held
	}
	return nil
}

func (t *fencedTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if err := t.vote(target); err != nil {
		return err
	}
	return t.InmemTransport.RequestVote(id, target, args, resp)
}

func (t *fencedTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if err := t.vote(target); err != nil {
		return err
	}
	return t.InmemTransport.RequestPreVote(id, target, args, resp)
}

type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (nopFSM) Restore(io.ReadCloser) error         { return nil }

// TestLogRoundIgnoresAcksSentBeforeIt pauses a leader right after each
// follower has answered one more heartbeat, lets the followers elect a
// successor that commits a write, then starts a leadership round on the
// paused leader and wakes it. Its followers' answers it finds on waking
// were given before the round began, so a round must not count them:
// logRound refuses, while raft's VerifyLeader confirms the deposed leader
// (the stale read the fault suite found under pause-leader).
func TestLogRoundIgnoresAcksSentBeforeIt(t *testing.T) {
	for _, tc := range []struct {
		name      string
		round     func(r *raft.Raft) error
		confirmed bool
	}{
		{"VerifyLeader", func(r *raft.Raft) error { return r.VerifyLeader().Error() }, true},
		{"logRound", func(r *raft.Raft) error { return logRound(r, raft.Future.Error) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fence := &pauseFence{}
			dbg := &syncBuf{}
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(dbg.String())
				}
			})
			var nodes []*raft.Raft
			var trans []*fencedTransport
			for i := 0; i < 3; i++ {
				_, tr := raft.NewInmemTransport("")
				trans = append(trans, &fencedTransport{InmemTransport: tr, fence: fence})
			}
			for _, a := range trans {
				for _, b := range trans {
					if a != b {
						a.Connect(b.LocalAddr(), b.InmemTransport)
					}
				}
			}
			conf := raft.Configuration{Servers: []raft.Server{{ID: "n0", Address: trans[0].LocalAddr()}}}
			for i, tr := range trans {
				c := raft.DefaultConfig()
				c.LocalID = raft.ServerID([]string{"n0", "n1", "n2"}[i])
				c.Logger = hclog.New(&hclog.LoggerOptions{Name: string(c.LocalID), Output: dbg, Level: hclog.Debug})
				// n0 leads with a leader lease long enough to stay leader
				// through the pause (a paused process cannot step down);
				// the followers' timeouts are cut once n0 pauses (raft
				// re-arms a follower's timer when its timeout shrinks).
				c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = 10*time.Second, 10*time.Second, 5*time.Second
				if i > 0 {
					c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = time.Second, time.Second, 50*time.Millisecond
				}
				store := raft.NewInmemStore()
				if i == 0 {
					require.NoError(t, raft.BootstrapCluster(c, store, store, raft.NewInmemSnapshotStore(), tr, conf))
				}
				r, err := raft.NewRaft(c, nopFSM{}, store, store, raft.NewInmemSnapshotStore(), tr)
				require.NoError(t, err)
				nodes = append(nodes, r)
				t.Cleanup(func() { _ = r.Shutdown().Error() })
			}
			l := nodes[0]
			// Shrinking n0's timeout re-arms its timer, and having heard
			// from no leader it stands at once instead of in 10-20 s.
			rc := l.ReloadableConfig()
			rc.HeartbeatTimeout, rc.ElectionTimeout = 5*time.Second, 5*time.Second
			require.NoError(t, l.ReloadConfig(rc))
			require.Eventually(t, func() bool { return l.State() == raft.Leader }, 10*time.Second, 10*time.Millisecond)
			for i := 1; i < 3; i++ {
				require.NoError(t, l.AddVoter(raft.ServerID([]string{"n0", "n1", "n2"}[i]), trans[i].LocalAddr(), 0, 5*time.Second).Error())
			}
			require.NoError(t, l.Barrier(5*time.Second).Error())
			require.Eventually(t, func() bool { return nodes[1].LastIndex() == l.LastIndex() && nodes[2].LastIndex() == l.LastIndex() },
				5*time.Second, time.Millisecond, "every follower has the whole configuration (else the two cannot elect)")

			fence.pause(trans[0].LocalAddr())
			t.Cleanup(fence.resume) // runs before the shutdowns, which would wait on held calls
			require.Eventually(t, func() bool { return fence.heartbeatsAnswered() == 2 }, 5*time.Second, time.Millisecond,
				"each follower answers one more heartbeat before the successor is elected")
			fast := raft.ReloadableConfig{HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond}
			for _, r := range nodes[1:] {
				rc := r.ReloadableConfig()
				rc.HeartbeatTimeout, rc.ElectionTimeout = fast.HeartbeatTimeout, fast.ElectionTimeout
				require.NoError(t, r.ReloadConfig(rc))
			}
			var successor *raft.Raft
			require.Eventually(t, func() bool {
				for _, r := range nodes[1:] {
					if r.State() == raft.Leader {
						successor = r
						return true
					}
				}
				return false
			}, 10*time.Second, 5*time.Millisecond, "the followers elect a successor")
			require.NoError(t, successor.Apply([]byte("write"), time.Second).Error(), "the successor commits")
			require.Equal(t, raft.Leader, l.State(), "the paused leader has not noticed")

			done := make(chan error, 1)
			go func() { done <- tc.round(l) }()
			time.Sleep(20 * time.Millisecond) // the round is registered before the wake
			fence.resume()
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the round did not end after the wake")
			}
			if tc.confirmed {
				require.NoError(t, err, "VerifyLeader counts answers to heartbeats sent before it (if this fails, raft fixed it)")
				return
			}
			require.ErrorIs(t, err, raft.ErrNotLeader, "a round must not confirm a deposed leader")
		})
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
