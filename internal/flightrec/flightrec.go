// Package flightrec keeps the last seconds of this process's Go execution
// trace in memory (runtime/trace's flight recorder) and writes them to a
// file when a node reports a stall. A stall lasts a few hundred
// milliseconds and is over before anyone can look; the trace shows what the
// process did around it — the collector, the scheduler's queues, system
// calls, which goroutine waited on what — which no log line or metric can
// (`go tool trace FILE` reads it).
package flightrec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/trace"
	"sort"
	"sync"
	"time"
)

// Window is how much trace the recorder keeps at least.
const Window = 5 * time.Second

// Delay is how long after a stall its file is written: stalls come in
// clusters (a collection, a burst of requests), so the file holds the
// seconds before the first and what came right after, and the stalls
// reported meanwhile join it.
const Delay = 2 * time.Second

// maxBytes bounds the recorder's memory and each file, over Window if
// need be.
const maxBytes = 64 << 20

// Keep is how many trace files a recorder leaves in its directory: a
// flapping node must not fill the disk.
const Keep = 8

// Recorder is a running flight recorder and where it writes.
type Recorder struct {
	fr     *trace.FlightRecorder
	dir    string
	prefix string
	delay  time.Duration
	done   func(path string, err error)

	mu      sync.Mutex
	pending *time.Timer // the write Dump scheduled; nil: none
	stopped bool
	writing sync.WaitGroup
}

// Start starts the process's flight recorder, writing into dir (created if
// need be) files named prefix-TIME-REASON.trace and telling done what each
// write did. Only one may run in a process.
func Start(dir, prefix string, done func(path string, err error)) (*Recorder, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("flight recorder directory: %w", err)
	}
	fr := trace.NewFlightRecorder(trace.FlightRecorderConfig{MinAge: Window, MaxBytes: maxBytes})
	if err := fr.Start(); err != nil {
		return nil, fmt.Errorf("flight recorder: %w", err)
	}
	return &Recorder{fr: fr, dir: dir, prefix: prefix, delay: Delay, done: done}, nil
}

// Dump has the recorder's window written Delay from now to a new file
// named for reason (the first reason, when a write is already due).
func (r *Recorder) Dump(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending != nil || r.stopped {
		return
	}
	at := time.Now()
	r.writing.Add(1)
	r.pending = time.AfterFunc(r.delay, func() {
		defer r.writing.Done()
		path, err := r.write(at, reason)
		r.mu.Lock()
		r.pending = nil
		r.mu.Unlock()
		r.done(path, err)
	})
}

// write writes the window to a file named for the stall at and its reason,
// then removes all but the newest Keep of the recorder's files.
func (r *Recorder) write(at time.Time, reason string) (string, error) {
	name := fmt.Sprintf("%s-%s-%s.trace", r.prefix, at.UTC().Format("20060102T150405.000Z"), reason)
	path := filepath.Join(r.dir, name)
	// Written aside and renamed, so no reader sees half a file.
	tmp := path + ".partial"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return "", err
	}
	_, err = r.fr.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	return path, r.prune()
}

// prune removes this recorder's oldest files beyond Keep. Names sort by
// time, since the time follows the prefix.
func (r *Recorder) prune() error {
	files, err := filepath.Glob(filepath.Join(r.dir, r.prefix+"-*.trace"))
	if err != nil || len(files) <= Keep {
		return err
	}
	sort.Strings(files)
	var errs []error
	for _, f := range files[:len(files)-Keep] {
		errs = append(errs, os.Remove(f))
	}
	return errors.Join(errs...)
}

// Stop drops a write not yet begun, waits for one under way, and stops the
// recorder.
func (r *Recorder) Stop() {
	r.mu.Lock()
	r.stopped = true
	if r.pending != nil && r.pending.Stop() {
		r.pending = nil
		r.writing.Done()
	}
	r.mu.Unlock()
	r.writing.Wait()
	r.fr.Stop()
}
