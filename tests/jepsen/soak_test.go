package jepsen

import (
	"context"
	"math"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// soakOf is a sampler holding n samples, 10 s apart, of three nodes, each
// gauge's value at sample k given by f(gauge, node, k).
func soakOf(n int, f func(g, node, k int) float64) *sampler {
	c := &cluster{nodes: []*proc{{id: "n0"}, {id: "n1"}, {id: "n2"}}}
	s := &sampler{c: c}
	for k := range n {
		sm := sample{At: time.Duration(k) * 10 * time.Second, Values: make([][]float64, len(gauges))}
		for g, gd := range gauges {
			nodes := 1
			if gd.node {
				nodes = 3
			}
			for i := range nodes {
				sm.Values[g] = append(sm.Values[g], f(g, i, k))
			}
		}
		s.samples = append(s.samples, sm)
	}
	return s
}

// TestSoakVerdicts: the trend check flags a series that keeps growing and
// only that one; steady levels, noise, sawtooths (segments made and
// deleted), restarts and missing samples are not growth.
func TestSoakVerdicts(t *testing.T) {
	heap, goroutines, dataDir := 0, 2, 4
	steady := func(g, node, k int) float64 {
		level := 2 * gauges[g].floor
		switch {
		case g == dataDir:
			return level + float64(k%6)*gauges[g].floor/4 // a sawtooth
		case g == goroutines && node == 1 && k%17 == 0:
			return math.NaN() // a killed node answers nothing
		case g == heap && node == 2 && k > 100:
			return level / 2 // restarted, smaller
		}
		return level + float64((k*7919)%13)
	}
	if v := soakOf(180, steady).verdicts(); len(v) != 0 {
		t.Errorf("a steady run flagged: %v", v)
	}
	leak := func(g, node, k int) float64 {
		if g == goroutines && node == 1 {
			return 300 + float64(k)*5 // 5 more every 10 s
		}
		return steady(g, node, k)
	}
	v := soakOf(180, leak).verdicts()
	if len(v) != 1 || !strings.HasPrefix(v[0], "goroutines of n1 grows without bound") {
		t.Errorf("want goroutines of n1 flagged alone, got %v", v)
	}
	// Growth during the first fifth (start-up) is left out.
	warm := func(g, node, k int) float64 {
		if g == heap && k < 36 {
			return float64(k) * gauges[g].floor
		}
		return steady(g, node, k)
	}
	if v := soakOf(180, warm).verdicts(); len(v) != 0 {
		t.Errorf("start-up growth flagged: %v", v)
	}

	dir := t.TempDir()
	if err := soakOf(30, leak).write(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"soak.csv", "soak.svg"} {
		if matches, _ := filepath.Glob(filepath.Join(dir, name)); len(matches) != 1 {
			t.Errorf("%s not written", name)
		}
	}
}

// TestScrape reads the gauges the soak samples from a real Prometheus
// handler with the collectors a node registers.
func TestScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	got := (&sampler{http: srv.Client()}).scrape(context.Background(), strings.TrimPrefix(srv.URL, "http://"))
	for _, g := range gauges {
		if g.metric != "" && got[g.metric] <= 0 {
			t.Errorf("%s: %v", g.metric, got[g.metric])
		}
	}
}
