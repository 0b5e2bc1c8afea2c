package node

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
)

// Start runs a node with its servers: Raft (New), the gRPC API on
// GRPCAddr, health and status on HTTPAddr, and — for a fresh node given
// Join — asks the cluster to add it as a voter.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	n, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := n.serve(); err != nil {
		_ = n.Close()
		return nil, err
	}
	if cfg.Join != "" && !n.hadState {
		if err := n.join(ctx); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	return n, nil
}

func (n *Node) serve() error {
	if n.cfg.GRPCAddr != "" {
		l, err := net.Listen("tcp", n.cfg.GRPCAddr)
		if err != nil {
			return errcode.New(errcode.InvalidParams, "grpc address %s: %v", n.cfg.GRPCAddr, err)
		}
		var opts []grpc.ServerOption
		if n.serverTLS != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(n.serverTLS)))
		}
		n.grpc = transport.NewServer(n, transport.ServerConfig{
			Admin: n, Limits: n.cfg.Limits, AdminToken: n.cfg.AdminToken, Observe: n.metrics.observeRPC,
		}, opts...)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				n.log.Error("grpc server stopped", "error", err)
			}
		}()
	}
	if n.cfg.MooncakeAddr != "" {
		l, err := net.Listen("tcp", n.cfg.MooncakeAddr)
		if err != nil {
			return errcode.New(errcode.InvalidParams, "mooncake address %s: %v", n.cfg.MooncakeAddr, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		n.stopMooncake = cancel
		front := mooncakeapi.NewFront(n, n, n.log, uint64(n.cfg.Params.LeaseTTLMs))
		n.mooncake = front
		srv := &cororpc.Server{Handler: front, Logger: n.log, Loops: n.cfg.MooncakeLoops}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer front.Close()
			if err := srv.Serve(ctx, l); err != nil {
				n.log.Error("mooncake protocol server stopped", "error", err)
			}
		}()
	}
	if n.cfg.HTTPAddr != "" {
		l, err := net.Listen("tcp", n.cfg.HTTPAddr)
		if err != nil {
			return errcode.New(errcode.InvalidParams, "http address %s: %v", n.cfg.HTTPAddr, err)
		}
		if n.cfg.HTTPTLS {
			hc := n.serverTLS.Clone()
			if hc.ClientCAs != nil {
				hc.ClientAuth = tls.VerifyClientCertIfGiven
			}
			l = tls.NewListener(l, hc)
		}
		n.http = &http.Server{Handler: n.httpHandler(), ReadHeaderTimeout: 5 * time.Second}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.http.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				n.log.Error("http server stopped", "error", err)
			}
		}()
	}
	return nil
}

// DrainMooncake keeps the Mooncake front serving until the clients moved
// to a new leader (mooncakeapi.Front.Drain).
func (n *Node) DrainMooncake(ctx context.Context, quiet time.Duration) {
	if n.mooncake != nil {
		n.mooncake.Drain(ctx, quiet, 2*n.cfg.ElectionTimeout)
	}
}

// stopServers ends the API servers; in-flight calls get a short grace.
func (n *Node) stopServers() {
	if n.stopMooncake != nil {
		n.stopMooncake()
	}
	if n.grpc != nil {
		done := make(chan struct{})
		go func() {
			n.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			n.grpc.Stop()
			<-done
		}
	}
	if n.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = n.http.Shutdown(ctx)
	}
}

func (n *Node) httpHandler() http.Handler {
	mux := http.NewServeMux()
	if n.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	// Ready: part of a cluster with a known leader; a leader only once
	// promoted (before that it refuses clients).
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := n.Status()
		ready := st.LeaderID != "" && (st.Role != "leader" || st.Promoted)
		if !ready {
			http.Error(w, "not ready: role "+st.Role+", leader "+st.LeaderID+"\n", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("/metrics", n.metrics.handler())
	mux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		b, err := protojson.Marshal(transport.NodeStatusPB(n.Status()))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(b, '\n'))
	})
	return mux
}

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
