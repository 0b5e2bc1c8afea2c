package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/internal/localcluster"
	dto "github.com/prometheus/client_model/go"
)

// failover SIGKILLs the leader --scale-kills times, each after the last
// old leader has caught up (kill), and sums the kills up in r: the medians
// and the slowest, and every session any of them cost.
func (s *scaleRun) failover(ctx context.Context, n uint64, r *scaleResult) error {
	for k := range s.cfg.scaleKills {
		prefix := fmt.Sprintf("scale-%d-failover", n)
		if k > 0 {
			prefix = fmt.Sprintf("%s-%d", prefix, k+1)
		}
		kr, err := s.kill(ctx, prefix)
		if err != nil {
			return err
		}
		progressf("kill %d of %d: the next write answered %.0f ms after it; the old leader caught up %.1f s after its restart",
			k+1, s.cfg.scaleKills, kr.FailoverMs, kr.RestartSecs)
		r.Kills = append(r.Kills, *kr)
		r.SessionsLost += kr.SessionsLost
	}
	of := func(f func(killResult) float64) []float64 {
		var vs []float64
		for _, kr := range r.Kills {
			vs = append(vs, f(kr))
		}
		return vs
	}
	failovers := of(func(kr killResult) float64 { return kr.FailoverMs })
	r.FailoverMs, r.FailoverMaxMs = median(failovers), slices.Max(failovers)
	r.FailoverPromotedMs = median(of(func(kr killResult) float64 { return kr.PromotedMs }))
	r.RestartSecs = median(of(func(kr killResult) float64 { return kr.RestartSecs }))
	return nil
}

// killResult is one SIGKILL of the leader at a size.
type killResult struct {
	FailoverMs float64         `json:"failover_ms"` // to the next answered write
	PromotedMs float64         `json:"promoted_ms"` // to a follower's first status as a promoted leader
	Followers  []followerTrace `json:"followers"`
	// Host is what the host's counters did from the kill to the
	// promotion; HostBefore, over the 2 s before the kill.
	Host       hostWindow `json:"host"`
	HostBefore hostWindow `json:"host_before"`
	// ProbeCalls is the probe's writes from the one in flight at the kill
	// to the next answered.
	ProbeCalls   []probeCall `json:"probe_calls"`
	RestartSecs  float64     `json:"restart_secs"` // the old leader on its data dir, to caught up
	Restore      restoreTime `json:"restore"`      // of its snapshot, within RestartSecs
	SessionsLost int         `json:"sessions_lost"`
	// ListenOverflows is the connections the host's full listen queues
	// turned away from the kill to the sessions' count, as the clients
	// connected to the new leader (-1: not read).
	ListenOverflows int64 `json:"listen_overflows"`
}

// kill SIGKILLs the leader under the probe's writes: the time to the next
// answered write, what the followers did meanwhile, and whether every
// client's session survived; then it restarts the old leader on its data
// dir and times its catch-up.
func (s *scaleRun) kill(ctx context.Context, profilePrefix string) (*killResult, error) {
	l, err := s.lc.leader(ctx)
	if err != nil {
		return nil, err
	}
	pr, err := s.startProbe(ctx, "failover")
	if err != nil {
		return nil, err
	}
	traced, hostTraced := s.traceFollowers(ctx, l), traceHost(ctx)
	before := s.followerHealth(ctx, l)
	time.Sleep(2 * time.Second)
	// Begun before the kill: Kill returns once the dead process is reaped,
	// 0.4–0.7 s later at 6M, when the election is over.
	profiled := s.profileSurvivors(ctx, l, profilePrefix)
	defer profiled()
	overflows, overflowsErr := listenOverflows()
	kill := time.Now()
	l.Signal(syscall.SIGKILL)
	sent := time.Now()
	l.Wait(10 * time.Second)
	// The times, to set beside the nodes' logs: a harness short of CPU
	// may send the signal late, or see the promotion late.
	progressf("failover: killed the leader %s: the kill at %s, its signal sent at %s, the process reaped at %s",
		l.ID, kill.Format(clockMs), sent.Format(clockMs), time.Now().Format(clockMs))
	nl, err := s.lc.leader(ctx)
	polled := time.Now()
	host, samples := hostTraced(), traced()
	if err != nil {
		pr.finish()
		return nil, err
	}
	promoted := firstPromoted(kill, samples, polled)
	kr := &killResult{PromotedMs: float64(promoted.Sub(kill).Microseconds()) / 1000,
		Host: hostBetween(host, kill, promoted), HostBefore: hostBetween(host, kill.Add(-2*time.Second), kill)}
	after := s.followerHealth(ctx, l)
	for id, samples := range samples {
		f := followerAtKill(id, kill, samples)
		f.addHealth(before[id], after[id])
		kr.Followers = append(kr.Followers, f)
	}
	slices.SortFunc(kr.Followers, func(a, b followerTrace) int { return strings.Compare(a.ID, b.ID) })
	for deadline := time.Now().Add(30 * time.Second); kr.FailoverMs == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			pr.finish()
			return nil, fmt.Errorf("no write answered within 30 s of killing the leader %s", l.ID)
		}
		kr.FailoverMs = pr.firstAnsweredAfter(kill)
	}
	kr.ProbeCalls = pr.callsAround(kill)
	pr.finish()
	progressf("restarting %s on its data dir", l.ID)
	t0 := time.Now()
	if err := l.Start(); err != nil {
		return nil, err
	}
	restartProfiled := s.profileRestart(ctx, l, profilePrefix)
	defer restartProfiled()
	if err := s.lc.caughtUp(ctx, l); err != nil {
		return nil, err
	}
	kr.RestartSecs = time.Since(t0).Seconds()
	m, err := s.metrics(ctx, l)
	if err != nil {
		return nil, err
	}
	kr.Restore = restoreOf(m)
	// A session the failover cost has expired by now: two client TTLs
	// after the promotion (fsm.Promote.SessionGraceMs), with every client
	// pinging.
	ttl := time.Duration(fsm.DefaultParams().ClientTTLMs) * time.Millisecond
	time.Sleep(time.Until(promoted.Add(2*ttl + 2*time.Second)))
	st, err := s.lc.cl.Progress(ctx, nl.GRPCAddr)
	if err != nil {
		return nil, err
	}
	kr.SessionsLost = len(s.clients) - int(st.Sessions)
	kr.ListenOverflows = -1
	if now, err := listenOverflows(); err == nil && overflowsErr == nil {
		kr.ListenOverflows = int64(now - overflows)
	}
	return kr, nil
}

// followerTrace is what a follower did with the dead leader's entries
// after the kill: a follower times its leader's silence from the last
// AppendEntries it finished handling (hashicorp/raft sets its last contact
// then), so entries it was still handling after the kill start its clock
// late (docs/BENCHMARKS.md, "The failover at 6M"). It learns what the
// leader committed from each AppendEntries it handles.
type followerTrace struct {
	ID string `json:"id"`
	// UnappliedAtKill is its commit index less its applied index at the
	// last sample before the kill.
	UnappliedAtKill float64 `json:"unapplied_at_kill"`
	// CommittedAfter is how far its commit index moved after the kill in
	// the dead leader's term, the last move seen LastCommitMs after it;
	// AppliedMs is when its applied index last moved in that term (0: it
	// did not move after the kill).
	CommittedAfter float64 `json:"committed_after_kill"`
	LastCommitMs   float64 `json:"last_commit_ms"`
	AppliedMs      float64 `json:"applied_ms"`
	// AppendedAfter is how far its last log index moved after the kill in
	// the dead leader's term, the last move seen LastAppendMs after it:
	// entries it took that were not committed yet.
	AppendedAfter float64 `json:"appended_after_kill"`
	LastAppendMs  float64 `json:"last_append_ms"`
	// LastContactMs is when, from the kill, it last heard from the dead
	// leader, as it reported while still its follower: the start of the
	// silence it waits out before it stands (0: not reported after the
	// kill).
	LastContactMs float64 `json:"last_contact_ms"`
	// From 2 s before the kill to the promotion: its Raft log writes, the
	// slowest within SlowestAppendMs (a histogram bucket's bound), and its
	// goroutines' waits of 75 ms or more to run.
	LogAppends      uint64  `json:"log_appends"`
	SlowestAppendMs float64 `json:"slowest_append_ms"`
	Stalls          float64 `json:"stalls"`
}

// health is what a node's metrics say of its disk and its scheduling so
// far: its Raft log writes' latency histogram and its stalls.
type health struct {
	appends *dto.Histogram
	stalls  float64
}

// followerHealth reads every node but the leader's health, by node; a node
// whose metrics cannot be read is left out.
func (s *scaleRun) followerHealth(ctx context.Context, leader *localcluster.Node) map[string]health {
	out := map[string]health{}
	for _, p := range s.lc.procs {
		if p == leader {
			continue
		}
		m, err := s.metrics(ctx, p)
		if err != nil || len(m["moonraft_raft_log_append_seconds"].GetMetric()) == 0 {
			continue
		}
		var stalls float64
		for _, x := range m["moonraft_stalls_total"].GetMetric() {
			for _, l := range x.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == "sched" {
					stalls += x.GetCounter().GetValue()
				}
			}
		}
		out[p.ID] = health{m["moonraft_raft_log_append_seconds"].GetMetric()[0].GetHistogram(), stalls}
	}
	return out
}

// addHealth records what changed between two readings of f's health.
func (f *followerTrace) addHealth(before, after health) {
	if before.appends == nil || after.appends == nil {
		return
	}
	f.Stalls = after.stalls - before.stalls
	f.LogAppends = after.appends.GetSampleCount() - before.appends.GetSampleCount()
	bs, as := before.appends.GetBucket(), after.appends.GetBucket()
	for i := range min(len(bs), len(as)) {
		if as[i].GetCumulativeCount()-bs[i].GetCumulativeCount() == f.LogAppends {
			f.SlowestAppendMs = as[i].GetUpperBound() * 1000
			return
		}
	}
	f.SlowestAppendMs = math.Inf(1)
}

// logSample is a follower's Raft term, commit index and applied index
// when read.
type logSample struct {
	at                               time.Time
	term, commit, applied, lastIndex uint64
	promoted                         bool // a leader that serves
	// contact is when the node, a follower, last heard from its leader
	// (zero on another role).
	contact time.Time
}

// traceFollowers reads every node but the leader's progress (gRPC Status
// without digests: its /metrics, 3 MB with 10,000 clients' segments, would
// load it) every traceEvery until the returned func is called, which
// returns the samples by node.
func (s *scaleRun) traceFollowers(ctx context.Context, leader *localcluster.Node) (stop func() map[string][]logSample) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	out := map[string][]logSample{}
	for _, p := range s.lc.procs {
		if p == leader {
			continue
		}
		wg.Go(func() {
			for {
				st, err := s.lc.cl.Progress(ctx, p.GRPCAddr)
				if err == nil {
					x := logSample{at: time.Now(), term: st.GetTerm(), commit: st.GetCommitIndex(), applied: st.GetAppliedIndex(),
						lastIndex: st.GetLastLogIndex(), promoted: st.GetPromoted()}
					if ms := st.GetLastContactMs(); st.GetRole() == "follower" && ms >= 0 {
						x.contact = x.at.Add(-time.Duration(ms) * time.Millisecond)
					}
					mu.Lock()
					out[p.ID] = append(out[p.ID], x)
					mu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(traceEvery):
				}
			}
		})
	}
	return func() map[string][]logSample {
		cancel()
		wg.Wait()
		return out
	}
}

// firstPromoted is the first sample after kill in which a follower was a
// promoted leader, or polled if the trace saw none.
func firstPromoted(kill time.Time, samples map[string][]logSample, polled time.Time) time.Time {
	first := polled
	for _, xs := range samples {
		for _, x := range xs {
			if x.promoted && x.at.After(kill) && x.at.Before(first) {
				first = x.at
			}
		}
	}
	return first
}

// traceEvery is how often traceFollowers reads a follower's progress.
const traceEvery = 20 * time.Millisecond

// followerAtKill sums up a follower's samples of the dead leader's term, so
// that the new leader's entries do not count.
func followerAtKill(id string, kill time.Time, samples []logSample) followerTrace {
	ms := func(t time.Time) float64 { return float64(t.Sub(kill).Microseconds()) / 1000 }
	f := followerTrace{ID: id}
	var atKill logSample
	for _, x := range samples {
		if !x.at.After(kill) {
			atKill = x
		}
	}
	f.UnappliedAtKill = float64(atKill.commit) - float64(atKill.applied)
	prev := atKill
	for _, x := range samples {
		if !x.at.After(kill) || x.term != atKill.term {
			continue
		}
		if x.commit > prev.commit {
			f.CommittedAfter += float64(x.commit - prev.commit)
			f.LastCommitMs = ms(x.at)
		}
		if x.applied > prev.applied {
			f.AppliedMs = ms(x.at)
		}
		if x.lastIndex > prev.lastIndex {
			f.AppendedAfter += float64(x.lastIndex - prev.lastIndex)
			f.LastAppendMs = ms(x.at)
		}
		if !x.contact.IsZero() {
			f.LastContactMs = ms(x.contact)
		}
		prev = x
	}
	return f
}

// profileSurvivors saves, with --profile, a CPU profile of each node but
// dead for failoverProfile from now (the kill, the election, the promotion
// and the first writes), as <prefix>-<id>.cpu, and an execution trace of
// each and of moonbench itself (the probe and the clients that follow the
// leader) for failoverTrace, as <prefix>-<id>.trace; the returned func
// waits for them.
func (s *scaleRun) profileSurvivors(ctx context.Context, dead *localcluster.Node, prefix string) (wait func()) {
	var wg sync.WaitGroup
	if s.cfg.profileDir == "" {
		return wg.Wait
	}
	save := func(p *localcluster.Node, which, path string) {
		if err := savePprof(ctx, p, which, filepath.Join(s.cfg.profileDir, path)); err != nil {
			progressf("no failover %s of %s: %v", which, p.ID, err)
		}
	}
	for _, p := range s.lc.procs {
		if p == dead {
			continue
		}
		wg.Go(func() {
			save(p, fmt.Sprintf("profile?seconds=%d", int(failoverProfile/time.Second)), fmt.Sprintf("%s-%s.cpu", prefix, p.ID))
		})
		wg.Go(func() {
			save(p, fmt.Sprintf("trace?seconds=%d", int(failoverTrace/time.Second)), fmt.Sprintf("%s-%s.trace", prefix, p.ID))
		})
	}
	wg.Go(func() {
		if err := traceSelf(ctx, failoverTrace, filepath.Join(s.cfg.profileDir, prefix+"-moonbench.trace")); err != nil {
			progressf("no failover trace of moonbench: %v", err)
		}
	})
	return wg.Wait
}

// profileRestart saves, with --profile, a CPU profile of the restarted
// node p from the moment it serves (its listeners open once Raft has
// started: after the log's check and the snapshot's restore, which its log
// times) for restartProfile, as <prefix>-restart-<id>.cpu: the catching
// up. The returned func waits for it.
func (s *scaleRun) profileRestart(ctx context.Context, p *localcluster.Node, prefix string) (wait func()) {
	var wg sync.WaitGroup
	if s.cfg.profileDir == "" {
		return wg.Wait
	}
	wg.Go(func() {
		path := filepath.Join(s.cfg.profileDir, fmt.Sprintf("%s-restart-%s.cpu", prefix, p.ID))
		which := fmt.Sprintf("profile?seconds=%d", int(restartProfile/time.Second))
		var err error
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
			if err = savePprof(ctx, p, which, path); err == nil {
				return
			}
		}
		progressf("no restart profile of %s: %v", p.ID, err)
	})
	return wg.Wait
}

// restartProfile is how long a restarted node's CPU profile runs.
const restartProfile = 5 * time.Second

// failoverProfile and failoverTrace are how long a failover's CPU profiles
// and execution traces run.
const (
	failoverProfile = 3 * time.Second
	failoverTrace   = 2 * time.Second
)

// profileWindows saves, with --profile, back-to-back CPU profiles of every
// node, windowProfile each, as <prefix>-<id>-<start>.cpu (the start on the
// clock of the progress lines), until the returned stop is called, which
// waits for the profiles under way: the last snapshot ends in the last of
// them, and which ones overlap a snapshot is known only afterwards.
func (s *scaleRun) profileWindows(ctx context.Context, prefix string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	stop = func() { close(done); wg.Wait() }
	if s.cfg.profileDir == "" {
		return stop
	}
	which := fmt.Sprintf("profile?seconds=%d", int(windowProfile/time.Second))
	for _, p := range s.lc.procs {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				path := filepath.Join(s.cfg.profileDir, fmt.Sprintf("%s-%s-%s.cpu", prefix, p.ID, time.Now().Format("150405")))
				if err := savePprof(ctx, p, which, path); err != nil {
					progressf("no profile of %s: %v", p.ID, err)
					return
				}
			}
		})
	}
	return stop
}

// windowProfile is how long each of profileWindows' profiles runs.
const windowProfile = 5 * time.Second

// join starts a fourth node with an empty data dir, joining through the
// leader (which sends it a snapshot), times its catch-up, and removes it.
func (s *scaleRun) join(ctx context.Context, r *scaleResult) error {
	l, err := s.lc.leader(ctx)
	if err != nil {
		return err
	}
	j := &localcluster.Node{ID: "n3", Proc: child.Proc{Bin: s.cfg.moonraftBin}}
	j.DataDir = filepath.Join(s.lc.dir, fmt.Sprintf("join-%d", len(s.rep.Sizes)))
	for _, a := range []*string{&j.RaftAddr, &j.GRPCAddr, &j.HTTPAddr} {
		if *a, err = freeport.Addr(); err != nil {
			return err
		}
	}
	j.Args = []string{"--id", j.ID, "--data-dir", j.DataDir, "--raft-addr", j.RaftAddr, "--grpc-addr", j.GRPCAddr,
		"--http-addr", j.HTTPAddr, "--join", l.GRPCAddr, "--etcd-endpoints", strings.Join(s.lc.etcdP.endpoints(), ","), "--log-level", "warn"}
	j.Args = append(j.Args, s.cfg.nodeFlags...)
	progressf("joining a fresh node")
	t0 := time.Now()
	if err := j.Start(); err != nil {
		return err
	}
	defer func() {
		_ = retryUntil(ctx, 30*time.Second, func(ctx context.Context) error { return s.lc.cl.RemoveServer(ctx, j.ID) })
		localcluster.StopAll([]*localcluster.Node{j})
		os.RemoveAll(j.DataDir)
	}()
	if err := s.lc.caughtUp(ctx, j); err != nil {
		return err
	}
	r.JoinSecs = time.Since(t0).Seconds()
	m, err := s.metrics(ctx, j)
	if err != nil {
		return err
	}
	r.JoinBySnapshot = histCount(m, "moonraft_snapshot_write_seconds") > 0
	r.JoinRestore = restoreOf(m)
	return nil
}

// clockFormat is how the snapshots' progress lines give the time of day,
// to match with profileWindows' file names; clockMs how a kill's does, to
// match with the nodes' logs.
const (
	clockFormat = "15:04:05.0"
	clockMs     = "15:04:05.000"
)

// restoreTime is a node's last restore of a snapshot: its time and the CPU
// it used, from the node's metrics.
type restoreTime struct {
	Secs    float64 `json:"secs"`
	CPUSecs float64 `json:"cpu_secs"`
}

func restoreOf(m map[string]*dto.MetricFamily) restoreTime {
	return restoreTime{gauge(m, "moonraft_snapshot_restore_seconds"), gauge(m, "moonraft_snapshot_restore_cpu_seconds")}
}

func (r restoreTime) String() string {
	if r.Secs == 0 {
		return "no snapshot restored"
	}
	return fmt.Sprintf("its snapshot restored in %.1f s, using %.2f s of CPU", r.Secs, r.CPUSecs)
}
