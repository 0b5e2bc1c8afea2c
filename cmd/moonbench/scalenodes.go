package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/internal/localcluster"
)

// failover SIGKILLs the leader under the probe's writes: the time to the
// next answered write, and whether every client's session survived; then
// it restarts the old leader on its data dir and times its catch-up.
func (s *scaleRun) failover(ctx context.Context, n uint64, r *scaleResult) error {
	l, err := s.lc.leader(ctx)
	if err != nil {
		return err
	}
	pr, err := s.startProbe(ctx, "failover")
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	progressf("failover: killing the leader %s", l.ID)
	kill := time.Now()
	l.Kill()
	profiled := s.profileSurvivors(ctx, l, fmt.Sprintf("scale-%d-failover", n))
	defer profiled()
	nl, err := s.lc.leader(ctx)
	if err != nil {
		pr.finish()
		return err
	}
	r.FailoverPromotedMs = float64(time.Since(kill).Microseconds()) / 1000
	for deadline := time.Now().Add(30 * time.Second); r.FailoverMs == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			pr.finish()
			return fmt.Errorf("no write answered within 30 s of killing the leader %s", l.ID)
		}
		r.FailoverMs = pr.firstAnsweredAfter(kill)
	}
	pr.finish()
	progressf("restarting %s on its data dir", l.ID)
	t0 := time.Now()
	if err := l.Start(); err != nil {
		return err
	}
	if err := s.lc.caughtUp(ctx, l); err != nil {
		return err
	}
	r.RestartSecs = time.Since(t0).Seconds()
	// A session the failover cost has expired by now: a client TTL
	// (10 s) after the kill, with every client pinging.
	time.Sleep(time.Until(kill.Add(12 * time.Second)))
	st, err := s.lc.cl.Progress(ctx, nl.GRPCAddr)
	if err != nil {
		return err
	}
	r.SessionsLost = len(s.clients) - int(st.Sessions)
	return nil
}

// profileSurvivors saves, with --profile, a CPU profile of each node but
// dead for failoverProfile from now (the election, the promotion and the
// first writes), as <prefix>-<id>.cpu; the returned func waits for them.
func (s *scaleRun) profileSurvivors(ctx context.Context, dead *localcluster.Node, prefix string) (wait func()) {
	var wg sync.WaitGroup
	if s.cfg.profileDir == "" {
		return wg.Wait
	}
	for _, p := range s.lc.procs {
		if p == dead {
			continue
		}
		wg.Go(func() {
			path := filepath.Join(s.cfg.profileDir, fmt.Sprintf("%s-%s.cpu", prefix, p.ID))
			which := fmt.Sprintf("profile?seconds=%d", int(failoverProfile/time.Second))
			if err := savePprof(ctx, p, which, path); err != nil {
				progressf("no failover profile of %s: %v", p.ID, err)
			}
		})
	}
	return wg.Wait
}

// failoverProfile is how long a failover's CPU profiles run.
const failoverProfile = 3 * time.Second

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
	return nil
}

// clockFormat is how the snapshots' progress lines give the time of day,
// to match with profileWindows' file names.
const clockFormat = "15:04:05.0"
