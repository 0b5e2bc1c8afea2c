package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/mckeeper"

	"github.com/moonraft/moonraft/internal/svgplot"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The scale harness's results, as its report prints and plots them.

// scaleNode is one node's figures at a size.
type scaleNode struct {
	ID            string  `json:"id"`
	Role          string  `json:"role"`
	RSSBytes      float64 `json:"rss_bytes"`
	HeapBytes     float64 `json:"heap_inuse_bytes"`
	LiveBytes     float64 `json:"heap_live_bytes"` // marked live by the last collection
	SnapshotBytes float64 `json:"snapshot_bytes"`
	SnapshotSecs  float64 `json:"snapshot_secs"` // mean of the snapshots written in the window
	// Of the last of those, the writer's CPU and the file's syncs: the
	// rest of its time the writer waited for a CPU.
	SnapshotCPUSecs  float64 `json:"snapshot_cpu_secs"`
	SnapshotSyncSecs float64 `json:"snapshot_sync_secs"`
	// SchedStalls counts the times from the fill to the snapshots that
	// the node's goroutines waited over a quarter of its heartbeat
	// timeout to run (moonraft_stalls_total{kind="sched"}).
	SchedStalls float64 `json:"sched_stalls"`
	// ClockSteps counts the steps of the host's wall clock the node saw
	// over the same span (moonraft_wall_clock_steps_total): a leader's
	// clock leaves them out (docs/RELIABILITY.md, finding 34).
	ClockSteps float64 `json:"clock_steps"`
}

// scaleResult is what one size measured.
type scaleResult struct {
	Objects      uint64  `json:"objects"`
	Clients      int     `json:"clients"`
	Pings        string  `json:"pings"` // the clients' protocol
	FillSecs     float64 `json:"fill_secs"`
	FillFailures int64   `json:"fill_failed_calls"`
	// Elections is how far the leader's term moved from before the fill
	// to after the snapshots, the failover aside: a leader that lost its
	// lease under the load (docs/RELIABILITY.md, finding 27).
	Elections uint64 `json:"elections"`
	// LeaseReads and QuorumReads count the reads the nodes served from the
	// fill to the snapshots under the read lease and after waiting for a
	// quorum round: the second are reads that found the lease lapsed.
	LeaseReads  float64 `json:"lease_reads"`
	QuorumReads float64 `json:"quorum_reads"`
	// PingsAnswered and PingsSlow count the Mooncake clients' pings the nodes
	// answered from the fill to the snapshots, and those they took over
	// the clients' interval between pings (mckeeper.PingEvery) to answer;
	// a ping a follower forwards counts there and at the leader.
	PingsAnswered float64 `json:"pings_answered"`
	PingsSlow     float64 `json:"pings_slow"`
	// FillClientsCPU is the cores the clients' process used during the
	// fill: CPU that clients on hosts of their own would not take from
	// the nodes.
	FillClientsCPU     float64         `json:"fill_clients_cpu"`
	Nodes              []scaleNode     `json:"nodes"`
	IdleLogBytesSec    float64         `json:"idle_raft_log_bytes_per_sec"`
	IdleLogEntrySec    float64         `json:"idle_raft_log_entries_per_sec"`
	IdleLeaderCPU      float64         `json:"idle_leader_cpu_cores"`
	IdleEtcdTxnsSec    float64         `json:"idle_etcd_txns_per_sec"`
	IdleEtcdBytesSec   float64         `json:"idle_etcd_bytes_per_sec"`
	WriteP99Ms         float64         `json:"write_p99_ms"`          // outside every node's snapshot
	WriteP99SnapMs     float64         `json:"write_p99_snapshot_ms"` // overlapping one
	WritesInSnap       int             `json:"writes_during_snapshots"`
	PacedSec           float64         `json:"writes_paced_per_sec"`          // by the export's flow control, outside snapshots
	PacedSnapSec       float64         `json:"writes_paced_per_sec_snapshot"` // during one
	FailoverMs         float64         `json:"failover_ms"`                   // leader SIGKILL to the next answered write, the kills' median
	FailoverMaxMs      float64         `json:"failover_max_ms"`               // the slowest kill's
	FailoverPromotedMs float64         `json:"failover_promoted_ms"`          // to a promoted leader's status, the median
	Kills              []killResult    `json:"kills"`
	SessionsLost       int             `json:"sessions_lost_in_failover"` // over every kill
	Remounts           int             `json:"remounts"`                  // by every client, over this size's phases
	RemountsByPhase    []phaseCount    `json:"remounts_by_phase"`
	RemountCauses      *remountCausesT `json:"remount_causes,omitempty"` // the Mooncake clients'
	RestartSecs        float64         `json:"restart_secs"`             // the kills' median
	JoinSecs           float64         `json:"join_secs"`
	JoinBySnapshot     bool            `json:"join_by_snapshot"` // the leader sent the joining node a snapshot
	JoinRestore        restoreTime     `json:"join_restore"`
}

// phaseCount is a count within one phase of a size's run.
type phaseCount struct {
	Phase string `json:"phase"`
	N     int    `json:"n"`
}

// scaleSample is the nodes' memory at a point of the fill.
type scaleSample struct {
	T       float64   `json:"t"`
	Objects uint64    `json:"objects"`
	RSS     []float64 `json:"rss_bytes"` // by node, n0 first
	Heap    []float64 `json:"heap_inuse_bytes"`
}

type scaleReport struct {
	Machine string        `json:"machine"`
	Date    string        `json:"date"`
	Args    string        `json:"args"`
	Sizes   []scaleResult `json:"sizes"`
	// Departure is measured once, after the largest size.
	Departure *departureResult `json:"departure,omitempty"`
	Samples   []scaleSample    `json:"samples"`
}

// remountCausesT is what the Mooncake clients' pings had seen before
// their remounts: a silence under the session TTL means the master forgot
// a client that kept pinging; a longer one, that the pings had stopped
// reaching it, and the last error says how.
type remountCausesT struct {
	SilenceMedianSecs float64 `json:"silence_median_secs"`
	SilenceMaxSecs    float64 `json:"silence_max_secs"`
	SinceOKMedianSecs float64 `json:"since_ok_median_secs"`
	// Of each client's last connection before its remount: its lookup's
	// and its dial's time, the longest, and how long before the remount.
	LookUpMedianSecs  float64      `json:"look_up_median_secs"`
	LookUpMaxSecs     float64      `json:"look_up_max_secs"`
	DialMedianSecs    float64      `json:"dial_median_secs"`
	DialMaxSecs       float64      `json:"dial_max_secs"`
	DialAgoMedianSecs float64      `json:"dial_ago_median_secs"`
	TookMedianSecs    float64      `json:"took_median_secs"`
	TookMaxSecs       float64      `json:"took_max_secs"`
	UnderTTL          int          `json:"under_ttl"` // of the default session TTL
	FailedMedian      float64      `json:"failed_median"`
	LastErrors        []errorCount `json:"last_errors"` // the commonest first
	Remounts          []remountRec `json:"remounts"`
}

type errorCount struct {
	Error string `json:"error"`
	N     int    `json:"n"`
}

type remountRec struct {
	Client      int     `json:"client"`
	At          string  `json:"at"` // RFC 3339, ms
	SilenceSecs float64 `json:"silence_secs"`
	SinceOKSecs float64 `json:"since_ok_secs"` // from the last ping answered OK
	// The client's last connection before: when (before At), its lookup,
	// its dial, and its error if it failed.
	DialAgoSecs float64 `json:"dial_ago_secs"`
	LookUpSecs  float64 `json:"look_up_secs"`
	DialSecs    float64 `json:"dial_secs"`
	DialErr     string  `json:"dial_err,omitempty"`
	DialAddr    string  `json:"dial_addr,omitempty"`
	TookSecs    float64 `json:"took_secs"` // the NEED_REMOUNT ping's wait for its answer
	Failed      int     `json:"failed"`
	LastErr     string  `json:"last_err,omitempty"`
}

// remountCauses sums up the remounts' records; nil if there were none.
func remountCauses(rs []remountEvent) *remountCausesT {
	if len(rs) == 0 {
		return nil
	}
	ttl := time.Duration(fsm.DefaultParams().ClientTTLMs) * time.Millisecond
	c := &remountCausesT{}
	silences := make([]float64, len(rs))
	since := make([]float64, len(rs))
	took := make([]float64, len(rs))
	failed := make([]float64, len(rs))
	var lookUps, dials, dialAgos []float64
	errs := map[string]int{}
	for i, r := range rs {
		silences[i], since[i], took[i], failed[i] = r.Silence.Seconds(), r.SinceOK.Seconds(), r.Took.Seconds(), float64(r.Failed)
		if r.Silence < ttl {
			c.UnderTTL++
		}
		errs[r.LastErr]++
		c.Remounts = append(c.Remounts, remountRec{Client: r.client, At: r.At.UTC().Format("2006-01-02T15:04:05.000Z07:00"),
			SilenceSecs: r.Silence.Seconds(), SinceOKSecs: r.SinceOK.Seconds(), TookSecs: r.Took.Seconds(), Failed: r.Failed, LastErr: r.LastErr})
		if d := r.LastDial; !d.At.IsZero() {
			rec := &c.Remounts[len(c.Remounts)-1]
			rec.DialAgoSecs, rec.LookUpSecs, rec.DialSecs, rec.DialErr, rec.DialAddr = r.At.Sub(d.At).Seconds(), d.LookUp.Seconds(), d.Dial.Seconds(), d.Err, d.Addr
			lookUps, dials, dialAgos = append(lookUps, rec.LookUpSecs), append(dials, rec.DialSecs), append(dialAgos, rec.DialAgoSecs)
		}
	}
	c.SilenceMedianSecs, c.SilenceMaxSecs, c.FailedMedian = median(silences), slices.Max(silences), median(failed)
	c.TookMedianSecs, c.TookMaxSecs, c.SinceOKMedianSecs = median(took), slices.Max(took), median(since)
	if len(dials) > 0 {
		c.LookUpMedianSecs, c.LookUpMaxSecs = median(lookUps), slices.Max(lookUps)
		c.DialMedianSecs, c.DialMaxSecs, c.DialAgoMedianSecs = median(dials), slices.Max(dials), median(dialAgos)
	}
	for e, n := range errs {
		c.LastErrors = append(c.LastErrors, errorCount{e, n})
	}
	slices.SortFunc(c.LastErrors, func(a, b errorCount) int { return cmp.Or(b.N-a.N, strings.Compare(a.Error, b.Error)) })
	return c
}

// text is the causes in a line.
func (c *remountCausesT) text() string {
	var errs []string
	for _, e := range c.LastErrors[:min(3, len(c.LastErrors))] {
		msg := e.Error
		if msg == "" {
			msg = "none"
		}
		errs = append(errs, fmt.Sprintf("%d %q", e.N, msg))
	}
	return fmt.Sprintf("the client's longest silence in the 30 s before (from sending a ping answered OK to the next answer OK or NEED_REMOUNT) %.1f s (median; at most %.1f s), %d of %d under the %.0f s TTL; from the last ping answered OK %.1f s (median); the NEED_REMOUNT ping answered in %.1f s (median; at most %.1f s); %.0f pings failed since the last OK (median); the last failed one's error: %s",
		c.SilenceMedianSecs, c.SilenceMaxSecs, c.UnderTTL, len(c.Remounts), float64(fsm.DefaultParams().ClientTTLMs)/1000, c.SinceOKMedianSecs, c.TookMedianSecs, c.TookMaxSecs,
		c.FailedMedian, strings.Join(errs, ", ")) + c.dialsText()
}

// dialsText is the clients' last connections in words, "" if none had
// dialled.
func (c *remountCausesT) dialsText() string {
	if !slices.ContainsFunc(c.Remounts, func(r remountRec) bool { return r.DialAgoSecs > 0 }) {
		return ""
	}
	return fmt.Sprintf("; the client's last connection, %.1f s before (median): the master looked up in %.1f s, dialled in %.1f s (medians; at most %.1f and %.1f s)",
		c.DialAgoMedianSecs, c.LookUpMedianSecs, c.DialMedianSecs, c.LookUpMaxSecs, c.DialMaxSecs)
}

// remountsText is the size's remounts, by phase if there were any.
func (r *scaleResult) remountsText() string {
	if r.Remounts == 0 {
		return "0 remounts"
	}
	var by []string
	for _, p := range r.RemountsByPhase {
		if p.N > 0 {
			by = append(by, fmt.Sprintf("%d during the %s", p.N, p.Phase))
		}
	}
	return fmt.Sprintf("%d remounts (%s)", r.Remounts, strings.Join(by, ", "))
}

func (r *scaleResult) print(w io.Writer) {
	fmt.Fprintf(w, "\n%d objects, %d clients pinging over %s (filled in %.0f s, %d failed calls, the clients' process using %.2f cores; elections from the fill to the snapshots: %d)\n",
		r.Objects, r.Clients, r.Pings, r.FillSecs, r.FillFailures, r.FillClientsCPU, r.Elections)
	fmt.Fprintf(w, "  %-4s %-8s %10s %9s %10s %9s %10s %9s %12s %9s %7s %12s\n", "node", "role", "RSS MB", "B/object", "heap MB", "B/object", "live MB", "B/object", "snapshot MB", "save s", "stalls", "clock steps")
	for _, n := range r.Nodes {
		fmt.Fprintf(w, "  %-4s %-8s %10.0f %9.0f %10.0f %9.0f %10.0f %9.0f %12.1f %9.2f %7.0f %12.0f\n", n.ID, n.Role, n.RSSBytes/1e6, n.RSSBytes/float64(r.Objects),
			n.HeapBytes/1e6, n.HeapBytes/float64(r.Objects), n.LiveBytes/1e6, n.LiveBytes/float64(r.Objects), n.SnapshotBytes/1e6, n.SnapshotSecs, n.SchedStalls, n.ClockSteps)
	}
	var spent []string
	for _, n := range r.Nodes {
		spent = append(spent, fmt.Sprintf("%s %.2f s and %.2f s", n.ID, n.SnapshotCPUSecs, n.SnapshotSyncSecs))
	}
	fmt.Fprintf(w, "  of the last snapshot's time, the writer's CPU and the file's syncs (the rest it waited for a CPU): %s\n", strings.Join(spent, "; "))
	fmt.Fprintf(w, "  reads: %.0f under the read lease, %.0f after waiting for a quorum round; Mooncake pings answered %.0f, over %s %.0f\n",
		r.LeaseReads, r.QuorumReads, r.PingsAnswered, mckeeper.PingEvery, r.PingsSlow)
	fmt.Fprintf(w, "  write p99 %.1f ms outside snapshots, %.1f ms during one (%d writes); writes paced by the export %.0f/s outside, %.0f/s during\n",
		r.WriteP99Ms, r.WriteP99SnapMs, r.WritesInSnap, r.PacedSec, r.PacedSnapSec)
	fmt.Fprintf(w, "  idle: Raft log %.0f B/s (%.1f entries/s), leader CPU %.2f cores, etcd %.1f txns/s %.0f B/s\n",
		r.IdleLogBytesSec, r.IdleLogEntrySec, r.IdleLeaderCPU, r.IdleEtcdTxnsSec, r.IdleEtcdBytesSec)
	fmt.Fprintf(w, "  failover %.0f ms to the next answered write (%.0f ms to a promoted leader), the median of %d kills, the slowest %.0f ms; %d sessions lost, %s; restart caught up in %.1f s (median), a fresh node joined in %.1f s (%s)\n",
		r.FailoverMs, r.FailoverPromotedMs, len(r.Kills), r.FailoverMaxMs, r.SessionsLost, r.remountsText(), r.RestartSecs, r.JoinSecs, map[bool]string{true: "sent a snapshot", false: "sent the log"}[r.JoinBySnapshot])
	if r.RemountCauses != nil {
		fmt.Fprintf(w, "  remounts: %s\n", r.RemountCauses.text())
	}
	fmt.Fprintf(w, "  the joining node: %s\n", r.JoinRestore)
	for k, kr := range r.Kills {
		fmt.Fprintf(w, "  kill %d: the next write answered at %.0f ms, a promoted leader seen at %.0f ms; the old leader caught up %.1f s after its restart (%s); %s\n",
			k+1, kr.FailoverMs, kr.PromotedMs, kr.RestartSecs, kr.Restore, kr.overflowsText())
		for _, c := range kr.ProbeCalls {
			outcome := "answered"
			if c.Error != "" {
				outcome = c.Error
			}
			fmt.Fprintf(w, "    the probe's write sent at %.0f ms ended at %.0f ms: %s\n", c.SentMs, c.EndedMs, outcome)
		}
		for _, f := range kr.Followers {
			fmt.Fprintf(w, "    %s last heard from the leader at %.0f ms; its commit index moved %.0f entries after the kill, the last move seen at %.0f ms; its log took %.0f more entries, the last at %.0f ms; its applied index last moved at %.0f ms (%.0f committed entries unapplied at the kill); from 2 s before the kill to the promotion %d log writes, the slowest within %.0f ms, and %.0f stalls\n",
				f.ID, f.LastContactMs, f.CommittedAfter, f.LastCommitMs, f.AppendedAfter, f.LastAppendMs, f.AppliedMs, f.UnappliedAtKill, f.LogAppends, f.SlowestAppendMs, f.Stalls)
		}
		for _, h := range []struct {
			span string
			w    hostWindow
		}{{"from the kill to the promotion", kr.Host}, {"in the 2 s before the kill", kr.HostBefore}} {
			fmt.Fprintf(w, "    host %s (%.0f ms): the kernel took %.0f ms of CPU, softirqs %.0f ms, the hypervisor %.0f ms; ksoftirqd waited %.0f ms for a CPU; %d softirqs out of budget\n",
				h.span, h.w.Ms, h.w.SystemMs, h.w.SoftirqMs, h.w.StealMs, h.w.KsoftirqdWaitMs, h.w.Squeezed)
		}
	}
}

// overflowsText is the kill's ListenOverflows in words.
func (kr killResult) overflowsText() string {
	if kr.ListenOverflows < 0 {
		return "the host's listen queue overflows unread"
	}
	return fmt.Sprintf("%d connections turned away by a full listen queue from the kill to the count of sessions", kr.ListenOverflows)
}

// plot draws each node's RSS and Go heap against the objects held.
func (rep *scaleReport) plot(path string) error {
	panel := func(title string, of func(scaleSample) []float64) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "objects (millions)"
		p.Y.Label.Text = "GB"
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		for node := 0; len(rep.Samples) > 0 && node < len(of(rep.Samples[0])); node++ {
			var xys plotter.XYs
			for _, sm := range rep.Samples {
				xys = append(xys, plotter.XY{X: float64(sm.Objects) / 1e6, Y: of(sm)[node] / 1e9})
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return nil, err
			}
			l.Color = plotutil.Color(node)
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("n%d", node), l)
		}
		return p, nil
	}
	rss, err := panel("resident memory by node while filling", func(s scaleSample) []float64 { return s.RSS })
	if err != nil {
		return err
	}
	heap, err := panel("Go heap in use by node while filling", func(s scaleSample) []float64 { return s.Heap })
	if err != nil {
		return err
	}
	return svgplot.WriteGrid(path, [][]*plot.Plot{{rss}, {heap}}, 10*vg.Inch, 3*vg.Inch)
}
