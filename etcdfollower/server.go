// Package etcdfollower is the read-only server of `moonraft --follow-etcd`:
// an observer outside the Raft group that follows the OpLog in etcd alone
// (oplog.Follower) and serves the contract's data reads over gRPC.
package etcdfollower

import (
	"context"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Config configures a follower.
type Config struct {
	ID       string
	GRPCAddr string
	Etcd     etcdbridge.Config
	// Snapshot, if set, is a MOONSNAP file to start from instead of seq 1.
	Snapshot string
	// TLS and Limits as for a node's gRPC server (Config.TLS, Config.Limits).
	TLS    transport.TLSFiles
	Limits transport.Limits
	Logger hclog.Logger
}

// Server serves GetReplicaList, ExistKey (no lease is granted: it cannot
// renew anything) and Status from an oplog.Follower.
type Server struct {
	cfg    Config
	store  *etcdbridge.Store
	f      *oplog.Follower
	grpc   *grpc.Server
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	runErr error
}

var _ service.Data = (*Server)(nil)

// Start connects to etcd, seeds from the snapshot if given, and starts
// following and serving.
func Start(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	var opts []grpc.ServerOption
	if cfg.TLS.Enabled() {
		tc, err := cfg.TLS.ServerConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	if err := cfg.Limits.Validate(); err != nil {
		return nil, err
	}
	store, err := etcdbridge.Open(cfg.Etcd)
	if err != nil {
		return nil, err
	}
	ef := &Server{cfg: cfg, store: store,
		f: oplog.NewFollower(oplog.FollowerConfig{Feed: store, Logger: cfg.Logger.Named("follower")})}
	if cfg.Snapshot != "" {
		if err := ef.seed(cfg.Snapshot); err != nil {
			_ = store.Close()
			return nil, err
		}
	}
	l, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		_ = store.Close()
		return nil, errcode.New(errcode.InvalidParams, "grpc address %s: %v", cfg.GRPCAddr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ef.cancel = cancel
	ef.grpc = transport.NewServer(ef, transport.ServerConfig{Limits: cfg.Limits}, opts...)
	ef.wg.Add(2)
	go func() {
		defer ef.wg.Done()
		if err := ef.f.Run(ctx); err != nil {
			cfg.Logger.Error("follower stopped", "error", err)
			ef.mu.Lock()
			ef.runErr = err
			ef.mu.Unlock()
		}
	}()
	go func() {
		defer ef.wg.Done()
		if err := ef.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			cfg.Logger.Error("grpc server stopped", "error", err)
		}
	}()
	return ef, nil
}

func (ef *Server) seed(path string) error {
	file, err := os.Open(path)
	if err != nil {
		return errcode.New(errcode.FileNotFound, "snapshot %s: %v", path, err)
	}
	defer file.Close()
	state := fsm.New()
	h, err := state.Restore(file)
	if err != nil {
		return err
	}
	objs := map[string]oplog.ObjectState{}
	state.EachComplete(func(key string, keySeq uint64, p oplog.PutEndPayload) {
		objs[key] = oplog.ObjectState{Size: p.Size, KeySeq: keySeq, Payload: p}
	})
	return ef.f.Seed(h.AppliedSeq, objs)
}

// Follower exposes the follower for tests and benchmarks.
func (ef *Server) Follower() *oplog.Follower { return ef.f }

// Err is why following stopped (a bad entry), or nil while it runs.
func (ef *Server) Err() error {
	ef.mu.Lock()
	defer ef.mu.Unlock()
	return ef.runErr
}

// Close stops following and serving.
func (ef *Server) Close() error {
	ef.grpc.GracefulStop()
	ef.cancel()
	ef.wg.Wait()
	return ef.store.Close()
}

func readOnly() error {
	return errcode.New(errcode.UnavailableInCurrentMode, "this is a read-only etcd follower: send writes to the Raft cluster")
}

func (ef *Server) Now() int64         { return time.Now().UnixMilli() }
func (ef *Server) ClientTTLMs() int64 { return 0 }

func (ef *Server) Propose(context.Context, fsm.Command) (fsm.Result, error) {
	return fsm.Result{}, readOnly()
}

func (ef *Server) ProposeBatch(context.Context, []fsm.Command) ([]fsm.Result, error) {
	return nil, readOnly()
}

func (ef *Server) GetReplicaList(_ context.Context, key string) ([]oplog.ReplicaDesc, fsm.Grant, error) {
	o, ok := ef.f.Get(key)
	if !ok {
		return nil, fsm.Grant{}, errcode.New(errcode.ObjectNotFound, "key %q not found (as of seq %d)", key, ef.f.AppliedSeq())
	}
	return o.Payload.Replicas, fsm.Grant{}, nil
}

func (ef *Server) ExistKey(_ context.Context, key string) (bool, fsm.Grant, error) {
	_, ok := ef.f.Get(key)
	return ok, fsm.Grant{}, nil
}

func (ef *Server) BatchGetReplicaList(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return service.BatchGetByKey(ctx, keys, ef.GetReplicaList)
}

func (ef *Server) BatchExistKey(ctx context.Context, keys []string) ([]fsm.KeyRead, error) {
	return service.BatchExistByKey(ctx, keys, ef.ExistKey)
}

func (ef *Server) GetReplicaListByRegex(context.Context, string) ([]fsm.KeyReplicas, error) {
	return nil, readOnly()
}

func (ef *Server) Ping(context.Context, string) (bool, error) { return false, readOnly() }

// ViewVersion is 0: a follower of etcd has no Raft group.
func (ef *Server) ViewVersion() uint64 { return 0 }

// SegmentStatus is not known here: the OpLog carries objects, not segments.
func (ef *Server) SegmentStatus(context.Context, string, bool) ([]fsm.SegmentStatus, error) {
	return nil, readOnly()
}

// Progress is Status without the digest.
func (ef *Server) Progress() *service.NodeStatus {
	return &service.NodeStatus{ID: ef.cfg.ID, GRPCAddr: ef.cfg.GRPCAddr, Role: "etcd-follower",
		AppliedSeq: ef.f.AppliedSeq(), Objects: uint64(ef.f.Len()), EtcdExport: true}
}

func (ef *Server) Status() *service.NodeStatus {
	d := ef.f.ObjectSetDigest()
	return &service.NodeStatus{
		ID:              ef.cfg.ID,
		GRPCAddr:        ef.cfg.GRPCAddr,
		Role:            "etcd-follower",
		AppliedSeq:      ef.f.AppliedSeq(),
		Objects:         uint64(ef.f.Len()),
		ObjectSetDigest: hex.EncodeToString(d[:]),
		EtcdExport:      true,
	}
}
