package freeport

import (
	"net"
	"strconv"
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
