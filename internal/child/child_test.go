package child

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func count(t *testing.T, log, s string) int {
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	return strings.Count(string(b), s)
}

func TestLifecycle(t *testing.T) {
	log := filepath.Join(t.TempDir(), "p.log")
	p := &Proc{Bin: "/bin/sh", Args: []string{"-c", "echo up; exec sleep 60"}, LogPath: log}
	assert.False(t, p.Running(), "not started")
	require.NoError(t, p.Start())
	require.True(t, p.Running())
	require.NoError(t, p.Start(), "starting a running process is a no-op")
	require.Eventually(t, func() bool { return count(t, log, "up\n") == 1 }, 5*time.Second, 10*time.Millisecond)

	// A stopped (SIGSTOP) process is alive, and Stop still ends it.
	stopped, err := p.Stopped()
	require.NoError(t, err)
	assert.False(t, stopped)
	p.Signal(syscall.SIGSTOP)
	assert.True(t, p.Running())
	require.Eventually(t, func() bool { s, err := p.Stopped(); return err == nil && s }, 5*time.Second, 5*time.Millisecond)
	p.Stop(5 * time.Second)
	assert.False(t, p.Running())

	// Started again with the same arguments; the log is appended to.
	require.NoError(t, p.Start())
	require.True(t, p.Running())
	require.Eventually(t, func() bool { return count(t, log, "up\n") == 2 }, 5*time.Second, 10*time.Millisecond)
	p.Kill()
	assert.False(t, p.Running())
	assert.Equal(t, 2, count(t, log, " start -c echo up"), "a start line per run")
	assert.Equal(t, 1, count(t, log, " exit signal: terminated"), "Stop ended the first run")
	assert.Equal(t, 1, count(t, log, " exit signal: killed"), "Kill the second")
}

func TestStopAllKillsWhatIgnoresSIGTERM(t *testing.T) {
	log := filepath.Join(t.TempDir(), "stubborn.log")
	ps := []*Proc{
		{Bin: "/bin/sh", Args: []string{"-c", "exec sleep 60"}},
		{Bin: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo ready; while :; do sleep 1; done"}, LogPath: log},
	}
	for _, p := range ps {
		require.NoError(t, p.Start())
	}
	require.Eventually(t, func() bool { return count(t, log, "ready\n") == 1 }, 5*time.Second, 10*time.Millisecond)
	StopAll(300*time.Millisecond, ps...)
	for _, p := range ps {
		assert.False(t, p.Running())
	}
	assert.Equal(t, 1, count(t, log, " exit signal: killed"), "SIGTERM ignored: killed after the grace time")
}

// TestCPUTime: a busy child accrues CPU time, a sleeping one next to none,
// and a child that is not running has no reading.
func TestCPUTime(t *testing.T) {
	busy := &Proc{Bin: "/bin/sh", Args: []string{"-c", "while :; do :; done"}}
	idle := &Proc{Bin: "/bin/sh", Args: []string{"-c", "exec sleep 60"}}
	_, err := busy.CPUTime()
	assert.Error(t, err, "not started")
	require.NoError(t, busy.Start())
	require.NoError(t, idle.Start())
	defer StopAll(time.Second, busy, idle)
	require.Eventually(t, func() bool {
		d, err := busy.CPUTime()
		return err == nil && d >= 200*time.Millisecond
	}, 10*time.Second, 20*time.Millisecond, "a busy loop uses CPU")
	d, err := idle.CPUTime()
	require.NoError(t, err)
	assert.Less(t, d, 100*time.Millisecond, "sleep uses next to none")
}
