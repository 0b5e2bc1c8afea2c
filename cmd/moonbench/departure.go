package main

import (
	"context"
	"fmt"
	"io"
	"time"
)

// departureResult is what the departure of half the clients at once cost
// (issue 41): their sessions' expiry, the removal of their objects at the
// export's pace, and a probe's writes meanwhile.
type departureResult struct {
	Clients         int     `json:"clients"` // stopped pinging at once
	ObjectsBefore   uint64  `json:"objects_before"`
	ObjectsRemoved  uint64  `json:"objects_removed"`
	ExpiredSecs     float64 `json:"expired_secs"`  // last ping to every one of their sessions gone
	ExportedSecs    float64 `json:"exported_secs"` // to etcd holding every REMOVE
	ProbeWrites     int     `json:"probe_writes"`
	ProbeFailed     int     `json:"probe_failed"`
	ProbeP99Ms      float64 `json:"probe_p99_ms"`
	ProbeMaxMs      float64 `json:"probe_max_ms"`
	OthersExpired   int     `json:"others_expired"` // sessions of clients still pinging that expired
	ProbeFirstError string  `json:"probe_first_error,omitempty"`
	// ProbeFailedAt is when each failed put pair began, in seconds after
	// the last ping, to lay beside the progress lines' backlog.
	ProbeFailedAt []float64 `json:"probe_failed_at,omitempty"`
	LeaderChanges int       `json:"leader_changes"`
	// BacklogMax and WaitingMax are the most OpLog entries waiting for
	// etcd, and the most writes waiting for room among them, in the
	// leader's status polled every 100 ms.
	BacklogMax uint64 `json:"backlog_max"`
	WaitingMax uint64 `json:"writes_waiting_max"`
	// SlowLogWrites counts the Raft log writes over slowLogThreshold on
	// every node meanwhile: a write stuck past its deadline once admitted
	// waits on the log's disk, or on something else.
	SlowLogWrites int64 `json:"slow_log_writes"`
	// The collector on each node meanwhile: a soft memory limit that left
	// the heap no room made it run back to back (RELIABILITY finding 25).
	GC []nodeGC `json:"gc"`
}

// nodeGC is what one node's collector did over a phase.
type nodeGC struct {
	ID      string  `json:"id"`
	PerMin  float64 `json:"cycles_per_min"`
	Limited bool    `json:"cpu_limiter_engaged"` // Go's GC CPU limiter
}

// gcState is a node's collections so far and the last cycle in which the
// GC CPU limiter engaged (0: never); ok is false if its metrics could not
// be read.
type gcState struct {
	cycles, limited float64
	ok              bool
}

func (s *scaleRun) gcStates(ctx context.Context) []gcState {
	out := make([]gcState, len(s.lc.procs))
	for i, p := range s.lc.procs {
		if m, err := s.metrics(ctx, p); err == nil {
			out[i] = gcState{gauge(m, "go_gc_cycles_total_gc_cycles_total"), gauge(m, "go_gc_limiter_last_enabled_gc_cycle"), true}
		}
	}
	return out
}

// gcSince is what each node's collector did from before to now, over d.
func (s *scaleRun) gcSince(ctx context.Context, before []gcState, d time.Duration) []nodeGC {
	var out []nodeGC
	for i, now := range s.gcStates(ctx) {
		if !now.ok || !before[i].ok {
			continue
		}
		out = append(out, nodeGC{ID: s.lc.procs[i].ID, PerMin: (now.cycles - before[i].cycles) / d.Minutes(),
			Limited: now.limited > before[i].limited})
	}
	return out
}

// departureStill is how long a departure may go with no session expiring
// and nothing exported before the harness gives up on it.
const departureStill = 2 * time.Minute

// departure stops the pings of the second half of the clients at once,
// as when a rack of inference hosts goes away, and follows the leader
// until their sessions have expired and etcd holds the REMOVE of every
// object that lived in their segments, while a probe writes. The fill's
// owners and the probe's are in the first half.
func (s *scaleRun) departure(ctx context.Context) (*departureResult, error) {
	leaving := s.clients[len(s.clients)/2:]
	stay := len(s.clients) - len(leaving)
	_, before, err := s.leaderStatus(ctx)
	if err != nil {
		return nil, err
	}
	r := &departureResult{Clients: len(leaving), ObjectsBefore: before.Objects}
	pr, err := s.startProbe(ctx, "departure")
	if err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Second)
	progressf("departure: %d of %d clients stop pinging at once", len(leaving), len(s.clients))
	gc0 := s.gcStates(ctx)
	slow0, err := s.lc.slowLogWrites(ctx)
	if err != nil {
		pr.finish()
		return nil, err
	}
	t0 := time.Now()
	if err := s.keepers.stop(ctx, stay, len(s.clients)); err != nil {
		pr.finish()
		return nil, err
	}
	var (
		last   time.Time
		target uint64 // the OpLog seq of the last REMOVE, once known
		term   = before.Term
		// The departure is given up on once it stops moving, not at a
		// fixed time: at 6M objects in hash order etcd took the 3M REMOVEs
		// for over 10 minutes, moving all along.
		moved    = t0
		progress [2]uint64 // sessions, exported seq
	)
	for {
		// The leader's: only it knows what etcd has taken.
		nl, st, err := s.leaderStatus(ctx)
		if err != nil {
			pr.finish()
			return nil, fmt.Errorf("departure: the leader's status: %w", err)
		}
		if st.Term != term {
			progressf("departure: %s leads in term %d", nl.ID, st.Term)
			r.LeaderChanges++
			term = st.Term
		}
		if r.ExpiredSecs == 0 && st.Sessions <= uint64(stay) {
			r.ExpiredSecs = time.Since(t0).Seconds()
			r.OthersExpired = stay - int(st.Sessions)
		}
		// Once the sessions are gone and no REMOVE waits to enter the
		// ring, every one of them has a seq at or below the applied one.
		if target == 0 && r.ExpiredSecs > 0 && st.ExportDeferred == 0 {
			target = st.AppliedSeq
		}
		r.BacklogMax = max(r.BacklogMax, st.AppliedSeq-st.ExportedSeq)
		r.WaitingMax = max(r.WaitingMax, st.WritesPaced)
		done := target > 0 && st.ExportedSeq >= target
		if done || time.Since(last) >= scaleSampleGap {
			progressf("departure: %.0f s, %d sessions, %d objects, %d removals deferred, export backlog %d",
				time.Since(t0).Seconds(), st.Sessions, st.Objects, st.ExportDeferred, st.AppliedSeq-st.ExportedSeq)
			last = time.Now()
		}
		if done {
			r.ExportedSecs = time.Since(t0).Seconds()
			r.GC = s.gcSince(ctx, gc0, time.Since(t0))
			slow, err := s.lc.slowLogWrites(ctx)
			if err != nil {
				pr.finish()
				return nil, err
			}
			r.SlowLogWrites = slow - slow0
			r.ObjectsRemoved = before.Objects + pr.written() - min(before.Objects+pr.written(), st.Objects)
			break
		}
		if p := [2]uint64{st.Sessions, st.ExportedSeq}; p != progress {
			progress, moved = p, time.Now()
		}
		if time.Since(moved) > departureStill {
			pr.finish()
			return nil, fmt.Errorf("departure: no session expired and nothing exported for %s, %.0f s in (%d sessions, %d removals deferred)",
				departureStill, time.Since(t0).Seconds(), st.Sessions, st.ExportDeferred)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var lat []float64
	for _, o := range pr.finish() {
		if o.at.Before(t0) {
			continue
		}
		r.ProbeWrites++
		if o.err != nil {
			if r.ProbeFailed == 0 {
				r.ProbeFirstError = o.err.Error()
			}
			r.ProbeFailed++
			r.ProbeFailedAt = append(r.ProbeFailedAt, o.at.Sub(t0).Seconds())
		}
		ms := float64(o.lat.Microseconds()) / 1000
		lat = append(lat, ms)
		r.ProbeMaxMs = max(r.ProbeMaxMs, ms)
	}
	r.ProbeP99Ms = percentile(lat, 0.99)
	return r, nil
}

func (r *departureResult) print(w io.Writer) {
	fmt.Fprintf(w, "\n%d of the clients stop pinging at once, with %d objects\n", r.Clients, r.ObjectsBefore)
	fmt.Fprintf(w, "  their sessions expired within %.1f s (%d of the others' expired); %d objects removed, etcd held every REMOVE %.1f s after the last ping\n",
		r.ExpiredSecs, r.OthersExpired, r.ObjectsRemoved, r.ExportedSecs)
	fmt.Fprintf(w, "  a probe's put pairs meanwhile: %d, %d failed, p99 %.1f ms, slowest %.1f ms; %d leader changes; %d Raft log writes over %.0f ms on the nodes\n",
		r.ProbeWrites, r.ProbeFailed, r.ProbeP99Ms, r.ProbeMaxMs, r.LeaderChanges, r.SlowLogWrites, slowLogThreshold*1000)
	fmt.Fprintf(w, "  the leader's export backlog at most %d entries, at most %d writes waiting for room in it\n", r.BacklogMax, r.WaitingMax)
	if r.ProbeFirstError != "" {
		fmt.Fprintf(w, "  the first failed put pair: %s\n", r.ProbeFirstError)
		fmt.Fprintf(w, "  the failed ones began at (s):")
		for _, at := range r.ProbeFailedAt {
			fmt.Fprintf(w, " %.1f", at)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  collections a minute meanwhile:")
	limited := 0
	for _, g := range r.GC {
		fmt.Fprintf(w, " %s %.1f", g.ID, g.PerMin)
		if g.Limited {
			limited++
		}
	}
	fmt.Fprintf(w, "; Go's GC CPU limiter engaged on %d of %d nodes\n", limited, len(r.GC))
}
