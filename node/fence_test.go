package node

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/raftnet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFencedStream: a cut closes the connections dialled out and refuses
// new ones, leaves inbound ones alone, and ends when let go.
func TestFencedStream(t *testing.T) {
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := peer.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	defer func() {
		peer.Close()
		for c := range accepted {
			c.Close()
		}
	}()
	tcp, err := raftnet.NewTCPStreamLayer("127.0.0.1:0")
	require.NoError(t, err)
	s := newFencedStream(tcp)
	defer s.Close()
	addr := raft.ServerAddress(peer.Addr().String())

	out, err := s.Dial(addr, time.Second)
	require.NoError(t, err)
	in, err := net.Dial("tcp", s.Addr().String())
	require.NoError(t, err)
	defer in.Close()
	inbound, err := s.Accept()
	require.NoError(t, err)
	defer inbound.Close()

	s.cut()
	_, err = out.Write([]byte("heartbeat"))
	assert.Error(t, err, "an outgoing connection is closed by the cut")
	_, err = s.Dial(addr, time.Second)
	assert.ErrorIs(t, err, errFenced)
	_, err = in.Write([]byte("vote"))
	assert.NoError(t, err, "inbound connections stay")
	assert.Empty(t, s.out)

	assert.True(t, s.letGo())
	assert.False(t, s.letGo(), "let go once")
	again, err := s.Dial(addr, time.Second)
	require.NoError(t, err)
	require.NoError(t, again.Close())
	assert.Empty(t, s.out, "a closed connection is forgotten")
}
