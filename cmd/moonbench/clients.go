package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/listflag"
	"github.com/moonraft/moonraft/mckeeper"
	mc "github.com/moonraft/moonraft/mooncakeapi"
)

// cmdClients is the command under which this binary runs the scale
// harness's clients, each mounting a segment and pinging every second, in
// a process of their own, as on hosts of their own. In the harness's
// process the 10,000 goroutines a failover wakes at once delayed its own
// calls by up to 0.2 s (the probe's, and its views of the cluster), and
// the fill's writers took the CPU their pings wanted.
const cmdClients = "clients"

// The clients process's protocol, a line each way. On its stdin:
// clientsCount asks for the remounts so far and the CPU the process has
// used, answered "count N NANOSECONDS";
// "stop A B" stops the pings of clients A to B-1, answered "stopped A B"
// once they have; the end of stdin stops every client and the process. On
// its stdout, after clientsReady: the answers, and a clientsRemount line
// for each remount of a Mooncake client as it happens (remountLine).
const (
	clientsReady   = "ready"
	clientsCount   = "count"
	clientsStop    = "stop"
	clientsStopped = "stopped"
	clientsRemount = "remount"
)

// keeper is one client's pings, in either protocol.
type keeper interface {
	Stop()
	Remounts() int
}

// runClientsProcess mounts and keeps --n clients' segments of --size
// bytes until its stdin ends.
func runClientsProcess(args []string) error {
	fs := flag.NewFlagSet("moonbench "+cmdClients, flag.ContinueOnError)
	n := fs.Int("n", 0, "clients")
	size := fs.Uint64("size", 0, "each client's segment, in bytes")
	pings := fs.String("pings", scalePingsMooncake, "the clients' protocol: mooncake or grpc")
	endpoints := fs.String("endpoints", "", "gRPC addresses of the cluster, comma-separated (grpc)")
	etcd := fs.String("etcd", "", "etcd's addresses, comma-separated, where the master's address is (mooncake)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{w: bufio.NewWriter(os.Stdout)}
	keepers := make([]keeper, *n)
	mounts := make([]func(context.Context) error, *n)
	starts := make([]func(), *n)
	switch *pings {
	case scalePingsGRPC:
		cl, err := client.Dial(client.Config{Endpoints: listflag.Split(*endpoints)})
		if err != nil {
			return err
		}
		defer cl.Close()
		for i := range keepers {
			id, seg := grpcSegment(i, *size)
			mounts[i] = func(ctx context.Context) error { return cl.MountSegment(ctx, id, seg) }
			starts[i] = func() { keepers[i] = cl.KeepAlive(ctx, id, []fsm.SegmentSpec{seg}, 0) }
		}
	case scalePingsMooncake:
		views, err := etcdbridge.Dial(etcdbridge.Config{Endpoints: listflag.Split(*etcd)})
		if err != nil {
			return err
		}
		defer views.Close()
		for i := range keepers {
			id, seg := mooncakeSegment(i, *size)
			k := mckeeper.New(id, []mc.Segment{seg}, views.MooncakeMaster)
			k.OnRemount(func(r mckeeper.Remount) {
				line, err := remountLine(i, r)
				if err != nil {
					progressf("%v", err)
					return
				}
				out.line(line)
			})
			keepers[i] = k
			mounts[i] = k.Mount
			starts[i] = func() { k.Start(ctx) }
		}
	default:
		return fmt.Errorf("--pings %q: want %s or %s", *pings, scalePingsMooncake, scalePingsGRPC)
	}
	progressf("mounting %d segments of %d KiB, one per client (%s)", *n, *size>>10, *pings)
	if err := mountAll(ctx, mounts); err != nil {
		return err
	}
	for i, start := range starts {
		if i%max(1, *n/100) == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		start()
	}
	stopped := make([]bool, *n)
	stop := func(from, to int) {
		var wg sync.WaitGroup
		for i := from; i < to; i++ {
			if !stopped[i] {
				stopped[i] = true
				wg.Go(keepers[i].Stop)
			}
		}
		wg.Wait()
	}
	defer stop(0, *n)
	out.line(clientsReady)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd := strings.Fields(in.Text())
		switch {
		case len(cmd) == 1 && cmd[0] == clientsCount:
			total := 0
			for _, k := range keepers {
				total += k.Remounts()
			}
			out.line(fmt.Sprintf("%s %d %d", clientsCount, total, processCPU().Nanoseconds()))
		case len(cmd) == 3 && cmd[0] == clientsStop:
			from, err1 := strconv.Atoi(cmd[1])
			to, err2 := strconv.Atoi(cmd[2])
			if err := errors.Join(err1, err2); err != nil || from < 0 || from > to || to > *n {
				return fmt.Errorf("%q: want %s A B with 0 ≤ A ≤ B ≤ %d", in.Text(), clientsStop, *n)
			}
			stop(from, to)
			out.line(fmt.Sprintf("%s %d %d", clientsStopped, from, to))
		default:
			return fmt.Errorf("%q: want %s or %s A B", in.Text(), clientsCount, clientsStop)
		}
	}
	return in.Err()
}

// mountAll runs the mounts, 32 at a time, each retried for up to 30 s.
func mountAll(ctx context.Context, mounts []func(context.Context) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, 32)
	for w := range errs {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(mounts) || ctx.Err() != nil {
					return
				}
				if err := retryUntil(ctx, 30*time.Second, mounts[i]); err != nil {
					errs[w] = fmt.Errorf("mount of client %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// grpcSegment is client i's id and segment with --scale-pings grpc.
func grpcSegment(i int, size uint64) (string, fsm.SegmentSpec) {
	name := scaleClientName(i)
	return name, fsm.SegmentSpec{ID: name + "-seg", Name: name + "-host", Base: scaleBase(i), Size: size}
}

// mooncakeSegment is Mooncake client i's id and segment.
func mooncakeSegment(i int, size uint64) (mc.UUID, mc.Segment) {
	return mooncakeClient(i), mc.Segment{ID: mc.UUID{First: scaleUUID + 1, Second: uint64(i)}, Name: scaleClientName(i) + "-host",
		Base: scaleBase(i), Size: size, TEEndpoint: fmt.Sprintf("127.0.0.1:%d", 20000+i), Protocol: "tcp"}
}

func mooncakeClient(i int) mc.UUID { return mc.UUID{First: scaleUUID, Second: uint64(i)} }

func scaleClientName(i int) string { return fmt.Sprintf("scale-%05d", i) }

func scaleBase(i int) uint64 { return uint64(i+1) << 40 }

// scaleUUID is the first half of the Mooncake clients' UUIDs (and, plus
// one, of their segments'), the second half their index.
const scaleUUID = 0x5ca1e

// lineWriter writes whole lines from any goroutine.
type lineWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (l *lineWriter) line(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(l.w, s)
	_ = l.w.Flush() // the harness gone, the end of stdin ends this process
}

// remountLine is client i's remount as the clients process prints it:
// "remount I JSON", JSON the mckeeper.Remount.
func remountLine(i int, r mckeeper.Remount) (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("client %d's remount: %w", i, err)
	}
	return fmt.Sprintf("%s %d %s", clientsRemount, i, b), nil
}

// parseRemountLine reads a remountLine.
func parseRemountLine(line string) (int, mckeeper.Remount, error) {
	var r mckeeper.Remount
	f := strings.SplitN(line, " ", 3)
	if len(f) != 3 || f[0] != clientsRemount {
		return 0, r, fmt.Errorf("remount line %q: want %s, a client and the remount in JSON", line, clientsRemount)
	}
	i, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, r, fmt.Errorf("remount line %q: client: %w", line, err)
	}
	if err := json.Unmarshal([]byte(f[2]), &r); err != nil {
		return 0, r, fmt.Errorf("remount line %q: %w", line, err)
	}
	return i, r, nil
}

// clientsProc is the harness's end of a clients process.
type clientsProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	answers chan string // the answers to its commands, in order
	done    chan struct{}
	wait    error // the process's exit, once done

	mu       sync.Mutex
	remounts []remountEvent
}

type remountEvent struct {
	client int
	mckeeper.Remount
}

// startClients starts the clients process, with s.cfg.scaleClients
// clients each with a segment of size bytes, and returns once every
// client is mounted and pinging.
func (s *scaleRun) startClients(ctx context.Context, size uint64) (*clientsProc, error) {
	cmd, stdin, stdout, err := startPiped(s.cfg.benchBin, cmdClients, "--n", strconv.Itoa(s.cfg.scaleClients), "--size", strconv.FormatUint(size, 10),
		"--pings", s.cfg.scalePings, "--endpoints", strings.Join(s.lc.endpoints(), ","), "--etcd", strings.Join(s.lc.etcdP.endpoints(), ","))
	if err != nil {
		return nil, err
	}
	p := &clientsProc{cmd: cmd, stdin: stdin, answers: make(chan string, 4), done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(p.done)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			switch line := lines.Text(); {
			case line == clientsReady:
				close(ready)
			case strings.HasPrefix(line, clientsRemount+" "):
				i, r, err := parseRemountLine(line)
				if err != nil {
					progressf("clients: %v", err)
					continue
				}
				p.mu.Lock()
				p.remounts = append(p.remounts, remountEvent{i, r})
				p.mu.Unlock()
			default:
				p.answers <- line
			}
		}
		p.wait = cmd.Wait()
	}()
	select {
	case <-ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("the clients process ended before its clients were mounted: %v", p.wait)
	case <-ctx.Done():
		p.close()
		return nil, ctx.Err()
	}
}

// ask sends a command and returns its answer.
func (p *clientsProc) ask(ctx context.Context, cmd string) (string, error) {
	if _, err := fmt.Fprintln(p.stdin, cmd); err != nil {
		return "", fmt.Errorf("the clients process: %w", err)
	}
	select {
	case a := <-p.answers:
		return a, nil
	case <-p.done:
		return "", fmt.Errorf("the clients process ended: %v", p.wait)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// count is the clients' remounts so far, and the CPU their process has
// used.
func (p *clientsProc) count(ctx context.Context) (int, time.Duration, error) {
	a, err := p.ask(ctx, clientsCount)
	if err != nil {
		return 0, 0, err
	}
	var n int
	var cpu int64
	if _, err := fmt.Sscanf(a, clientsCount+" %d %d", &n, &cpu); err != nil {
		return 0, 0, fmt.Errorf("the clients process answered %q to %s: %w", a, clientsCount, err)
	}
	return n, time.Duration(cpu), nil
}

// processCPU is the CPU this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// stop stops the pings of clients from to to-1 and returns once they have.
func (p *clientsProc) stop(ctx context.Context, from, to int) error {
	want := fmt.Sprintf("%s %d %d", clientsStopped, from, to)
	a, err := p.ask(ctx, fmt.Sprintf("%s %d %d", clientsStop, from, to))
	if err == nil && a != want {
		err = fmt.Errorf("the clients process answered %q, want %q", a, want)
	}
	return err
}

// remountsSince is the remounts of Mooncake clients since t.
func (p *clientsProc) remountsSince(t time.Time) []remountEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []remountEvent
	for _, r := range p.remounts {
		if r.At.After(t) {
			out = append(out, r)
		}
	}
	return out
}

// close stops every client and waits for the process to end.
func (p *clientsProc) close() {
	p.stdin.Close()
	<-p.done
}
