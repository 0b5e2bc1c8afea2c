package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"

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
	return fmt.Sprintf("%d cores%s, %s/%s, %s", runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

func (r *report) output(w io.Writer, cfg config) error {
	fmt.Fprintf(w, "moonbench %s\nmachine: %s\ndate: %s\n\n", r.Args, r.Machine, r.Date)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tworkload\tclients\tops/s\tp50 ms\tp99 ms\tp99.9 ms\terrors\tetcd txn/s\tetcd txn/1k ops\tetcd KB/1k ops\tstandby lag p50 ms\tstandby lag p99 ms\tops per leader CPU s\tCPU µs/op serving/others\t")
	for _, s := range r.Steps {
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%d\t%.0f\t%.1f\t%.0f\t%.1f\t%.1f\t%s\t%s\t\n", s.System, s.Workload, s.Clients, s.OpsPerSec,
			s.P50Ms, s.P99Ms, s.P999Ms, s.Errors, s.EtcdTxnsPerSec, s.EtcdTxnsPer1kOps, s.EtcdBytesPer1kOps/1000, s.LagP50Ms, s.LagP99Ms, perCPU, perOp)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range r.Steps {
		if s.FirstError != "" {
			fmt.Fprintf(w, "%s %s clients=%d: %d errors, first: %s\n", s.System, s.Workload, s.Clients, s.Errors, s.FirstError)
		}
	}
	if ratios := r.ratios(); len(ratios) > 0 {
		fmt.Fprintln(w, "\nagainst "+baselineSync)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "system\tworkload\tclients\tthroughput ×\tp50 latency ×\tp99 latency ×\tstandby lag p99 ×\t")
		for _, x := range ratios {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t\n", x.system, x.workload, x.clients, x.throughput, x.p50, x.p99, x.lag)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Failovers) > 0 {
		fmt.Fprintf(w, "\nfailover: kills of the serving process under %d writers\n", r.Failovers[0].Clients)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "system\tkills\twindow p50 ms\twindow max ms\tacknowledged writes\tlost\tall windows ms\t")
		for _, f := range r.Failovers {
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%d\t%d\t%v\t\n", f.System, len(f.GapsMs), f.P50Ms, f.MaxMs, f.Acked, f.Lost, f.GapsMs)
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

type ratio struct {
	system, workload          string
	clients                   int
	throughput, p50, p99, lag float64
}

func (r *report) ratios() []ratio {
	base := map[string]stepResult{}
	for _, s := range r.Steps {
		if s.System == baselineSync {
			base[fmt.Sprint(s.Workload, s.Clients)] = s
		}
	}
	var out []ratio
	for _, s := range r.Steps {
		b, ok := base[fmt.Sprint(s.Workload, s.Clients)]
		if s.System == baselineSync || !ok {
			continue
		}
		out = append(out, ratio{s.System, s.Workload, s.Clients, div(s.OpsPerSec, b.OpsPerSec), div(s.P50Ms, b.P50Ms), div(s.P99Ms, b.P99Ms), div(s.LagP99Ms, b.LagP99Ms)})
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
	for _, s := range r.Steps {
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
