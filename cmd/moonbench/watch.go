package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/internal/svgplot"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// exportSample is the leader's export, as its status showed it at T
// seconds into the watch.
type exportSample struct {
	T           float64 `json:"t"`
	Leader      string  `json:"leader"`
	Term        uint64  `json:"term"`
	AppliedSeq  uint64  `json:"applied_seq"`
	ExportedSeq uint64  `json:"exported_seq"`
	BacklogMs   int64   `json:"backlog_ms"`
	TakeRate    float64 `json:"take_rate"`
	WritesPaced uint64  `json:"writes_paced"`
	EtcdError   string  `json:"etcd_error,omitempty"`
	Objects     uint64  `json:"objects"`
}

// watchSummary is what a watch found over its whole run.
type watchSummary struct {
	Samples       []exportSample `json:"samples"`
	Elections     int            `json:"elections"` // leader changes seen
	MaxBacklog    uint64         `json:"max_backlog_entries"`
	MaxBacklogMs  int64          `json:"max_backlog_ms"`
	AdmittedRate  float64        `json:"admitted_rate"` // OpLog entries a second over the run
	ExportedRate  float64        `json:"exported_rate"`
	PacedSamples  int            `json:"paced_samples"` // samples with writes waiting
	EtcdDownTimes int            `json:"etcd_down_samples"`
}

// watch samples the leader's export status every second for d (or until
// ctx ends), printing a line every 10 s, and writes the samples as JSON
// and their plot (admitted and etcd rates, the backlog in entries and in
// seconds) if asked: moonbench --watch, beside a load that runs for
// minutes (scripts/sustained.sh).
func watch(ctx context.Context, cfg config, d time.Duration, out io.Writer) error {
	cl, err := client.Dial(client.Config{Endpoints: cfg.endpoints})
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var sum watchSummary
	start := time.Now()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if s, ok := sampleExport(ctx, cl, time.Since(start)); ok {
			sum.add(s)
			if n := len(sum.Samples); n%10 == 0 {
				fmt.Fprintf(out, "%4.0fs  leader %s term %d  applied %d  backlog %d entries, %.1fs  etcd ~%.0f/s  paced %d  objects %d\n",
					s.T, s.Leader, s.Term, s.AppliedSeq, s.AppliedSeq-min(s.ExportedSeq, s.AppliedSeq), float64(s.BacklogMs)/1000,
					s.TakeRate, s.WritesPaced, s.Objects)
			}
		}
		select {
		case <-ctx.Done():
			sum.finish()
			fmt.Fprintf(out, "watched %d s: %d leader changes; backlog at most %d entries and %.1f s; admitted %.0f entries/s, etcd took %.0f/s; writes paced in %d samples; etcd down in %d\n",
				len(sum.Samples), sum.Elections, sum.MaxBacklog, float64(sum.MaxBacklogMs)/1000, sum.AdmittedRate, sum.ExportedRate,
				sum.PacedSamples, sum.EtcdDownTimes)
			return sum.write(cfg.jsonOut, cfg.plotOut)
		case <-t.C:
		}
	}
}

func sampleExport(ctx context.Context, cl *client.Client, at time.Duration) (exportSample, bool) {
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// Progress, not Status: the digests cost the node a pass over its
	// whole state under its lock, every second.
	sts := make([]*moonraftpb.NodeStatus, len(cl.Endpoints()))
	var wg sync.WaitGroup
	for i, ep := range cl.Endpoints() {
		wg.Go(func() { sts[i], _ = cl.Progress(sctx, ep) })
	}
	wg.Wait()
	for _, st := range sts {
		if st != nil && st.Promoted {
			return exportSample{T: at.Seconds(), Leader: st.Id, Term: st.Term, AppliedSeq: st.AppliedSeq, ExportedSeq: st.ExportedSeq,
				BacklogMs: st.ExportBacklogMs, TakeRate: st.ExportTakeRate, WritesPaced: st.WritesPaced, EtcdError: st.EtcdError,
				Objects: st.Objects}, true
		}
	}
	return exportSample{}, false
}

func (w *watchSummary) add(s exportSample) {
	if n := len(w.Samples); n > 0 && w.Samples[n-1].Term != s.Term {
		w.Elections++
	}
	w.Samples = append(w.Samples, s)
	w.MaxBacklog = max(w.MaxBacklog, s.AppliedSeq-min(s.ExportedSeq, s.AppliedSeq))
	w.MaxBacklogMs = max(w.MaxBacklogMs, s.BacklogMs)
	if s.WritesPaced > 0 {
		w.PacedSamples++
	}
	if s.EtcdError != "" {
		w.EtcdDownTimes++
	}
}

func (w *watchSummary) finish() {
	if n := len(w.Samples); n > 1 {
		a, b := w.Samples[0], w.Samples[n-1]
		if el := b.T - a.T; el > 0 {
			w.AdmittedRate = float64(b.AppliedSeq-a.AppliedSeq) / el
			w.ExportedRate = float64(b.ExportedSeq-min(a.ExportedSeq, b.ExportedSeq)) / el
		}
	}
}

func (w *watchSummary) write(jsonPath, plotPath string) error {
	if jsonPath != "" {
		b, err := json.MarshalIndent(w, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(jsonPath, b, 0o644); err != nil {
			return err
		}
	}
	if plotPath == "" || len(w.Samples) < 2 {
		return nil
	}
	return w.plot(plotPath)
}

// plot draws three panels over time: the rates (entries a second
// admitted, taken by etcd, and etcd's rate as the leader measures it),
// the backlog in entries, and its age in seconds.
func (w *watchSummary) plot(path string) error {
	var admitted, exported, measured, backlog, age plotter.XYs
	for i, s := range w.Samples {
		backlog = append(backlog, plotter.XY{X: s.T, Y: float64(s.AppliedSeq - min(s.ExportedSeq, s.AppliedSeq))})
		age = append(age, plotter.XY{X: s.T, Y: float64(s.BacklogMs) / 1000})
		measured = append(measured, plotter.XY{X: s.T, Y: s.TakeRate})
		if i == 0 {
			continue
		}
		p := w.Samples[i-1]
		el := s.T - p.T
		if el <= 0 || s.AppliedSeq < p.AppliedSeq || s.ExportedSeq < p.ExportedSeq {
			continue
		}
		admitted = append(admitted, plotter.XY{X: s.T, Y: float64(s.AppliedSeq-p.AppliedSeq) / el})
		exported = append(exported, plotter.XY{X: s.T, Y: float64(s.ExportedSeq-p.ExportedSeq) / el})
	}
	type series struct {
		name string
		xys  plotter.XYs
	}
	panel := func(title, y string, ss ...series) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "time (s)"
		p.Y.Label.Text = y
		p.Add(plotter.NewGrid())
		p.Legend.Top = true
		for i, s := range ss {
			l, err := plotter.NewLine(s.xys)
			if err != nil {
				return nil, err
			}
			l.Color = plotutil.Color(i)
			p.Add(l)
			p.Legend.Add(s.name, l)
		}
		return p, nil
	}
	rates, err := panel("OpLog entries a second", "entries/s",
		series{"admitted", admitted}, series{"taken by etcd", exported}, series{"etcd's rate, measured", measured})
	if err != nil {
		return err
	}
	entries, err := panel("export backlog", "entries", series{"backlog", backlog})
	if err != nil {
		return err
	}
	secs, err := panel("age of the oldest entry etcd has not taken", "seconds", series{"backlog age", age})
	if err != nil {
		return err
	}
	return svgplot.WriteGrid(path, [][]*plot.Plot{{rates}, {entries}, {secs}}, 10*vg.Inch, 3*vg.Inch)
}
