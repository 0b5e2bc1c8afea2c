package node

import (
	"context"
	"crypto/tls"
	"net/http"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
)

// Start runs a node (New), opens its listeners with cfg.Listen, and — for
// a fresh node given Join — asks the cluster to add it as a voter.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	n, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Listen != nil {
		stop, err := cfg.Listen(n)
		if err != nil {
			_ = n.Close()
			return nil, err
		}
		n.stopListeners = stop
	}
	if cfg.Join != "" && !n.hadState {
		if err := n.join(ctx); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	return n, nil
}

// ServerTLS is the TLS configuration of the node's servers (nil:
// plaintext).
func (n *Node) ServerTLS() *tls.Config { return n.serverTLS }

// ObserveRPC counts an answered gRPC call in the node's metrics: its short
// method name, its answer's code and its duration.
func (n *Node) ObserveRPC(method, code string, d time.Duration) {
	n.metrics.observeRPC(method, code, d)
}

// ObserveMooncake records an answered Mooncake-protocol call's duration
// in the node's metrics.
func (n *Node) ObserveMooncake(function string, d time.Duration) {
	n.metrics.observeMooncake(function, d)
}

// MetricsHandler serves the node's Prometheus metrics.
func (n *Node) MetricsHandler() http.Handler { return n.metrics.handler() }

// clientConfig is a client of the cluster with this node's TLS and admin
// token.
func (n *Node) clientConfig(endpoints ...string) client.Config {
	return client.Config{Endpoints: endpoints, TLS: n.clientTLS, AdminToken: n.cfg.AdminToken}
}

// join asks the cluster, through any member, to add this node as a voter.
func (n *Node) join(ctx context.Context) error {
	c, err := client.Dial(n.clientConfig(n.cfg.Join))
	if err != nil {
		return err
	}
	defer c.Close()
	jctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.AddVoter(jctx, n.cfg.ID, string(n.trans.LocalAddr()), n.cfg.GRPCAddr); err != nil {
		return errcode.New(errcode.Of(err), "join through %s: %v", n.cfg.Join, err)
	}
	n.log.Info("joined the cluster", "through", n.cfg.Join)
	return nil
}
