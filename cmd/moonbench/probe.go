package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/internal/listflag"
)

// cmdProbe is the command under which this binary runs a probe: a writer
// in a process of its own, as a client on another host would be. In the
// harness's process its calls waited up to 0.2 s to be run, behind the
// goroutines of 10,000 emulated clients that a failover wakes at once.
const cmdProbe = "probe"

// probe is one writer of put pairs, recording each call's start, latency
// and outcome.
type probe struct {
	stop func()
	done chan struct{}
	mu   sync.Mutex
	obs  []probeObs
}

type probeObs struct {
	at  time.Time
	lat time.Duration
	err error
}

// probeReady is the probe process's first line, once its client is made.
const probeReady = "ready"

// runProbeProcess writes put pairs of fresh keys under name, as owner,
// one at a time, and prints a line for each (probeLine) until its stdin
// ends: the harness closes it, or dies.
func runProbeProcess(args []string) error {
	fs := flag.NewFlagSet("moonbench "+cmdProbe, flag.ContinueOnError)
	endpoints := fs.String("endpoints", "", "gRPC addresses of the cluster, comma-separated")
	name := fs.String("name", "probe", "the keys' prefix")
	owner := fs.String("owner", "", "the client whose segment the objects go to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cl, err := client.Dial(client.Config{Endpoints: listflag.Split(*endpoints), MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, probeReady)
	if err := out.Flush(); err != nil {
		return err
	}
	for i := 0; ctx.Err() == nil; i++ {
		key := fmt.Sprintf("scale-%s/%d-%d", *name, time.Now().UnixNano(), i)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		at := time.Now()
		_, err := cl.PutStart(cctx, key, []uint64{scaleObject}, client.ReplicateConfig{ReplicaNum: 1}, *owner)
		if err == nil {
			err = cl.PutEnd(cctx, key, *owner)
		}
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		fmt.Fprintln(out, probeLine(probeObs{at, time.Since(at), err}))
		if err := out.Flush(); err != nil {
			return err
		}
		if err != nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// probeLine is one put pair as the probe process prints it: its start in
// Unix nanoseconds, its latency in nanoseconds, and its error quoted ("" if
// none).
func probeLine(o probeObs) string {
	msg := ""
	if o.err != nil {
		msg = o.err.Error()
	}
	return fmt.Sprintf("%d %d %s", o.at.UnixNano(), o.lat.Nanoseconds(), strconv.Quote(msg))
}

// parseProbeLine reads a probeLine.
func parseProbeLine(line string) (probeObs, error) {
	fields := strings.SplitN(line, " ", 3)
	if len(fields) != 3 {
		return probeObs{}, fmt.Errorf("probe line %q: want a start, a latency and an error", line)
	}
	at, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return probeObs{}, fmt.Errorf("probe line %q: start: %w", line, err)
	}
	lat, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return probeObs{}, fmt.Errorf("probe line %q: latency: %w", line, err)
	}
	msg, err := strconv.Unquote(fields[2])
	if err != nil {
		return probeObs{}, fmt.Errorf("probe line %q: error: %w", line, err)
	}
	o := probeObs{at: time.Unix(0, at), lat: time.Duration(lat)}
	if msg != "" {
		o.err = errors.New(msg)
	}
	return o, nil
}

// startProbe starts a probe process and returns once its client is made.
func (s *scaleRun) startProbe(ctx context.Context, name string) (*probe, error) {
	cmd, stdin, stdout, err := startPiped(s.cfg.benchBin, cmdProbe, "--endpoints", strings.Join(s.lc.endpoints(), ","), "--name", name,
		"--owner", s.clients[0].id)
	if err != nil {
		return nil, err
	}
	p := &probe{stop: func() { stdin.Close() }, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(p.done)
		defer func() { _ = cmd.Wait() }()
		lines := bufio.NewScanner(stdout)
		if !lines.Scan() || lines.Text() != probeReady {
			return
		}
		close(ready)
		for lines.Scan() {
			o, err := parseProbeLine(lines.Text())
			if err != nil {
				progressf("probe %s: %v", name, err)
				continue
			}
			p.mu.Lock()
			p.obs = append(p.obs, o)
			p.mu.Unlock()
			if o.err == nil {
				s.filled.Add(1)
			}
		}
	}()
	select {
	case <-ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("the %s probe process ended before its client was made", name)
	case <-ctx.Done():
		p.finish()
		return nil, ctx.Err()
	}
}

// firstAnsweredAfter is how long after t the first write sent after t was
// answered, in ms (0: none yet). One sent before may have been answered
// by the old leader just before it died.
func (p *probe) firstAnsweredAfter(t time.Time) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range p.obs {
		if o.err == nil && o.at.After(t) {
			return float64(o.at.Add(o.lat).Sub(t).Microseconds()) / 1000
		}
	}
	return 0
}

// probeCall is one of the probe's put pairs around a kill: when it was
// sent and answered, in ms from the kill, and the error it ended with.
type probeCall struct {
	SentMs  float64 `json:"sent_ms"`
	EndedMs float64 `json:"ended_ms"`
	Error   string  `json:"error,omitempty"`
}

// callsAround is the probe's put pairs that ended after t, up to the first
// sent after t that was answered: where a failover's time went on the
// client's side.
func (p *probe) callsAround(t time.Time) []probeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	ms := func(at time.Time) float64 { return float64(at.Sub(t).Microseconds()) / 1000 }
	var out []probeCall
	for _, o := range p.obs {
		if !o.at.Add(o.lat).After(t) {
			continue
		}
		c := probeCall{SentMs: ms(o.at), EndedMs: ms(o.at.Add(o.lat))}
		if o.err != nil {
			c.Error = o.err.Error()
		}
		out = append(out, c)
		if o.err == nil && o.at.After(t) {
			break
		}
	}
	return out
}

// written is how many put pairs the probe has had answered OK.
func (p *probe) written() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n uint64
	for _, o := range p.obs {
		if o.err == nil {
			n++
		}
	}
	return n
}

func (p *probe) finish() []probeObs {
	p.stop()
	<-p.done
	return p.obs
}

// startPiped starts this binary's child process args, which dies with
// moonbench, its stderr moonbench's, and returns its stdin and stdout.
func startPiped(bin string, args ...string) (*exec.Cmd, io.WriteCloser, io.ReadCloser, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, err
	}
	return cmd, stdin, stdout, nil
}
