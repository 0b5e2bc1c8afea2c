package main

import (
	"testing"

	"github.com/moonraft/moonraft/transport/certgen"
	"github.com/stretchr/testify/require"
)

func writeTestCerts(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	c, err := certgen.NewCA("test")
	require.NoError(t, err)
	ca, err = c.WriteCA(dir, false)
	require.NoError(t, err)
	p, err := c.Node("n0")
	require.NoError(t, err)
	cert, key, err = p.Write(dir, "n0")
	require.NoError(t, err)
	return ca, cert, key
}
