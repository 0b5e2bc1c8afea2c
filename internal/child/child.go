// Package child runs the OS processes that tests, the fault suite and
// `moonbench --local` start: moonraft nodes, etcd, etcd followers. A child
// dies with its parent (Pdeathsig), so a run killed half-way leaves nothing
// behind; it can be signalled, stopped and started again with its
// original arguments.
package child

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one child process, started again with the same arguments after
// it exits.
type Proc struct {
	Bin  string
	Args []string
	// LogPath, if set, gets stdout and stderr appended across restarts,
	// with a line at each start and exit; otherwise they go to Output
	// (nil: discarded).
	LogPath string
	Output  io.Writer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts p unless it is running.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.exitedLocked() {
		return nil
	}
	out, closeOut := p.Output, func() {}
	if p.LogPath != "" {
		f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		fmt.Fprintf(f, "=== %s start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.Args, " "))
		out, closeOut = f, func() { f.Close() }
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		closeOut()
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		if p.LogPath != "" {
			fmt.Fprintf(out, "=== %s exit %v\n", time.Now().Format(time.RFC3339Nano), cmd.ProcessState)
		}
		closeOut()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

func (p *Proc) exitedLocked() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Running reports whether p is alive (a stopped process counts as alive).
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil && !p.exitedLocked()
}

// Signal sends sig to p if it is alive.
func (p *Proc) Signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.exitedLocked() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// Wait waits up to d for p to exit and reports whether it has.
func (p *Proc) Wait(d time.Duration) bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// Kill SIGKILLs p and waits for it to be gone.
func (p *Proc) Kill() {
	p.Signal(syscall.SIGKILL)
	p.Wait(10 * time.Second)
}

// Stop ends p gracefully (SIGTERM, resumed first if it was stopped), then
// by SIGKILL after d.
func (p *Proc) Stop(d time.Duration) {
	p.Signal(syscall.SIGCONT)
	p.Signal(syscall.SIGTERM)
	if !p.Wait(d) {
		p.Kill()
	}
}

// StopAll stops every process at once, each as Stop does.
func StopAll(d time.Duration, ps ...*Proc) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() { p.Stop(d) })
	}
	wg.Wait()
}

// clockTicks is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// every Linux architecture Go supports).
const clockTicks = 100

// CPUTime is the CPU time, user and system, that p has used so far (Linux:
// read from /proc).
func (p *Proc) CPUTime() (time.Duration, error) {
	pid, err := p.pid()
	if err != nil {
		return 0, err
	}
	f, err := statFields(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// Stopped reports whether every thread of p has stopped (Linux: read from
// /proc). A SIGSTOP takes effect as each thread next runs, not when
// Signal returns, so a test that needs p stopped waits for this.
func (p *Proc) Stopped() (bool, error) {
	pid, err := p.pid()
	if err != nil {
		return false, err
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, err
	}
	for _, t := range tasks {
		f, err := statFields(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			return false, err
		}
		if len(f) == 0 || (f[0] != "T" && f[0] != "t") {
			return false, nil
		}
	}
	return true, nil
}

func (p *Proc) pid() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.exitedLocked() {
		return 0, fmt.Errorf("%s is not running", p.Bin)
	}
	return p.cmd.Process.Pid, nil
}

// statFields reads a /proc stat file and returns its fields after the
// command name (field 2), which is in parentheses and may hold spaces: the
// state (field 3) first.
func statFields(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, fmt.Errorf("%s: no command name", path)
	}
	return strings.Fields(string(b[i+1:])), nil
}
