package flightrec

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type written struct {
	path string
	err  error
}

func start(t *testing.T, dir string) (*Recorder, chan written) {
	t.Helper()
	ch := make(chan written, Keep+4)
	r, err := Start(dir, "moonraft-n1", func(path string, err error) { ch <- written{path, err} })
	require.NoError(t, err)
	r.delay = 50 * time.Millisecond
	return r, ch
}

func next(t *testing.T, ch chan written) string {
	t.Helper()
	select {
	case w := <-ch:
		require.NoError(t, w.err)
		return w.path
	case <-time.After(10 * time.Second):
		t.Fatal("no trace written")
		return ""
	}
}

// TestDump: a dump writes, after its delay, a Go execution trace named for
// the first reason given meanwhile; the directory keeps the newest Keep.
func TestDump(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "traces")
	r, ch := start(t, dir)
	defer r.Stop()
	for range 100 {
		runtime.Gosched()
	}
	r.Dump("sched")
	r.Dump("leadership-lost")
	path := next(t, ch)
	assert.Regexp(t, `/moonraft-n1-\d{8}T\d{6}\.\d{3}Z-sched\.trace$`, path)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(b, []byte("go 1.")), "a Go execution trace")
	assert.Greater(t, len(b), 1000, "it holds events")
	select {
	case w := <-ch:
		t.Fatalf("a second file for a stall reported while one was due: %v", w)
	case <-time.After(200 * time.Millisecond):
	}

	paths := []string{path}
	for range Keep + 1 {
		time.Sleep(2 * time.Millisecond) // a new name
		r.Dump("leader-silent")
		paths = append(paths, next(t, ch))
	}
	left, err := filepath.Glob(filepath.Join(dir, "*.trace"))
	require.NoError(t, err)
	assert.Equal(t, paths[2:], left, "the newest Keep are kept")
}

// TestStopDropsAPendingDump: a stop drops a write not yet begun.
func TestStopDropsAPendingDump(t *testing.T) {
	dir := t.TempDir()
	r, ch := start(t, dir)
	r.delay = time.Hour
	r.Dump("sched")
	r.Stop()
	r.Dump("sched")
	assert.Empty(t, ch)
	left, err := filepath.Glob(filepath.Join(dir, "*.trace"))
	require.NoError(t, err)
	assert.Empty(t, left)
}

// TestStartRefusesAFile: a directory that cannot be made is an error, not a
// recorder writing nowhere.
func TestStartRefusesAFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err := Start(filepath.Join(file, "traces"), "x", func(string, error) {})
	assert.ErrorContains(t, err, "flight recorder directory")
}
