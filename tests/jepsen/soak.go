package jepsen

import (
	"context"
	"encoding/csv"
	"fmt"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/moonraft/moonraft/internal/svgplot"
)

// The soak (`make soak`) samples what a long run could leak: each node's
// heap, resident memory, goroutines, open files and data dir size, etcd's
// database size and the number of OpLog entries etcd holds.

// gauge is one sampled quantity: per node, or of the cluster (etcd).
type gauge struct {
	name   string
	metric string  // the node's /metrics name; "" for the ones measured here
	unit   float64 // what a plotted 1 is (MiB for bytes)
	floor  float64 // below this level no growth is a leak (a fresh process's size)
	node   bool
}

var gauges = []gauge{
	{name: "heap in use (MiB)", metric: "go_memstats_heap_inuse_bytes", unit: 1 << 20, floor: 64 << 20, node: true},
	{name: "resident memory (MiB)", metric: "process_resident_memory_bytes", unit: 1 << 20, floor: 128 << 20, node: true},
	{name: "goroutines", metric: "go_goroutines", unit: 1, floor: 200, node: true},
	{name: "open files", metric: "process_open_fds", unit: 1, floor: 100, node: true},
	{name: "data dir (MiB)", unit: 1 << 20, floor: 256 << 20, node: true},
	{name: "etcd data in use (MiB)", unit: 1 << 20, floor: 256 << 20},
	{name: "OpLog entries in etcd", unit: 1, floor: 50_000},
}

// sample is one reading: At from the start of the chaos phase, and per
// gauge one value per node (or one for a cluster gauge); NaN where a node
// did not answer (killed, paused).
type sample struct {
	At     time.Duration
	Values [][]float64 // [gauge][node]
}

// sampler reads the cluster every interval until ctx ends.
type sampler struct {
	c       *cluster
	start   time.Time
	samples []sample
	http    *http.Client
}

func newSampler(c *cluster) *sampler {
	return &sampler{c: c, start: time.Now(), http: &http.Client{Timeout: 2 * time.Second}}
}

func (s *sampler) run(ctx context.Context, every, total time.Duration, logf func(string, ...any)) {
	for {
		sm := s.take(ctx)
		s.samples = append(s.samples, sm)
		logf("soak %v/%v: %s", sm.At.Round(time.Second), total, s.line(sm))
		if sleepCtx(ctx, every) != nil {
			return
		}
	}
}

// line is a sample in one line of progress.
func (s *sampler) line(sm sample) string {
	var parts []string
	for g, gd := range gauges {
		var vs []string
		for _, v := range sm.Values[g] {
			vs = append(vs, strconv.FormatFloat(v/gd.unit, 'f', 0, 64))
		}
		parts = append(parts, gd.name+" "+strings.Join(vs, "/"))
	}
	return strings.Join(parts, ", ")
}

func (s *sampler) take(ctx context.Context) sample {
	sm := sample{At: time.Since(s.start), Values: make([][]float64, len(gauges))}
	metrics := make([]map[string]float64, len(s.c.nodes))
	for i, p := range s.c.nodes {
		metrics[i] = s.scrape(ctx, p.httpAddr)
	}
	for g, gd := range gauges {
		switch {
		case gd.metric != "":
			for i := range s.c.nodes {
				v, ok := metrics[i][gd.metric]
				if !ok {
					v = math.NaN()
				}
				sm.Values[g] = append(sm.Values[g], v)
			}
		case gd.node:
			for i := range s.c.nodes {
				sm.Values[g] = append(sm.Values[g], dirBytes(s.c.nodeDir(i)))
			}
		case strings.HasPrefix(gd.name, "etcd"):
			sm.Values[g] = []float64{s.etcdBytes(ctx)}
		default:
			sm.Values[g] = []float64{s.opLogLen(ctx)}
		}
	}
	return sm
}

// scrape reads the unlabelled gauges of a node's /metrics.
func (s *sampler) scrape(ctx context.Context, addr string) map[string]float64 {
	out := map[string]float64{}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return out
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return out
	}
	for name, mf := range families {
		if ms := mf.GetMetric(); len(ms) == 1 && ms[0].GetGauge() != nil {
			out[name] = ms[0].GetGauge().GetValue()
		}
	}
	return out
}

// dirBytes is the disk space the files under dir take (allocated blocks:
// raft-wal preallocates its segments), less the disk-full nemesis' filler.
func dirBytes(dir string) float64 {
	var n int64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == fillerName {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return float64(n)
}

func (s *sampler) etcdBytes(ctx context.Context) float64 {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := s.c.store.Client().Status(cctx, strings.TrimPrefix(s.c.etcdURL, "http://"))
	if err != nil {
		return math.NaN()
	}
	// In use, not the file: etcd reuses compacted pages but never shrinks
	// its file without a defragmentation.
	return float64(st.DbSizeInUse)
}

func (s *sampler) opLogLen(ctx context.Context) float64 {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	first, err := s.c.store.GetMinSequenceId(cctx)
	if err != nil {
		return math.NaN()
	}
	latest, err := s.c.store.Latest(cctx)
	if err != nil || first == 0 {
		return math.NaN()
	}
	return float64(latest - first + 1)
}

// trend is the least-squares line through one series.
type trend struct {
	gauge  int // index in gauges
	who    string
	mean   float64 // over the fitted samples
	growth float64 // the fitted line's rise over the fitted span
	fitted int     // samples fitted
}

// relative is the rise against the series' level (or the gauge's floor).
func (t trend) relative() float64 {
	return t.growth / max(t.mean, gauges[t.gauge].floor)
}

// trends fits a line to every series after the first fifth of the run
// (start-up: caches, the first snapshots and segments).
func (s *sampler) trends() []trend {
	var out []trend
	from := len(s.samples) / 5
	for g, gd := range gauges {
		for i := range s.samples[len(s.samples)-1].Values[g] {
			var xs, ys []float64
			for _, sm := range s.samples[from:] {
				if v := sm.Values[g][i]; !math.IsNaN(v) {
					xs, ys = append(xs, sm.At.Seconds()), append(ys, v)
				}
			}
			who := "etcd"
			if gd.node {
				who = s.c.nodes[i].id
			}
			t := trend{gauge: g, who: who, fitted: len(xs)}
			if len(xs) >= 3 {
				slope, mean := fitLine(xs, ys)
				t.mean, t.growth = mean, slope*(xs[len(xs)-1]-xs[0])
			}
			out = append(out, t)
		}
	}
	return out
}

// fitLine returns the least-squares slope of ys over xs, and ys' mean.
func fitLine(xs, ys []float64) (slope, mean float64) {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0, sy / n
	}
	return (n*sxy - sx*sy) / d, sy / n
}

// maxGrowth is how much a series may rise over the fitted span, against
// its level, before the soak calls it unbounded.
const maxGrowth = 0.5

// verdicts says which series grow without bound.
func (s *sampler) verdicts() []string {
	var out []string
	for _, t := range s.trends() {
		gd := gauges[t.gauge]
		if t.fitted >= 3 && t.relative() > maxGrowth {
			out = append(out, fmt.Sprintf("%s of %s grows without bound: +%.0f over %d samples from a mean of %.0f (%.0f%%, the bound is %.0f%%)",
				gd.name, t.who, t.growth/gd.unit, t.fitted, t.mean/gd.unit, 100*t.relative(), 100*maxGrowth))
		}
	}
	return out
}

// write saves the samples as CSV and as a plot, one panel per gauge.
func (s *sampler) write(dir string) error {
	f, err := os.Create(filepath.Join(dir, "soak.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	head := []string{"seconds"}
	for g, gd := range gauges {
		for i := range s.samples[0].Values[g] {
			who := "etcd"
			if gd.node {
				who = s.c.nodes[i].id
			}
			head = append(head, gd.name+" "+who)
		}
	}
	_ = w.Write(head)
	for _, sm := range s.samples {
		row := []string{strconv.FormatFloat(sm.At.Seconds(), 'f', 1, 64)}
		for g, gd := range gauges {
			for _, v := range sm.Values[g] {
				row = append(row, strconv.FormatFloat(v/gd.unit, 'f', 1, 64))
			}
		}
		_ = w.Write(row)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return s.plot(filepath.Join(dir, "soak.svg"))
}

func (s *sampler) plot(path string) error {
	const cols = 2
	rows := (len(gauges) + cols - 1) / cols
	panels := make([][]*plot.Plot, rows)
	for r := range panels {
		panels[r] = make([]*plot.Plot, cols)
		for c := range panels[r] {
			panels[r][c] = plot.New()
		}
	}
	for g, gd := range gauges {
		p := panels[g/cols][g%cols]
		p.Title.Text = gd.name
		p.X.Label.Text = "minutes"
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
		for i := range s.samples[0].Values[g] {
			var xys plotter.XYs
			for _, sm := range s.samples {
				if v := sm.Values[g][i]; !math.IsNaN(v) {
					xys = append(xys, plotter.XY{X: sm.At.Minutes(), Y: v / gd.unit})
				}
			}
			if len(xys) == 0 {
				continue
			}
			l, err := plotter.NewLine(xys)
			if err != nil {
				return err
			}
			l.Color = plotutil.Color(i)
			p.Add(l)
			if gd.node {
				p.Legend.Add(s.c.nodes[i].id, l)
			}
		}
	}
	return svgplot.WriteGrid(path, panels, 11*vg.Inch, 3*vg.Inch)
}
