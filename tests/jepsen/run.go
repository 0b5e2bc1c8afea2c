package jepsen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/internal/localcluster"
	"github.com/moonraft/moonraft/oplog"
)

// runConfig is one run of the suite.
type runConfig struct {
	name         string
	seed         uint64
	chaos        time.Duration // how long the workload runs under the schedule
	schedule     []event
	workload     workloadConfig
	snapEvery    time.Duration // leader snapshots during the run, for the replay check
	checkTimeout time.Duration // porcupine's budget
	nodeArgs     []string
	command      string        // how to replay this run
	sampleEvery  time.Duration // > 0: sample the nodes' resources and fail on growth (the soak)
}

// summary is everything a run found; summary.json holds it.
type summary struct {
	Run      string         `json:"run"`
	Seed     uint64         `json:"seed"`
	Command  string         `json:"command"`
	Chaos    string         `json:"chaos"`
	Schedule []event        `json:"schedule"`
	Rows     []row          `json:"rows"`
	Register registerResult `json:"register"`
	// RegisterSettled: how the OpLog settled unknown register outcomes.
	RegisterSettled registerStats `json:"register_settled"`
	Set             setResult     `json:"set"`
	Lease           leaseResult   `json:"lease"`
	End             endResult     `json:"end"`
	Violations      []violation   `json:"violations,omitempty"`
	Problems        []string      `json:"problems,omitempty"`
	OutDir          string        `json:"out_dir"`
}

// cell counts one workload's ops under one nemesis.
type cell struct {
	Ops        int `json:"ops"`
	Unknown    int `json:"unknown"`
	Violations int `json:"violations"`
}

// row is one line of the report: a nemesis (or "none", the quiet gaps).
type row struct {
	Nemesis string          `json:"nemesis"`
	Events  int             `json:"events"`
	Held    time.Duration   `json:"held_ns"`
	Cells   map[string]cell `json:"cells"`
}

// runJepsen runs cfg against a fresh cluster and fails t, naming the
// output files, on any violation.
func runJepsen(t *testing.T, cfg runConfig) summary {
	stamp := time.Now().Format("20060102-150405")
	outDir := filepath.Join(localcluster.RepoRoot(), "tests", "out", fmt.Sprintf("%s-%s-seed%d", cfg.name, stamp, cfg.seed))
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	seedNote := fmt.Sprintf("seed %d\nreplay: %s\n", cfg.seed, cfg.command)
	if err := os.WriteFile(filepath.Join(outDir, "seed.txt"), []byte(seedNote), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("jepsen %s: seed %d (replay: %s), output in %s", cfg.name, cfg.seed, cfg.command, outDir)

	events, err := os.Create(filepath.Join(outDir, "events.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer events.Close()
	var logMu sync.Mutex
	logf := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		logMu.Lock()
		fmt.Fprintf(events, "%s %s\n", time.Now().Format("15:04:05.000"), msg)
		logMu.Unlock()
		t.Log(msg)
	}
	for _, e := range cfg.schedule {
		logf("scheduled: %s", e)
	}

	binDir := t.TempDir()
	bin, err := buildMoonraft(binDir, "failpoints") // the slow-disk nemesis
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	ctx := context.Background()
	c, err := startCluster(ctx, bin, outDir, dataDir, clusterConfig{nodes: 3, extraArgs: cfg.nodeArgs, diskMB: 1024}, logf)
	if c != nil {
		defer c.close()
	}
	if err != nil {
		t.Fatalf("start cluster: %v (logs in %s)", err, outDir)
	}
	logf("cluster up: %d nodes, etcd %s, follower %s", len(c.nodes), c.etcdURL, c.follower.grpcAddr)

	var eps []string
	for _, p := range c.nodes {
		eps = append(eps, p.grpcAddr)
	}
	rec := newRecorder()
	w := newWorkers(cfg.workload, rec, eps, cfg.seed)
	defer w.close()
	setupCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = w.setup(setupCtx)
	cancel()
	if err != nil {
		t.Fatalf("workload setup: %v", err)
	}

	tap := newOplogTap(c.store)
	tapCtx, stopTap := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { tap.run(tapCtx, 500*time.Millisecond) })

	// Leader snapshots: the first before any fault, then periodically; the
	// replay check starts from the oldest one etcd still covers.
	var (
		snapMu sync.Mutex
		snaps  []savedSnapshot
		end    endResult
	)
	snapCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = retry(snapCtx, func(ctx context.Context) error {
		s, _, err := takeSnapshot(ctx, c, dataDir, 0)
		if err == nil {
			snaps = append(snaps, s)
		}
		return err
	})
	cancel()
	if err != nil {
		t.Fatalf("first snapshot: %v", err)
	}
	end.SnapshotsChecked++

	chaosCtx, stopChaos := context.WithTimeout(ctx, cfg.chaos)
	defer stopChaos()
	startUnixMs := time.Now().UnixMilli() - time.Since(rec.start).Milliseconds()
	w.run(chaosCtx)
	var nemErr error
	bg.Go(func() { nemErr = nemesisRun(chaosCtx, c, rec, cfg.schedule, logf) })
	var soak *sampler
	if cfg.sampleEvery > 0 {
		soak = newSampler(c)
		bg.Go(func() { soak.run(chaosCtx, cfg.sampleEvery, cfg.chaos, logf) })
	}
	bg.Go(func() {
		for n := 1; ; n++ {
			if sleepCtx(chaosCtx, cfg.snapEvery) != nil {
				return
			}
			s, _, err := takeSnapshot(chaosCtx, c, dataDir, n)
			if bad, ok := err.(badSnapshot); ok {
				snapMu.Lock()
				end.fail("%v", bad.err)
				snapMu.Unlock()
				continue
			}
			if err != nil {
				// Under a fault the leader may not answer: not a finding.
				logf("snapshot %d not taken: %v", n, err)
				continue
			}
			snapMu.Lock()
			snaps = append(snaps, s)
			end.SnapshotsChecked++
			snapMu.Unlock()
		}
	})
	<-chaosCtx.Done()
	logf("chaos over: stopping clients")
	w.wait()
	stopTap()
	bg.Wait()
	if nemErr != nil {
		end.fail("nemesis: %v", nemErr)
	}
	if soak != nil {
		for _, v := range soak.verdicts() {
			end.fail("soak: %s", v)
		}
		if err := soak.write(outDir); err != nil {
			end.fail("soak: %v", err)
		}
		logf("soak: samples in %s, plot in %s", filepath.Join(outDir, "soak.csv"), filepath.Join(outDir, "soak.svg"))
	}

	// Heal everything, then read the set and check the cluster.
	if err := c.healAll(); err != nil {
		end.fail("%v", err)
	}
	if _, err := c.waitLeader(ctx, 60*time.Second); err != nil {
		end.fail("after healing: %v", err)
	}
	logf("healed; final reads")
	finalReads(ctx, c, rec, &end)
	logf("end-of-run checks")
	endChecks(ctx, c, tap, dataDir, snaps, &end)
	for _, p := range c.nodes {
		if reportsDataRace(p.LogPath) {
			end.fail("%s reported a data race (%s)", p.id, p.LogPath)
		}
	}

	if err := tap.poll(ctx); err != nil {
		end.fail("OpLog tap: %v", err)
	}
	tap.mu.Lock()
	end.Problems = append(end.Problems, tap.errs...)
	tap.mu.Unlock()

	// The history checks. The history and the OpLog are written first, so
	// a check that runs out of time leaves them behind (recheck them with
	// JEPSEN_RECHECK=<dir>).
	ops := rec.snapshot()
	entries := tap.entries()
	histPath := filepath.Join(outDir, "history.jsonl")
	if err := writeInputs(outDir, ops, entries, checkMeta{StartUnixMs: startUnixMs, Clients: len(w.clients)}); err != nil {
		t.Errorf("write history: %v", err)
	}
	s := summary{Run: filepath.Base(outDir), Seed: cfg.seed, Command: cfg.command, Chaos: cfg.chaos.String(),
		Schedule: cfg.schedule, End: end, OutDir: outDir}
	analyze(&s, ops, entries, checkMeta{StartUnixMs: startUnixMs, Clients: len(w.clients)}, cfg.checkTimeout, outDir)
	s.Problems = append(s.Problems, end.Problems...)
	byID := map[int]*Op{}
	for i := range ops {
		byID[ops[i].ID] = &ops[i]
	}
	js, _ := json.MarshalIndent(s, "", "  ")
	_ = os.WriteFile(filepath.Join(outDir, "summary.json"), js, 0o644)
	report := renderReport(s)
	_ = os.WriteFile(filepath.Join(outDir, "report.md"), []byte(report), 0o644)
	t.Log("\n" + report)

	if len(s.Violations) > 0 || len(s.Problems) > 0 {
		kept := filepath.Join(outDir, "data")
		if err := c.keepNodeData(kept); err != nil {
			t.Logf("keeping the nodes' data dirs in %s: %v", kept, err)
		}
		var b strings.Builder
		fmt.Fprintf(&b, "jepsen %s (seed %d) found %d violation(s) and %d problem(s):\n", cfg.name, cfg.seed, len(s.Violations), len(s.Problems))
		for i, v := range s.Violations {
			if i == 20 {
				fmt.Fprintf(&b, "  ... and %d more violations (summary.json, report.md)\n", len(s.Violations)-i)
				break
			}
			fmt.Fprintf(&b, "  violation %s\n", v)
			for _, id := range v.Ops {
				if op := byID[id]; op != nil {
					oj, _ := json.Marshal(op)
					fmt.Fprintf(&b, "    %s\n", oj)
				}
			}
		}
		for _, p := range s.Problems {
			fmt.Fprintf(&b, "  problem: %s\n", p)
		}
		fmt.Fprintf(&b, "history: %s\nseed: %s (replay: %s)\nlogs, summary and the nodes' data dirs: %s\n", histPath, filepath.Join(outDir, "seed.txt"), cfg.command, outDir)
		if s.Register.Visualized != "" {
			fmt.Fprintf(&b, "porcupine visualisation: %s\n", s.Register.Visualized)
		}
		t.Error(b.String())
	}
	return s
}

// checkMeta is what the checkers need beyond the history and the OpLog.
type checkMeta struct {
	StartUnixMs int64 `json:"start_unix_ms"` // the wall clock at the history's time 0
	Clients     int   `json:"clients"`
}

// writeInputs saves what the checkers read: history.jsonl, oplog.jsonl
// (the OpLog as the tap read it, one entry per line) and meta.json.
func writeInputs(dir string, ops []Op, entries []oplog.Entry, meta checkMeta) error {
	if err := writeHistory(filepath.Join(dir, "history.jsonl"), ops); err != nil {
		return err
	}
	var b bytes.Buffer
	for _, e := range entries {
		b.Write(e.Encode())
		b.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "oplog.jsonl"), b.Bytes(), 0o644); err != nil {
		return err
	}
	js, _ := json.Marshal(meta)
	return os.WriteFile(filepath.Join(dir, "meta.json"), js, 0o644)
}

// readInputs loads what writeInputs saved.
func readInputs(dir string) ([]Op, []oplog.Entry, checkMeta, error) {
	var meta checkMeta
	js, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, nil, meta, err
	}
	if err := json.Unmarshal(js, &meta); err != nil {
		return nil, nil, meta, err
	}
	var ops []Op
	hb, err := os.ReadFile(filepath.Join(dir, "history.jsonl"))
	if err != nil {
		return nil, nil, meta, err
	}
	dec := json.NewDecoder(bytes.NewReader(hb))
	for dec.More() {
		var op Op
		if err := dec.Decode(&op); err != nil {
			return nil, nil, meta, err
		}
		ops = append(ops, op)
	}
	ob, err := os.ReadFile(filepath.Join(dir, "oplog.jsonl"))
	if err != nil {
		return nil, nil, meta, err
	}
	var entries []oplog.Entry
	for _, line := range bytes.Split(ob, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		e, err := oplog.Decode(line)
		if err != nil {
			return nil, nil, meta, err
		}
		entries = append(entries, e)
	}
	return ops, entries, meta, nil
}

// analyze runs the history checkers and fills s.
func analyze(s *summary, ops []Op, entries []oplog.Entry, meta checkMeta, timeout time.Duration, outDir string) {
	ix := indexOpLog(entries)
	h, stats, problems := registerHistory(ops, entries, meta.StartUnixMs, meta.Clients)
	s.RegisterSettled = stats
	for _, p := range problems {
		s.Violations = append(s.Violations, violation{Workload: WRegister, Nemesis: "oplog", What: p})
	}
	var err error
	s.Register, err = checkRegister(h, timeout, outDir)
	if err != nil {
		s.Problems = append(s.Problems, err.Error())
	}
	for i, key := range s.Register.BadKeys {
		m := s.Register.BadOps[i]
		s.Violations = append(s.Violations, violation{Workload: WRegister, Nemesis: m.Nemesis, Ops: []int{m.ID},
			What: fmt.Sprintf("%s: history not linearizable; first op outside the longest linearizable prefix: %s", key, m)})
	}
	if s.Register.Result == "Unknown" {
		s.Problems = append(s.Problems, fmt.Sprintf("porcupine did not finish within %v", timeout))
	}
	var vs []violation
	s.Set, vs = checkSet(ops, ix)
	s.Violations = append(s.Violations, vs...)
	s.Lease, vs = checkLease(ops, ix)
	s.Violations = append(s.Violations, vs...)
	s.Problems = append(s.Problems, nonVacuous(ops, *s)...)
	s.Rows = table(ops, s.Schedule, s.Violations)
}

// finalReads reads every key the set workload put, after healing, and
// records the answers as final-read ops.
func finalReads(ctx context.Context, c *cluster, rec *recorder, r *endResult) {
	seen := map[string]bool{}
	var keys []string
	for _, op := range rec.snapshot() {
		if op.Workload == WSet && op.Kind == "put" && !seen[op.Key] {
			seen[op.Key] = true
			keys = append(keys, op.Key)
		}
	}
	sort.Strings(keys)
	const chunk = 500
	for i := 0; i < len(keys); i += chunk {
		batch := keys[i:min(i+chunk, len(keys))]
		var res []moonclient.ReplicaListResult
		ops := make([]*Op, len(batch))
		for j, k := range batch {
			ops[j] = rec.invoke(WSet, -1, "final-read", k, 0, false)
		}
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := retry(rctx, func(ctx context.Context) error {
			var err error
			res, err = c.admin.BatchGetReplicaList(ctx, batch)
			return err
		})
		cancel()
		for j, op := range ops {
			switch {
			case err != nil:
				rec.complete(op, outcome{status: StatusFail, err: err})
			case res[j].Err == nil:
				rec.complete(op, outcome{status: StatusOK, value: objectSize(res[j].Replicas)})
			case absent(res[j].Err):
				rec.complete(op, outcome{status: StatusOK, err: res[j].Err})
			default:
				rec.complete(op, outcome{status: StatusFail, err: res[j].Err})
			}
		}
		if err != nil {
			r.fail("final reads of the set: %v", err)
			return
		}
	}
}

// endChecks: equal applied index and digest everywhere; a leader snapshot
// that restores (no overlapping buffers) and keeps every invariant; etcd's
// OpLog contiguous and verified; the OpLog replayed over a snapshot gives
// the leader's object set; the etcd follower reaches it too.
func endChecks(ctx context.Context, c *cluster, tap *oplogTap, dataDir string, snaps []savedSnapshot, r *endResult) {
	converge(ctx, c, 60*time.Second, r)
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	var bad error
	err := retry(sctx, func(ctx context.Context) error {
		_, _, err := takeSnapshot(ctx, c, dataDir, 999)
		if b, ok := err.(badSnapshot); ok {
			bad = b
			return nil
		}
		return err
	})
	cancel()
	switch {
	case bad != nil:
		r.fail("%v", bad)
	case err != nil:
		r.fail("final snapshot: %v", err)
	default:
		r.SnapshotsChecked++
	}
	leader := leaderExported(ctx, c, 60*time.Second, r)
	if leader == nil {
		return
	}
	entries := checkOpLogInEtcd(ctx, c.store, tap, r)
	if entries != nil || r.OpLogLatest == 0 {
		checkReplay(snaps, entries, leader, r)
	}
	checkFollower(ctx, c, 60*time.Second, r)
}

// nonVacuous fails a run whose checks had nothing to check.
func nonVacuous(ops []Op, s summary) []string {
	var out []string
	count := func(workload, kind, status string) int {
		n := 0
		for _, op := range ops {
			if op.Workload == workload && op.Kind == kind && op.Status == status {
				n++
			}
		}
		return n
	}
	for _, k := range []struct{ w, kind string }{{WRegister, "write"}, {WRegister, "read"}, {WRegister, "remove"}, {WSet, "put"}, {WLease, "put"}, {WLease, "get"}} {
		if count(k.w, k.kind, StatusOK) == 0 {
			out = append(out, fmt.Sprintf("vacuous: no %s %s succeeded", k.w, k.kind))
		}
	}
	l := s.Lease
	if l.Leases == 0 || l.RemovesInLease == 0 || l.EvictionsOfRead == 0 || l.RemovesOK == 0 {
		out = append(out, fmt.Sprintf("vacuous lease check: %d leases, %d removes tried within one, %d evictions of leased keys, %d removes ok",
			l.Leases, l.RemovesInLease, l.EvictionsOfRead, l.RemovesOK))
	}
	return out
}

// table counts ops, unknown outcomes and violations per nemesis and
// workload; the final reads are left out.
func table(ops []Op, schedule []event, vs []violation) []row {
	rows := map[string]*row{}
	get := func(n string) *row {
		if rows[n] == nil {
			rows[n] = &row{Nemesis: n, Cells: map[string]cell{}}
		}
		return rows[n]
	}
	for _, e := range schedule {
		r := get(e.Kind)
		r.Events++
		r.Held += e.Dur
	}
	for _, op := range ops {
		if op.Kind == "final-read" {
			continue
		}
		r := get(op.Nemesis)
		cl := r.Cells[op.Workload]
		cl.Ops++
		if op.Status == StatusUnknown {
			cl.Unknown++
		}
		r.Cells[op.Workload] = cl
	}
	for _, v := range vs {
		r := get(v.Nemesis)
		cl := r.Cells[v.Workload]
		cl.Violations++
		r.Cells[v.Workload] = cl
	}
	var out []row
	for _, n := range append(append([]string{}, AllNemeses...), "none") {
		if r, ok := rows[n]; ok {
			out = append(out, *r)
			delete(rows, n)
		}
	}
	for _, r := range rows { // e.g. "oplog" for register drops
		out = append(out, *r)
	}
	return out
}

// renderReport is the run's table in Markdown.
func renderReport(s summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s, seed %d, %s of faults and load; replay: `%s`\n\n", s.Run, s.Seed, s.Chaos, s.Command)
	b.WriteString("| nemesis | events | held | register ops / unknown / violations | set ops / unknown / violations | lease ops / unknown / violations |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	var tot = map[string]cell{}
	for _, r := range s.Rows {
		fmt.Fprintf(&b, "| %s | %d | %s |", r.Nemesis, r.Events, r.Held.Round(time.Second))
		for _, w := range []string{WRegister, WSet, WLease} {
			c := r.Cells[w]
			fmt.Fprintf(&b, " %d / %d / %d |", c.Ops, c.Unknown, c.Violations)
			t := tot[w]
			t.Ops, t.Unknown, t.Violations = t.Ops+c.Ops, t.Unknown+c.Unknown, t.Violations+c.Violations
			tot[w] = t
		}
		b.WriteString("\n")
	}
	b.WriteString("| **total** | | |")
	for _, w := range []string{WRegister, WSet, WLease} {
		c := tot[w]
		fmt.Fprintf(&b, " **%d / %d / %d** |", c.Ops, c.Unknown, c.Violations)
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "- register: %d porcupine ops over %d keys (%d OpLog drops), result %s in %.1f s; of %d unknown outcomes the OpLog settled %d as applied and %d as not, %d left open; %d upserts, %d refused OBJECT_REPLICA_BUSY\n",
		s.Register.Ops, s.Register.Keys, s.Register.Drops, s.Register.Result, s.Register.CheckSeconds,
		s.RegisterSettled.Unknown, s.RegisterSettled.SettledYes, s.RegisterSettled.SettledNo, s.RegisterSettled.Open,
		s.RegisterSettled.Upserts, s.RegisterSettled.UpsertsBusy)
	fmt.Fprintf(&b, "- set: %d acknowledged, %d unknown (%d found at the end), %d failed, %d removed (+%d unknown), %d removed by the state machine, %d present at the end\n",
		s.Set.Acked, s.Set.Unknown, s.Set.Recovered, s.Set.Failed, s.Set.Removed, s.Set.RemovedUnknown, s.Set.SystemRemoved, s.Set.Present)
	fmt.Fprintf(&b, "- lease: %d leases checked; %d unforced removes tried within one (%d refused OBJECT_HAS_LEASE), %d removes ok outside leases, %d reads within a lease, %d evictions (%d of keys once leased)\n",
		s.Lease.Leases, s.Lease.RemovesInLease, s.Lease.RefusedInLease, s.Lease.RemovesOK, s.Lease.ReadsInLease, s.Lease.Evictions, s.Lease.EvictionsOfRead)
	if e := s.End; e.AppliedIndex == 0 {
		b.WriteString("- end: the end-of-run checks did not run (or found no cluster to check)\n")
	} else {
		fmt.Fprintf(&b, "- end: applied index %d on every node, digest %s, %d objects; %d leader snapshots restored and checked; OpLog %d..%d contiguous and verified; replay over the snapshot at seq %d of %d entries (%d stale replicas dropped, %d skipped) matches the leader's object set %s at seq %d; follower at seq %d\n",
			e.AppliedIndex, short(e.Digest), e.Objects, e.SnapshotsChecked, e.OpLogMin, e.OpLogLatest, e.ReplayFromSeq, e.Replayed, e.ReplayStale, e.ReplaySkipped, short(e.ObjectSetDigest), e.AppliedSeq, e.FollowerSeq)
	}
	if len(s.Violations)+len(s.Problems) == 0 {
		b.WriteString("- no violation, no problem\n")
	}
	for _, v := range s.Violations {
		fmt.Fprintf(&b, "- VIOLATION %s\n", v)
	}
	for _, p := range s.Problems {
		fmt.Fprintf(&b, "- PROBLEM %s\n", p)
	}
	return b.String()
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// reportsDataRace says whether the log at path holds a report of Go's race
// detector (nodes built with JEPSEN_RACE=1).
func reportsDataRace(path string) bool {
	b, err := os.ReadFile(path)
	return err == nil && bytes.Contains(b, []byte("WARNING: DATA RACE"))
}
