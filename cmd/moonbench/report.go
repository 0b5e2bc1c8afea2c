package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/moonraft/moonraft/internal/svgplot"
)

type report struct {
	Machine   string           `json:"machine"`
	Date      string           `json:"date"`
	Args      string           `json:"args"`
	Steps     []stepResult     `json:"steps"`
	Failovers []failoverResult `json:"failovers,omitempty"`
}

// machine describes where the numbers were taken.
func machine() string {
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB", float64(kb)/(1<<20))
		}
	}
	touch := ""
	if d, err := pageTouch(); err == nil {
		touch = fmt.Sprintf(", a page's first touch %.1f µs", float64(d.Nanoseconds())/1e3)
	}
	return fmt.Sprintf("%d cores%s, %s/%s, %s%s", runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH, runtime.Version(), touch)
}

// pageTouch is what the first write to a page of fresh memory costs: a
// fill or a restore faults in hundreds of megabytes, which on some virtual
// machines (12 µs a page on one measured, 0.1–0.3 µs on bare metal) is
// most of a restore's time.
func pageTouch() (time.Duration, error) {
	const size = 64 << 20
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return 0, err
	}
	defer syscall.Munmap(b)
	page := os.Getpagesize()
	t0 := time.Now()
	for i := 0; i < size; i += page {
		b[i] = 1
	}
	return time.Since(t0) / time.Duration(size/page), nil
}

func (r *report) output(w io.Writer, cfg config) error {
	fmt.Fprintf(w, "moonbench %s\nmachine: %s\ndate: %s\n\n", r.Args, r.Machine, r.Date)
	rows := r.summary()
	repeated := slices.ContainsFunc(rows, func(x row) bool { return len(x.runs) > 1 })
	if repeated {
		fmt.Fprintln(w, "each column: the median of the rounds (errors: their sum)")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	header := "system\tworkload\tclients\tops/s\tp50 ms\tp99 ms\tp99.9 ms\terrors\tetcd txn/s\tetcd txn/1k ops\tetcd KB/1k ops\tstandby lag p50 ms\tstandby lag p99 ms\tops per leader CPU s\tCPU µs/op serving/others\t"
	if repeated {
		header += "ops/s each round\t"
	}
	fmt.Fprintln(tw, header)
	for _, x := range rows {
		s := x.stepResult
		perCPU, perOp := "-", "-"
		if s.OpsPerLeaderCPUSec > 0 {
			perCPU = fmt.Sprintf("%.0f", s.OpsPerLeaderCPUSec)
		}
		if len(s.CPUMicrosPerOp) > 0 {
			var us []string
			for _, u := range s.CPUMicrosPerOp {
				us = append(us, fmt.Sprintf("%.0f", u))
			}
			perOp = strings.Join(us, "/")
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%d\t%.0f\t%.1f\t%.0f\t%.1f\t%.1f\t%s\t%s\t", s.System, s.Workload, s.Clients, s.OpsPerSec,
			s.P50Ms, s.P99Ms, s.P999Ms, s.Errors, s.EtcdTxnsPerSec, s.EtcdTxnsPer1kOps, s.EtcdBytesPer1kOps/1000, s.LagP50Ms, s.LagP99Ms, perCPU, perOp)
		if repeated {
			fmt.Fprintf(tw, "%s\t", joinf(x.runs, "%.0f"))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range r.Steps {
		if s.FirstError != "" {
			fmt.Fprintf(w, "%s %s clients=%d: %d errors, first: %s\n", s.System, s.Workload, s.Clients, s.Errors, s.FirstError)
		}
		if s.SlowLogWrites > 0 {
			round := ""
			if repeated {
				round = fmt.Sprintf(" round %d", s.Round)
			}
			fmt.Fprintf(w, "%s %s clients=%d%s: standby lag p99 %.1f ms%s\n", s.System, s.Workload, s.Clients, round, s.LagP99Ms, s.slowNote())
		}
	}
	if ratios := r.ratios(); len(ratios) > 0 {
		fmt.Fprintln(w, "\nagainst "+baselineSync)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		header := "system\tworkload\tclients\tthroughput ×\tp50 latency ×\tp99 latency ×\tstandby lag p99 ×\t"
		if repeated {
			header += "throughput × each round\t"
		}
		fmt.Fprintln(tw, header)
		for _, x := range ratios {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t", x.system, x.workload, x.clients, x.throughput, x.p50, x.p99, x.lag)
			if repeated {
				fmt.Fprintf(tw, "%s\t", joinf(x.rounds, "%.2f"))
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Failovers) > 0 {
		fmt.Fprintf(w, "\nfailover: the serving process killed or stopped under %d writers\n", r.Failovers[0].Clients)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "system\tsignal\tfailovers\twindow p50 ms\twindow max ms\tacknowledged writes\tlost\tall windows ms\t")
		for _, f := range r.Failovers {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%d\t%d\t%v\t\n", f.System, f.Signal, len(f.GapsMs), f.P50Ms, f.MaxMs, f.Acked, f.Lost, f.GapsMs)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if cfg.jsonOut != "" {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if cfg.plotOut != "" {
		return r.plot(cfg.plotOut)
	}
	return nil
}

// row is one line of the table: a system's step, with --repeat the
// median of its rounds, and each round's throughput.
type row struct {
	stepResult
	runs []float64
}

// summary groups the steps by system, workload and client count (systems
// in the order they first ran, steps in sweep order) and gives each group's
// median of every column; errors add up, the first error stays.
func (r *report) summary() []row {
	type key struct {
		system, workload string
		clients          int
	}
	var keys []key
	groups := map[key][]stepResult{}
	for _, s := range r.Steps {
		k := key{s.System, s.Workload, s.Clients}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], s)
	}
	var systems []string
	for _, k := range keys {
		if !slices.Contains(systems, k.system) {
			systems = append(systems, k.system)
		}
	}
	slices.SortStableFunc(keys, func(a, b key) int { return slices.Index(systems, a.system) - slices.Index(systems, b.system) })
	out := make([]row, 0, len(keys))
	for _, k := range keys {
		out = append(out, medianRow(groups[k]))
	}
	return out
}

func medianRow(g []stepResult) row {
	m := func(f func(stepResult) float64) float64 {
		vs := make([]float64, len(g))
		for i, s := range g {
			vs[i] = f(s)
		}
		return median(vs)
	}
	x := row{stepResult: stepResult{System: g[0].System, Workload: g[0].Workload, Clients: g[0].Clients}}
	for _, s := range g {
		x.runs = append(x.runs, s.OpsPerSec)
		x.Ops += s.Ops
		x.Seconds += s.Seconds
		x.Errors += s.Errors
		x.LagSamples += s.LagSamples
		x.SlowLogWrites += s.SlowLogWrites
		if x.FirstError == "" {
			x.FirstError = s.FirstError
		}
	}
	x.OpsPerSec = m(func(s stepResult) float64 { return s.OpsPerSec })
	x.P50Ms = m(func(s stepResult) float64 { return s.P50Ms })
	x.P99Ms = m(func(s stepResult) float64 { return s.P99Ms })
	x.P999Ms = m(func(s stepResult) float64 { return s.P999Ms })
	x.EtcdTxnsPerSec = m(func(s stepResult) float64 { return s.EtcdTxnsPerSec })
	x.EtcdTxnsPer1kOps = m(func(s stepResult) float64 { return s.EtcdTxnsPer1kOps })
	x.EtcdBytesPer1kOps = m(func(s stepResult) float64 { return s.EtcdBytesPer1kOps })
	x.LagP50Ms = m(func(s stepResult) float64 { return s.LagP50Ms })
	x.LagP99Ms = m(func(s stepResult) float64 { return s.LagP99Ms })
	x.LeaderCPUSeconds = m(func(s stepResult) float64 { return s.LeaderCPUSeconds })
	x.OpsPerLeaderCPUSec = m(func(s stepResult) float64 { return s.OpsPerLeaderCPUSec })
	for i := range g[0].CPUMicrosPerOp {
		x.CPUMicrosPerOp = append(x.CPUMicrosPerOp, m(func(s stepResult) float64 {
			if i < len(s.CPUMicrosPerOp) {
				return s.CPUMicrosPerOp[i]
			}
			return 0
		}))
	}
	return x
}

// median of vs (the mean of the middle two for an even count).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

func joinf(vs []float64, format string) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(parts, " / ")
}

type ratio struct {
	system, workload          string
	clients                   int
	throughput, p50, p99, lag float64
	rounds                    []float64 // throughput × of each round against the same round's baseline
}

// ratios compares every other system's rows with the baseline's: medians
// with medians, and round with round.
func (r *report) ratios() []ratio {
	type key struct {
		workload       string
		clients, round int
	}
	base := map[key]stepResult{}
	for _, s := range r.Steps {
		if s.System == baselineSync {
			base[key{s.Workload, s.Clients, s.Round}] = s
		}
	}
	baseRows := map[key]row{}
	rows := r.summary()
	for _, x := range rows {
		if x.System == baselineSync {
			baseRows[key{x.Workload, x.Clients, 0}] = x
		}
	}
	var out []ratio
	for _, x := range rows {
		b, ok := baseRows[key{x.Workload, x.Clients, 0}]
		if x.System == baselineSync || !ok {
			continue
		}
		rt := ratio{system: x.System, workload: x.Workload, clients: x.Clients, throughput: div(x.OpsPerSec, b.OpsPerSec),
			p50: div(x.P50Ms, b.P50Ms), p99: div(x.P99Ms, b.P99Ms), lag: div(x.LagP99Ms, b.LagP99Ms)}
		for _, s := range r.Steps {
			if bs, ok := base[key{s.Workload, s.Clients, s.Round}]; ok && s.System == x.System && s.Workload == x.Workload && s.Clients == x.Clients {
				rt.rounds = append(rt.rounds, div(s.OpsPerSec, bs.OpsPerSec))
			}
		}
		out = append(out, rt)
	}
	return out
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// plot draws p99 latency against throughput: a panel per workload, a line
// per system in it (the baseline dashed), points in sweep order (one per
// client count), both axes logarithmic.
func (r *report) plot(path string) error {
	var workloads, systems []string
	series := map[[2]string]plotter.XYs{}
	for _, x := range r.summary() {
		s := x.stepResult
		if s.OpsPerSec == 0 || s.P99Ms == 0 {
			continue
		}
		if !slices.Contains(workloads, s.Workload) {
			workloads = append(workloads, s.Workload)
		}
		if !slices.Contains(systems, s.System) {
			systems = append(systems, s.System)
		}
		k := [2]string{s.Workload, s.System}
		series[k] = append(series[k], plotter.XY{X: s.OpsPerSec, Y: s.P99Ms})
	}
	if len(workloads) == 0 {
		return fmt.Errorf("nothing to plot")
	}
	const cols = 2
	rows := (len(workloads) + cols - 1) / cols
	panels := make([][]*plot.Plot, rows)
	for i := range panels {
		panels[i] = make([]*plot.Plot, cols)
	}
	for w, name := range workloads {
		p := plot.New()
		p.Title.Text = name
		p.X.Label.Text = "throughput (ops/s)"
		p.Y.Label.Text = "p99 latency (ms)"
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
		for i, sys := range systems {
			xys := series[[2]string{name, sys}]
			if len(xys) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return err
			}
			c := plotutil.Color(i)
			if strings.HasPrefix(sys, baselineSync) {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			l.Color, pts.Color = c, c
			pts.Shape = plotutil.Shape(i)
			p.Add(l, pts)
			p.Legend.Add(sys, l, pts)
		}
		panels[w/cols][w%cols] = p
	}
	for _, row := range panels {
		for i, p := range row {
			if p == nil {
				row[i] = plot.New() // an empty last panel
			}
		}
	}
	return svgplot.WriteGrid(path, panels, 11*vg.Inch, 3.6*vg.Inch)
}
