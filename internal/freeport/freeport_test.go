package freeport

import (
	"net"
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
