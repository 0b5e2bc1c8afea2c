package freeport

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAddrNeverRepeats(t *testing.T) {
	got := map[string]bool{}
	for i := 0; i < 500; i++ {
		a, err := Addr()
		require.NoError(t, err)
		require.False(t, got[a], "%s handed out twice", a)
		got[a] = true
		l, err := net.Listen("tcp", a)
		require.NoError(t, err, "the address is free to bind")
		require.NoError(t, l.Close())
	}
}

// TestAddrOutsideEphemeralRange: a kernel-chosen port (":0" listeners,
// outgoing connections) can never be one handed out.
func TestAddrOutsideEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	for i := 0; i < 200; i++ {
		a, err := Addr()
		require.NoError(t, err)
		_, p, err := net.SplitHostPort(a)
		require.NoError(t, err)
		port, err := strconv.Atoi(p)
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, lowest)
		require.Less(t, port, low, "%s is in the ephemeral range from %d", a, low)
	}
}

// TestAddrDisjointAcrossProcesses: test packages run in parallel, each a
// process of its own; one never gets a port another holds.
func TestAddrDisjointAcrossProcesses(t *testing.T) {
	if os.Getenv("FREEPORT_CHILD") != "" {
		for range 100 {
			a, err := Addr()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Println("addr", a)
		}
		return
	}
	mine := map[string]bool{}
	for range 100 {
		a, err := Addr()
		require.NoError(t, err)
		mine[a] = true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAddrDisjointAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FREEPORT_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if a, ok := strings.CutPrefix(line, "addr "); ok {
			n++
			require.False(t, mine[a], "%s handed to both processes", a)
		}
	}
	require.Equal(t, 100, n, "%s", out)
}
