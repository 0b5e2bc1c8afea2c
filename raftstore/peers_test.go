package raftstore

import (
	"testing"

	"github.com/moonraft/moonraft/errcode"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePeers(t *testing.T) {
	peers, err := ParsePeers("a=127.0.0.1:1, b=127.0.0.1:2")
	require.NoError(t, err)
	assert.Equal(t, []Peer{{"a", "127.0.0.1:1"}, {"b", "127.0.0.1:2"}}, peers)
	for _, bad := range []string{"a", "=x", "a=", "a=1,a=2"} {
		_, err := ParsePeers(bad)
		assert.Equal(t, errcode.InvalidParams, errcode.Of(err), bad)
	}
}
