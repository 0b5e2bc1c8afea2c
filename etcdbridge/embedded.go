package etcdbridge

import (
	"net/url"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/internal/freeport"
)

// EmbeddedReadyTimeout bounds how long StartEmbedded waits for the server
// to elect itself and serve.
const EmbeddedReadyTimeout = 60 * time.Second

// Embedded is a single-member etcd running inside this process, for
// `moonraft --dev`, `moonraft etcd` and tests.
type Embedded struct {
	etcd      *embed.Etcd
	endpoints []string
	closeOnce sync.Once
	level     zap.AtomicLevel
}

// EmbeddedCompactionRetention is how much etcd history the embedded etcd
// keeps (periodic auto-compaction): each exported OpLog entry adds several
// hundred bytes of history, so under a sustained burst of writes five
// minutes of it filled etcd's default 2 GiB quota. A production etcd needs
// the same sizing (docs/OPERATIONS.md, "etcd compaction").
const EmbeddedCompactionRetention = time.Minute

// EmbeddedQuotaBytes is the embedded etcd's space quota: etcd's suggested
// maximum, so history retained during a burst leaves room.
const EmbeddedQuotaBytes = 8 << 30

// StartEmbedded starts a single-member etcd with its data in dir, serving
// clients on clientURL (like "http://127.0.0.1:2379") and peers on peerURL.
// etcd cannot listen on port 0, so an empty URL takes a free local port
// (FreeLocalURL). It returns once the member serves, or fails after
// EmbeddedReadyTimeout. etcd logs errors only.
func StartEmbedded(dir, clientURL, peerURL string) (*Embedded, error) {
	var err error
	if clientURL == "" {
		if clientURL, err = FreeLocalURL(); err != nil {
			return nil, err
		}
	}
	if peerURL == "" {
		if peerURL, err = FreeLocalURL(); err != nil {
			return nil, err
		}
	}
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "embedded etcd: client URL %q: %v", clientURL, err)
	}
	pu, err := url.Parse(peerURL)
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "embedded etcd: peer URL %q: %v", peerURL, err)
	}
	cfg := embed.NewConfig()
	cfg.Name = "moonraft"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	// The OpLog and the lease renewals rewrite keys all the time: without
	// compaction etcd keeps every old revision and its database grows
	// without bound (the soak showed ~20 MiB a minute). Watchers that fall
	// further behind than this resync from the OpLog (etcdbridge.Watch).
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = EmbeddedCompactionRetention.String()
	cfg.QuotaBackendBytes = EmbeddedQuotaBytes
	// Our own logger, so Close can silence the errors etcd logs about its
	// own listeners closing.
	level := zap.NewAtomicLevelAt(zapcore.ErrorLevel)
	lcfg := logutil.DefaultZapLoggerConfig
	lcfg.Level = level
	lg, err := lcfg.Build()
	if err != nil {
		return nil, errcode.New(errcode.InternalError, "embedded etcd: logger: %v", err)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, errcode.New(errcode.EtcdOperationError, "embedded etcd in %s (client %s, peer %s): %v", dir, clientURL, peerURL, err)
	}
	t := time.NewTimer(EmbeddedReadyTimeout)
	defer t.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, errcode.New(errcode.EtcdOperationError, "embedded etcd in %s failed to start: %v", dir, err)
	case <-t.C:
		e.Server.Stop()
		e.Close()
		return nil, errcode.New(errcode.EtcdOperationError, "embedded etcd in %s not ready after %v", dir, EmbeddedReadyTimeout)
	}
	return &Embedded{etcd: e, endpoints: []string{cu.String()}, level: level}, nil
}

// Endpoints returns the client URLs to dial.
func (e *Embedded) Endpoints() []string { return append([]string(nil), e.endpoints...) }

// Err reports a fatal error of the running server (a listener failing).
func (e *Embedded) Err() <-chan error { return e.etcd.Err() }

// Close stops the server and waits for it; calling it again does nothing.
func (e *Embedded) Close() error {
	e.closeOnce.Do(func() {
		e.level.SetLevel(zapcore.FatalLevel)
		e.etcd.Close()
	})
	return nil
}

// FreeLocalURL returns "http://127.0.0.1:PORT" with a port that was free a
// moment ago (another process may still take it before etcd does).
func FreeLocalURL() (string, error) {
	a, err := freeport.Addr()
	if err != nil {
		return "", errcode.New(errcode.InternalError, "find a free local port: %v", err)
	}
	return "http://" + a, nil
}
