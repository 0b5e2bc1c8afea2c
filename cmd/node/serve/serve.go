// Package serve opens a node's listeners and wires them to the node and
// the fronts: the gRPC API (transport), the Mooncake protocol
// (mooncakeapi's Front on cororpc's event loops) and HTTP (health,
// readiness, status, metrics, pprof). bin/moonraft opens them through
// node.Config.Listen, and node's tests the same way. It knows the node
// only through the service contract and the small interface below, so
// the Raft host serves no listener itself and imports neither front.
package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/transport"
)

// Node is what the listeners need of a node (node.Node).
type Node interface {
	service.Data
	service.Admin
	mooncakeapi.Leadership
	// ServerTLS is the node's server TLS configuration (nil: plaintext).
	ServerTLS() *tls.Config
	// ObserveRPC records an answered gRPC call in the node's metrics.
	ObserveRPC(method, code string, d time.Duration)
	// ObserveMooncake records an answered Mooncake-protocol call.
	ObserveMooncake(function string, d time.Duration)
	// MetricsHandler serves the node's Prometheus metrics.
	MetricsHandler() http.Handler
}

// Config says where to listen and how.
type Config struct {
	GRPCAddr     string // "": no gRPC API
	MooncakeAddr string // "": no Mooncake protocol
	HTTPAddr     string // "": no HTTP
	// MooncakeLoops is the number of event loops of the Mooncake protocol
	// (cororpc.Server.Loops).
	MooncakeLoops int
	HTTPTLS       bool // serve HTTP over TLS with the node's certificate
	Pprof         bool // also serve Go's profiler on HTTP
	AdminToken    string
	Limits        transport.Limits
	LeaseTTLMs    uint64        // the read lease the Mooncake protocol reports
	LeaderWithin  time.Duration // how soon a new leader promotes after a handover (the Mooncake drain)
	Logger        hclog.Logger
}

// Listeners are a node's open listeners.
type Listeners struct {
	grpc         *grpc.Server
	http         *http.Server
	mooncake     *mooncakeapi.Front // nil: not serving
	stopMooncake context.CancelFunc
	leaderWithin time.Duration
	wg           sync.WaitGroup
}

// Open opens the listeners cfg names and serves n on them until Stop.
func Open(n Node, cfg Config) (*Listeners, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	s := &Listeners{leaderWithin: cfg.LeaderWithin}
	if err := s.open(n, cfg); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Listeners) open(n Node, cfg Config) error {
	if cfg.GRPCAddr != "" {
		l, err := net.Listen("tcp", cfg.GRPCAddr)
		if err != nil {
			return errcode.New(errcode.InvalidParams, "grpc address %s: %v", cfg.GRPCAddr, err)
		}
		var opts []grpc.ServerOption
		if tc := n.ServerTLS(); tc != nil {
			opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
		}
		s.grpc = transport.NewServer(n, transport.ServerConfig{
			Admin: n, Limits: cfg.Limits, AdminToken: cfg.AdminToken, Observe: n.ObserveRPC,
		}, opts...)
		s.wg.Go(func() {
			if err := s.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				cfg.Logger.Error("grpc server stopped", "error", err)
			}
		})
	}
	if cfg.MooncakeAddr != "" {
		l, err := net.Listen("tcp", cfg.MooncakeAddr)
		if err != nil {
			return errcode.New(errcode.InvalidParams, "mooncake address %s: %v", cfg.MooncakeAddr, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		s.stopMooncake = cancel
		front := mooncakeapi.NewFront(n, n, cfg.Logger, cfg.LeaseTTLMs)
		s.mooncake = front
		srv := &cororpc.Server{Handler: front, Logger: cfg.Logger, Loops: cfg.MooncakeLoops, Observe: func(id uint32, d time.Duration) {
			n.ObserveMooncake(mooncakeapi.FunctionName(id), d)
		}}
		s.wg.Go(func() {
			defer front.Close()
			if err := srv.Serve(ctx, l); err != nil {
				cfg.Logger.Error("mooncake protocol server stopped", "error", err)
			}
		})
	}
	if cfg.HTTPAddr != "" {
		l, err := net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			return errcode.New(errcode.InvalidParams, "http address %s: %v", cfg.HTTPAddr, err)
		}
		if cfg.HTTPTLS {
			hc := n.ServerTLS().Clone()
			if hc == nil {
				_ = l.Close()
				return errcode.New(errcode.InvalidParams, "http over TLS needs the node's certificate (--tls-cert, --tls-key)")
			}
			if hc.ClientCAs != nil {
				hc.ClientAuth = tls.VerifyClientCertIfGiven
			}
			l = tls.NewListener(l, hc)
		}
		s.http = &http.Server{Handler: HTTPHandler(n, cfg.Pprof), ReadHeaderTimeout: 5 * time.Second}
		s.wg.Go(func() {
			if err := s.http.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				cfg.Logger.Error("http server stopped", "error", err)
			}
		})
	}
	return nil
}

// DrainMooncake keeps the Mooncake protocol serving until its clients have
// moved to a new leader (mooncakeapi.Front.Drain), or ctx ends.
func (s *Listeners) DrainMooncake(ctx context.Context, quiet time.Duration) {
	if s.mooncake != nil {
		s.mooncake.Drain(ctx, quiet, s.leaderWithin)
	}
}

// Stop closes every listener; calls in flight get a short grace.
func (s *Listeners) Stop() {
	if s.stopMooncake != nil {
		s.stopMooncake()
	}
	if s.grpc != nil {
		done := make(chan struct{})
		go func() {
			s.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			s.grpc.Stop()
			<-done
		}
	}
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.http.Shutdown(ctx)
	}
	s.wg.Wait()
}

// HTTPHandler serves /healthz, /readyz, /status, /metrics and, with
// withPprof, /debug/pprof/.
func HTTPHandler(n Node, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	if withPprof {
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
	mux.Handle("/metrics", n.MetricsHandler())
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
