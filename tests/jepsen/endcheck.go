package jepsen

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

// oplogTap copies the OpLog out of etcd while the run goes on, so the
// checkers see every entry even after the leader's cleanup deletes old
// ones from etcd. It checks on the way that entries arrive gapless and
// verify.
type oplogTap struct {
	store *etcdbridge.Store
	mu    sync.Mutex
	ents  []oplog.Entry
	raw   map[uint64][]byte
	errs  []string
}

func newOplogTap(s *etcdbridge.Store) *oplogTap {
	return &oplogTap{store: s, raw: map[uint64][]byte{}}
}

func (t *oplogTap) run(ctx context.Context, every time.Duration) {
	for ctx.Err() == nil {
		_ = t.poll(ctx)
		_ = sleepCtx(ctx, every)
	}
}

// poll reads every entry after the last one seen.
func (t *oplogTap) poll(ctx context.Context) error {
	for {
		t.mu.Lock()
		last := uint64(len(t.ents))
		t.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		recs, _, err := t.store.ReadOpLogSince(cctx, last, 1000)
		cancel()
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return nil
		}
		t.mu.Lock()
		for _, r := range recs {
			if r.Seq != uint64(len(t.ents))+1 {
				t.errs = append(t.errs, fmt.Sprintf("OpLog read after %d returned seq %d: a gap (cleaned up before it was read, or never written)", len(t.ents), r.Seq))
				t.mu.Unlock()
				return nil
			}
			e, err := oplog.Decode(r.Value)
			if err == nil {
				err = e.Verify()
			}
			if err == nil && e.SequenceID != r.Seq {
				err = fmt.Errorf("entry under key seq %d says seq %d", r.Seq, e.SequenceID)
			}
			if err != nil {
				t.errs = append(t.errs, fmt.Sprintf("OpLog seq %d: %v", r.Seq, err))
				t.mu.Unlock()
				return nil
			}
			t.ents = append(t.ents, e)
			t.raw[r.Seq] = r.Value
		}
		t.mu.Unlock()
	}
}

func (t *oplogTap) entries() []oplog.Entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]oplog.Entry(nil), t.ents...)
}

// endResult is what the end-of-run checks found.
type endResult struct {
	AppliedIndex     uint64   `json:"applied_index"`
	Digest           string   `json:"digest"`
	ObjectSetDigest  string   `json:"object_set_digest"`
	AppliedSeq       uint64   `json:"applied_seq"`
	OpLogMin         uint64   `json:"oplog_min"`
	OpLogLatest      uint64   `json:"oplog_latest"`
	Objects          uint64   `json:"objects"`
	SnapshotsChecked int      `json:"snapshots_checked"` // taken during the run, restored and checked
	ReplayFromSeq    uint64   `json:"replay_from_seq"`
	Replayed         int      `json:"replayed"`
	ReplayStale      int      `json:"replay_stale_dropped"`
	ReplaySkipped    int      `json:"replay_skipped"`
	FollowerSeq      uint64   `json:"follower_seq"`
	Problems         []string `json:"problems,omitempty"`
}

func (r *endResult) fail(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// converge waits until every node answers with the same applied index in
// one poll, and then requires equal digests: the state machine is
// deterministic, so equal indexes must mean equal states.
func converge(ctx context.Context, c *cluster, within time.Duration, r *endResult) []*moonraftpb.NodeStatus {
	deadline := time.Now().Add(within)
	var last []*moonraftpb.NodeStatus
	for time.Now().Before(deadline) && ctx.Err() == nil {
		sts := c.statuses(2 * time.Second)
		last = sts
		same := true
		for _, st := range sts {
			if st == nil || st.AppliedIndex != sts[0].AppliedIndex {
				same = false
				break
			}
		}
		if same {
			for _, st := range sts[1:] {
				if st.Digest != sts[0].Digest || st.ObjectSetDigest != sts[0].ObjectSetDigest {
					r.fail("nodes differ at applied index %d: %s digest %s objects %s, %s digest %s objects %s",
						st.AppliedIndex, sts[0].Id, sts[0].Digest, sts[0].ObjectSetDigest, st.Id, st.Digest, st.ObjectSetDigest)
				}
			}
			r.AppliedIndex, r.Digest, r.ObjectSetDigest = sts[0].AppliedIndex, sts[0].Digest, sts[0].ObjectSetDigest
			return sts
		}
		_ = sleepCtx(ctx, 50*time.Millisecond)
	}
	var desc []string
	for i, st := range last {
		if st == nil {
			desc = append(desc, c.nodes[i].id+": no answer")
		} else {
			desc = append(desc, fmt.Sprintf("%s: %s index %d", st.Id, st.Role, st.AppliedIndex))
		}
	}
	r.fail("nodes did not reach one applied index within %v: %v", within, desc)
	return nil
}

// savedSnapshot is a leader snapshot taken during the run, on disk.
type savedSnapshot struct {
	path string
	seq  uint64
}

// badSnapshot is a snapshot the leader sent that does not restore or
// breaks an invariant: a finding, unlike a snapshot not taken.
type badSnapshot struct{ err error }

func (b badSnapshot) Error() string { return b.err.Error() }

// takeSnapshot streams a snapshot from the leader, restores it into a
// fresh state machine (which verifies the trailer, canonical order, that
// no two live buffers overlap, every invariant) and checks invariants.
func takeSnapshot(ctx context.Context, c *cluster, dir string, n int) (savedSnapshot, *fsm.FSM, error) {
	var buf bytes.Buffer
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := c.admin.SnapshotSave(cctx, &buf)
	cancel()
	if err != nil {
		return savedSnapshot{}, nil, err
	}
	path := filepath.Join(dir, fmt.Sprintf("snap-%03d.moonsnap", n))
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return savedSnapshot{}, nil, err
	}
	f := fsm.New()
	h, err := f.Restore(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return savedSnapshot{}, nil, badSnapshot{fmt.Errorf("restore of leader snapshot %s: %w", path, err)}
	}
	if err := f.CheckInvariants(); err != nil {
		return savedSnapshot{}, nil, badSnapshot{fmt.Errorf("invariants of leader snapshot %s: %w", path, err)}
	}
	return savedSnapshot{path: path, seq: h.AppliedSeq}, f, nil
}

// checkOpLogInEtcd reads etcd's OpLog from its minimum to latest: it must
// be contiguous, every entry must verify, and every entry must be
// byte-identical to the copy the tap read earlier (entries are never
// overwritten). It returns the entries.
func checkOpLogInEtcd(ctx context.Context, store *etcdbridge.Store, tap *oplogTap, r *endResult) []oplog.Entry {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	minSeq, err := store.GetMinSequenceId(cctx)
	if err != nil {
		r.fail("etcd min seq: %v", err)
		return nil
	}
	latest, err := store.Latest(cctx)
	if err != nil {
		r.fail("etcd latest: %v", err)
		return nil
	}
	r.OpLogMin, r.OpLogLatest = minSeq, latest
	if latest == 0 {
		return nil
	}
	var out []oplog.Entry
	next := minSeq
	for next <= latest {
		recs, _, err := store.ReadOpLogSince(cctx, next-1, 1000)
		if err != nil {
			r.fail("etcd read after %d: %v", next-1, err)
			return nil
		}
		if len(recs) == 0 {
			break
		}
		for _, rec := range recs {
			if rec.Seq > latest {
				break
			}
			if rec.Seq != next {
				// The cluster still runs: a snapshot taken since minSeq was
				// read may have let the leader clean up below rec.Seq. That
				// is no gap if etcd's minimum is rec.Seq now.
				now, err := store.GetMinSequenceId(cctx)
				if err != nil || rec.Seq < next || now != rec.Seq {
					r.fail("etcd OpLog has a gap: seq %d follows %d (min %d then %d, latest %d)", rec.Seq, next-1, minSeq, now, latest)
					return nil
				}
				next, out, r.OpLogMin = now, nil, now
			}
			e, err := oplog.Decode(rec.Value)
			if err == nil {
				err = e.Verify()
			}
			if err != nil {
				r.fail("etcd OpLog seq %d does not verify: %v", rec.Seq, err)
				return nil
			}
			tap.mu.Lock()
			prev, ok := tap.raw[rec.Seq]
			tap.mu.Unlock()
			if ok && !bytes.Equal(prev, rec.Value) {
				r.fail("etcd OpLog seq %d changed during the run: was %s, is %s", rec.Seq, prev, rec.Value)
			}
			out = append(out, e)
			next++
		}
	}
	if next != latest+1 {
		r.fail("etcd OpLog ends at %d but latest is %d", next-1, latest)
	}
	// key_sequence_id grows per key.
	seen := map[string]uint64{}
	for _, e := range out {
		if prev, ok := seen[e.Key]; ok && e.KeySequenceID <= prev {
			r.fail("OpLog seq %d: key %q has key_sequence_id %d after %d", e.SequenceID, e.Key, e.KeySequenceID, prev)
		}
		seen[e.Key] = e.KeySequenceID
	}
	return out
}

// checkReplay replays the OpLog over a snapshot taken during the run (the
// oldest one etcd still holds every later entry for) up to the leader's
// applied seq, and compares the object set with the leader's at that seq.
func checkReplay(snaps []savedSnapshot, entries []oplog.Entry, leader *moonraftpb.NodeStatus, r *endResult) {
	var base *savedSnapshot
	for i := range snaps {
		if snaps[i].seq+1 >= r.OpLogMin || r.OpLogMin <= 1 {
			base = &snaps[i]
			break
		}
	}
	if base == nil {
		r.fail("no snapshot of the run is covered by etcd's OpLog (min seq %d): nothing to replay over", r.OpLogMin)
		return
	}
	data, err := os.ReadFile(base.path)
	if err != nil {
		r.fail("replay: %v", err)
		return
	}
	f := fsm.New()
	if _, err := f.Restore(bytes.NewReader(data)); err != nil {
		r.fail("replay: restore %s: %v", base.path, err)
		return
	}
	r.ReplayFromSeq = base.seq
	for _, e := range entries {
		if e.SequenceID <= base.seq {
			continue
		}
		if e.SequenceID > leader.AppliedSeq {
			break
		}
		note, err := f.ReplayEntry(e)
		if err != nil {
			r.fail("replay over %s: seq %d: %v", base.path, e.SequenceID, err)
			return
		}
		r.Replayed++
		r.ReplayStale += note.StaleDropped
		if note.Skipped {
			r.ReplaySkipped++
		}
	}
	if got := f.Stats().AppliedSeq; got != leader.AppliedSeq {
		r.fail("replay over %s reached seq %d, the leader is at %d", base.path, got, leader.AppliedSeq)
		return
	}
	d := f.ObjectSetDigest()
	if hex.EncodeToString(d[:]) != leader.ObjectSetDigest {
		r.fail("replaying the OpLog over %s (seq %d) up to seq %d gives object set %x, the leader %s has %s",
			base.path, base.seq, leader.AppliedSeq, d, leader.Id, leader.ObjectSetDigest)
	}
	if err := f.CheckInvariants(); err != nil {
		r.fail("replayed state breaks an invariant: %v", err)
	}
}

// leaderExported waits until the leader has exported everything it
// applied (ExportedSeq == AppliedSeq) and etcd's latest has it too.
func leaderExported(ctx context.Context, c *cluster, within time.Duration, r *endResult) *moonraftpb.NodeStatus {
	deadline := time.Now().Add(within)
	var last *moonraftpb.NodeStatus
	for time.Now().Before(deadline) && ctx.Err() == nil {
		l := c.leader()
		if l >= 0 {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := c.admin.Status(sctx, c.nodes[l].grpcAddr)
			latest, lerr := c.store.Latest(sctx)
			cancel()
			if err == nil && lerr == nil {
				last = st
				if st.Promoted && st.ExportedSeq == st.AppliedSeq && latest >= st.AppliedSeq {
					r.AppliedSeq, r.Objects = st.AppliedSeq, st.Objects
					return st
				}
			}
		}
		_ = sleepCtx(ctx, 100*time.Millisecond)
	}
	r.fail("the leader did not export its OpLog within %v (last status %v)", within, last)
	return nil
}

// checkFollower: the --follow-etcd process reaches the leader's object set.
// Its status reads the seq and the digest separately, so a mismatch counts
// only when it holds over several polls at one quiet seq.
func checkFollower(ctx context.Context, c *cluster, within time.Duration, r *endResult) {
	deadline := time.Now().Add(within)
	mismatches := 0
	var lastF, lastL *moonraftpb.NodeStatus
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if !c.follower.Running() {
			r.fail("the etcd follower exited (see %s)", c.follower.LogPath)
			return
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		fst, ferr := c.admin.Status(sctx, c.follower.grpcAddr)
		cancel()
		l := c.leader()
		if ferr != nil || l < 0 {
			_ = sleepCtx(ctx, 200*time.Millisecond)
			continue
		}
		sctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		lst, lerr := c.admin.Status(sctx, c.nodes[l].grpcAddr)
		cancel()
		if lerr != nil {
			continue
		}
		lastF, lastL = fst, lst
		r.FollowerSeq = fst.AppliedSeq
		if fst.AppliedSeq == lst.AppliedSeq {
			if fst.ObjectSetDigest == lst.ObjectSetDigest {
				return
			}
			if mismatches++; mismatches >= 5 {
				r.fail("the etcd follower at seq %d has object set %s (%d objects), the leader %s at seq %d has %s (%d objects)",
					fst.AppliedSeq, fst.ObjectSetDigest, fst.Objects, lst.Id, lst.AppliedSeq, lst.ObjectSetDigest, lst.Objects)
				return
			}
		} else {
			mismatches = 0
		}
		_ = sleepCtx(ctx, 200*time.Millisecond)
	}
	r.fail("the etcd follower did not reach the leader's seq within %v (follower %v, leader %v)", within, lastF, lastL)
}
