// Package etcdbridge is everything moonraft says to etcd: the OpLog of the
// source notes (the notes' EtcdOpLogStore: guarded batch writes, latest,
// read since, watch, snapshot sequence ids, cleanup), the lease_renewals/
// keys, the master_view with term fencing, and an embedded etcd for
// `moonraft --dev`, `moonraft etcd` and tests.
//
// Key layout, with prefix "mooncake-store" and cluster "mooncake_cluster" by
// default:
//
//	{prefix}/oplog/{cluster}/{seq:020d}                       one entry (oplog.Entry.Encode, verbatim)
//	{prefix}/oplog/{cluster}/latest                           largest exported seq, decimal
//	{prefix}/oplog/{cluster}/snapshot/{id}/sequence_id        seq a Raft snapshot covers, decimal
//	{prefix}/lease_renewals/{cluster}/{RenewalKeyHash(key)}   oplog.Renewal JSON, on a 60 s etcd lease
//	{prefix}/{cluster}/moonraft_view                          MasterView JSON (moonraft's own)
//	{prefix}/{cluster}/master_view                            the leader's Mooncake address, bare host:port on an etcd lease (Mooncake's format)
//
// latest and snapshot/ share the entries' directory, so entries are always
// read, watched and deleted through the key range that starts at seq 1 and
// ends before ':' (the byte after '9'): every key in it starts with a digit,
// and one that is not a 20-digit sequence id is reported, never skipped.
//
// Every error is an *errcode.Error (through errors.As): bad data found in
// etcd is INVALID_PARAMS naming the key, a failed etcd call is
// ETCD_OPERATION_ERROR wrapping its cause, a lost guard is
// ETCD_TRANSACTION_FAIL (*FencedError, *StaleTermError).
package etcdbridge

import (
	"context"
	"crypto/tls"
	"strings"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/client/pkg/v3/logutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// Defaults of Config.
const (
	DefaultPrefix      = "mooncake-store"
	DefaultClusterID   = "mooncake_cluster"
	DefaultDialTimeout = 5 * time.Second
	// DefaultMaxTxnOps is etcd's own default --max-txn-ops.
	DefaultMaxTxnOps = 128
	// DefaultMaxTxnBytes leaves room under etcd's default
	// --max-request-bytes (1.5 MiB) for keys and framing.
	DefaultMaxTxnBytes = 1 << 20
	// RenewalLeaseTTL is the etcd lease every lease_renewals/ key is
	// attached to (seed 000): a renewal outlives its flush by a minute.
	RenewalLeaseTTL = 60 * time.Second
)

// Config says where etcd is and where in it the cluster's keys live.
type Config struct {
	Endpoints   []string
	Prefix      string        // default "mooncake-store"
	ClusterID   string        // default "mooncake_cluster"
	DialTimeout time.Duration // default 5s
	TLS         *tls.Config   // nil = plaintext
	// MaxTxnOps must not exceed etcd's --max-txn-ops (default 128): a batch
	// writes MaxTxnOps-1 entries plus latest. Values below 2 mean 128.
	MaxTxnOps int
	// MaxTxnBytes bounds the entry bytes FitBatch puts in one transaction,
	// below etcd's --max-request-bytes. Default 1 MiB.
	MaxTxnBytes int
	// Logger is the etcd client's logger; nil logs client errors only.
	Logger *zap.Logger
}

func (c Config) withDefaults() Config {
	c.Prefix = strings.TrimRight(c.Prefix, "/")
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.ClusterID == "" {
		c.ClusterID = DefaultClusterID
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MaxTxnOps < 2 {
		c.MaxTxnOps = DefaultMaxTxnOps
	}
	if c.MaxTxnBytes <= 0 {
		c.MaxTxnBytes = DefaultMaxTxnBytes
	}
	return c
}

// Store is the cluster's view of etcd. It is safe for concurrent use.
type Store struct {
	c     *clientv3.Client
	kv    pb.KVClient // c's, for the OpLog's transactions (putTxn)
	owned bool        // Close closes c only when Open made it
	cfg   Config

	oplogDir   string // {prefix}/oplog/{cluster}/
	entryFirst string // key of seq 1: the start of the entry range
	entryEnd   string // end (exclusive) of the entry range
	latestKey  string
	renewalDir string // {prefix}/lease_renewals/{cluster}/
	viewKey    string
	mcViewKey  string

	stats storeStats
}

// storeStats counts the etcd load this Store causes (benchmarks, metrics).
type storeStats struct {
	oplogTxns, oplogBytes     atomic.Uint64
	renewalTxns, renewalBytes atomic.Uint64
}

// Stats is the etcd load a Store has caused: write transactions (lease
// grants included) and bytes of keys and values put, by kind.
type Stats struct {
	OplogTxns, OplogBytes     uint64
	RenewalTxns, RenewalBytes uint64
}

// Stats returns the counters since Open.
func (s *Store) Stats() Stats {
	return Stats{
		OplogTxns: s.stats.oplogTxns.Load(), OplogBytes: s.stats.oplogBytes.Load(),
		RenewalTxns: s.stats.renewalTxns.Load(), RenewalBytes: s.stats.renewalBytes.Load(),
	}
}

var _ oplog.Feed = (*Store)(nil)

// Open dials etcd and checks that it answers within DialTimeout, so a wrong
// endpoint fails here, clearly, rather than at the first write.
func Open(cfg Config) (*Store, error) {
	s, err := Dial(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Check(); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// Dial creates the etcd client without waiting for etcd to answer; calls
// fail, and may be retried, until it does.
func Dial(cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Endpoints) == 0 {
		return nil, errcode.New(errcode.InvalidParams, "etcd: no endpoints given")
	}
	if strings.Contains(cfg.ClusterID, "/") {
		return nil, errcode.New(errcode.InvalidParams, "etcd: cluster id %q must not contain '/'", cfg.ClusterID)
	}
	lg := cfg.Logger
	if lg == nil {
		var err error
		if lg, err = logutil.CreateDefaultZapLogger(zapcore.ErrorLevel); err != nil {
			lg = zap.NewNop()
		}
	}
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		// Keepalives notice an etcd host that died without closing its
		// connections, so calls fail over instead of waiting on TCP.
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		TLS:                  cfg.TLS,
		Logger:               lg,
	})
	if err != nil {
		return nil, opErr(err, "etcd: connect to %v", cfg.Endpoints)
	}
	s := New(c, cfg)
	s.owned = true
	return s, nil
}

// Check proves, with one linearizable read within DialTimeout, that an
// endpoint answers and the etcd cluster has a leader (clientv3.New does not
// wait for a connection).
func (s *Store) Check() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
	defer cancel()
	if _, err := s.c.Get(ctx, s.latestKey, clientv3.WithCountOnly()); err != nil {
		return opErr(err, "etcd: %v did not answer within %v", s.cfg.Endpoints, s.cfg.DialTimeout)
	}
	return nil
}

// New returns a Store over an existing client; Close leaves the client open.
func New(c *clientv3.Client, cfg Config) *Store {
	cfg = cfg.withDefaults()
	dir := cfg.Prefix + "/oplog/" + cfg.ClusterID + "/"
	return &Store{
		c:          c,
		kv:         clientv3.RetryKVClient(c),
		cfg:        cfg,
		oplogDir:   dir,
		entryFirst: dir + seqKeyPart(1),
		entryEnd:   dir + ":", // ':' follows '9': the range holds every key that starts with a digit
		latestKey:  dir + "latest",
		renewalDir: cfg.Prefix + "/lease_renewals/" + cfg.ClusterID + "/",
		viewKey:    cfg.Prefix + "/" + cfg.ClusterID + "/moonraft_view",
		mcViewKey:  cfg.Prefix + "/" + cfg.ClusterID + "/master_view",
	}
}

// Close closes the client if Open created it.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	return s.c.Close()
}

// Client returns the underlying etcd client.
func (s *Store) Client() *clientv3.Client { return s.c }

// Config returns the configuration with defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// MaxBatch is the most entries one WriteOpLogBatch takes: MaxTxnOps-1, the
// last operation being the update of latest.
func (s *Store) MaxBatch() int { return s.cfg.MaxTxnOps - 1 }

// EntryKey returns the etcd key of the entry with sequence id seq.
func (s *Store) EntryKey(seq uint64) string { return s.oplogDir + seqKeyPart(seq) }

// appendEntryKey appends EntryKey(seq) to b.
func (s *Store) appendEntryKey(b []byte, seq uint64) []byte {
	return appendSeqKeyPart(append(b, s.oplogDir...), seq)
}

// LatestKey returns the etcd key of latest.
func (s *Store) LatestKey() string { return s.latestKey }

// SnapshotKey returns the etcd key recording a snapshot's sequence id.
func (s *Store) SnapshotKey(snapshotID string) string {
	return s.oplogDir + "snapshot/" + snapshotID + "/sequence_id"
}

// RenewalKey returns the lease_renewals/ key of an object key.
func (s *Store) RenewalKey(objectKey string) string {
	return s.renewalDir + oplog.RenewalKeyHash(objectKey)
}

// MasterViewKey returns the etcd key of the master_view.
func (s *Store) MasterViewKey() string { return s.viewKey }
