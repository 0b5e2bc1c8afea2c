package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/cmd/node/serve"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/node"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/moonraft/moonraft/transport"
	"github.com/moonraft/moonraft/transport/certgen"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func freeAddr(t *testing.T) string {
	a, err := freeport.Addr()
	require.NoError(t, err)
	return a
}

// TestTLSAndAdminToken: moonctl talks to a node with mutual TLS given
// --tls-ca/--tls-cert/--tls-key, and its admin commands need the token.
func TestTLSAndAdminToken(t *testing.T) {
	dir := t.TempDir()
	ca, err := certgen.NewCA("test")
	require.NoError(t, err)
	caFile, err := ca.WriteCA(dir, false)
	require.NoError(t, err)
	np, err := ca.Node("n0")
	require.NoError(t, err)
	nodeCert, nodeKey, err := np.Write(dir, "n0")
	require.NoError(t, err)
	cp, err := ca.Client("moonctl")
	require.NoError(t, err)
	clientCert, clientKey, err := cp.Write(dir, "moonctl")
	require.NoError(t, err)
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("t0k3n\n"), 0o600))

	cfg := node.DefaultConfig()
	cfg.ID, cfg.DataDir, cfg.RaftAddr, cfg.GRPCAddr = "n0", t.TempDir(), freeAddr(t), freeAddr(t)
	cfg.Bootstrap, cfg.Peers = true, []raftstore.Peer{{ID: "n0", RaftAddr: cfg.RaftAddr}}
	cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = 200*time.Millisecond, 200*time.Millisecond, 100*time.Millisecond
	cfg.TLS = transport.TLSFiles{Cert: nodeCert, Key: nodeKey, CA: caFile}
	cfg.AdminToken = "t0k3n"
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Warn})
	cfg.Listen = func(n *node.Node) (func(), error) {
		l, err := serve.Open(n, serve.Config{GRPCAddr: cfg.GRPCAddr, AdminToken: cfg.AdminToken})
		if err != nil {
			return nil, err
		}
		return l.Stop, nil
	}
	nd, err := node.Start(context.Background(), cfg)
	require.NoError(t, err)
	defer nd.Close()
	require.Eventually(t, nd.IsLeader, 10*time.Second, 10*time.Millisecond)

	tlsArgs := []string{"--endpoints", cfg.GRPCAddr, "--tls-ca", caFile, "--tls-cert", clientCert, "--tls-key", clientKey}
	moonctl := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		return out.String(), errOut.String(), code
	}
	out, errOut, code := moonctl(append(tlsArgs, "status")...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "leader")

	_, errOut, code = moonctl(append(tlsArgs, "members", "list")...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "PERMISSION_DENIED")
	_, errOut, code = moonctl(append(tlsArgs, "rm", "--all")...)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "PERMISSION_DENIED")

	out, errOut, code = moonctl(append(tlsArgs, "--admin-token-file", tokenFile, "members", "list")...)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "n0")
	_, errOut, code = moonctl(append(tlsArgs, "--admin-token", "t0k3n", "rm", "--all")...)
	require.Equal(t, 0, code, errOut)
	_, errOut, code = moonctl(append(tlsArgs, "--admin-token", "t0k3n", "--admin-token-file", tokenFile, "members", "list")...)
	assert.Equal(t, 2, code, "a usage error")
	assert.Contains(t, errOut, "not both")

	// Without a client certificate, or in plaintext, nothing is served.
	_, errOut, code = moonctl("--endpoints", cfg.GRPCAddr, "--tls-ca", caFile, "--timeout", "1s", "get", "k")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "UNAVAILABLE_IN_CURRENT_STATUS")
	_, errOut, code = moonctl("--endpoints", cfg.GRPCAddr, "--timeout", "1s", "get", "k")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "UNAVAILABLE_IN_CURRENT_STATUS")
}
