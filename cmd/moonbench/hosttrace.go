package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// hostSample is the host's counters that tell whether the kernel, not a
// node, held a failover back: on this loopback cluster every packet
// between nodes is delivered by a NET_RX softirq, which the kernel hands
// to its ksoftirqd threads when it has too much to do, and those wait for
// a CPU like any other thread.
type hostSample struct {
	at time.Time
	// ksoftirqdWait is the ksoftirqd threads' total wait for a CPU so far
	// (schedstat's run delay).
	ksoftirqdWait time.Duration
	// system, softirq and steal are every CPU's time in the kernel (a
	// dying process's memory is freed there), in softirqs, and taken by
	// the hypervisor, so far (/proc/stat).
	system, softirq, steal time.Duration
	// squeezed is how often a NET_RX softirq ran out of its budget with
	// packets left (softnet_stat's time_squeeze).
	squeezed uint64
}

// hostWindow is what the host's counters did over a span.
type hostWindow struct {
	Ms              float64 `json:"ms"`
	SystemMs        float64 `json:"system_ms"`
	KsoftirqdWaitMs float64 `json:"ksoftirqd_wait_ms"`
	SoftirqMs       float64 `json:"softirq_ms"`
	StealMs         float64 `json:"steal_ms"`
	Squeezed        uint64  `json:"squeezed"`
}

// hostBetween is the change of the counters from the last sample at or
// before from to the first at or after to (zero without both).
func hostBetween(samples []hostSample, from, to time.Time) hostWindow {
	var a, b *hostSample
	for i := range samples {
		if !samples[i].at.After(from) {
			a = &samples[i]
		}
		if b == nil && !samples[i].at.Before(to) {
			b = &samples[i]
		}
	}
	if a == nil || b == nil {
		return hostWindow{}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return hostWindow{
		Ms:              ms(b.at.Sub(a.at)),
		SystemMs:        ms(b.system - a.system),
		KsoftirqdWaitMs: ms(b.ksoftirqdWait - a.ksoftirqdWait),
		SoftirqMs:       ms(b.softirq - a.softirq),
		StealMs:         ms(b.steal - a.steal),
		Squeezed:        b.squeezed - a.squeezed,
	}
}

// traceHost samples the host's counters every traceEvery until the
// returned func is called, which takes a last sample and returns them all.
// On a host whose counters cannot be read (not Linux) it returns none.
func traceHost(ctx context.Context) (stop func() []hostSample) {
	ctx, cancel := context.WithCancel(ctx)
	ksoftirqds, _ := filepath.Glob("/proc/[0-9]*/comm")
	var schedstats []string
	for _, comm := range ksoftirqds {
		if b, err := os.ReadFile(comm); err == nil && strings.HasPrefix(string(b), "ksoftirqd/") {
			schedstats = append(schedstats, filepath.Join(filepath.Dir(comm), "schedstat"))
		}
	}
	var (
		wg  sync.WaitGroup
		out []hostSample
	)
	wg.Go(func() {
		for {
			if s, err := readHost(schedstats); err == nil {
				out = append(out, s)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(traceEvery):
			}
		}
	})
	return func() []hostSample {
		cancel()
		wg.Wait()
		if s, err := readHost(schedstats); err == nil {
			out = append(out, s)
		}
		return out
	}
}

// readHost reads the host's counters: schedstats are the ksoftirqd
// threads' /proc/<pid>/schedstat files.
func readHost(schedstats []string) (hostSample, error) {
	s := hostSample{at: time.Now()}
	for _, path := range schedstats {
		b, err := os.ReadFile(path)
		if err != nil {
			return s, err
		}
		// Time on a CPU, time waiting for one (both ns), timeslices.
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return s, fmt.Errorf("%s: %q", path, b)
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return s, fmt.Errorf("%s: %v", path, err)
		}
		s.ksoftirqdWait += time.Duration(ns)
	}
	stat, err := os.Open("/proc/stat")
	if err != nil {
		return s, err
	}
	defer stat.Close()
	sc := bufio.NewScanner(stat)
	sc.Scan()
	// cpu user nice system idle iowait irq softirq steal ..., in USER_HZ
	// ticks (100 a second on every Linux Go supports).
	f := strings.Fields(sc.Text())
	if len(f) < 9 || f[0] != "cpu" {
		return s, fmt.Errorf("/proc/stat: %q", sc.Text())
	}
	for i, d := range map[int]*time.Duration{3: &s.system, 7: &s.softirq, 8: &s.steal} {
		ticks, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return s, fmt.Errorf("/proc/stat: %v", err)
		}
		*d = time.Duration(ticks) * 10 * time.Millisecond
	}
	b, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		return s, err
	}
	// One line a CPU of hex counters: processed, dropped, time_squeeze, ...
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 3 {
			return s, fmt.Errorf("/proc/net/softnet_stat: %q", line)
		}
		n, err := strconv.ParseUint(f[2], 16, 64)
		if err != nil {
			return s, fmt.Errorf("/proc/net/softnet_stat: %v", err)
		}
		s.squeezed += n
	}
	return s, nil
}

// listenOverflows is how many connections the host's listen queues have
// turned away so far, full (TcpExt ListenOverflows): a client whose
// connection was turned away sends its SYN again 1, 3, 7 and 15 s later,
// waiting all that while for an answer to the ping it wrote.
func listenOverflows() (uint64, error) {
	b, err := os.ReadFile("/proc/net/netstat")
	if err != nil {
		return 0, err
	}
	// Pairs of lines: "TcpExt: Name ..." then "TcpExt: value ...".
	var names []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "TcpExt:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		if i := slices.Index(names, "ListenOverflows"); i > 0 && i < len(f) {
			return strconv.ParseUint(f[i], 10, 64)
		}
		break
	}
	return 0, fmt.Errorf("/proc/net/netstat: no TcpExt ListenOverflows")
}
