# moonraft.example.hcl — an annotated configuration for one node of a
# three-node cluster (this is node n0 on 10.0.0.1). Start it with
#
#     moonraft --config /etc/moonraft/moonraft.hcl
#
# Rules (docs/OPERATIONS.md, "Configuration file"):
#   * every key is a flag name of `moonraft --help`, written as in the flag
#     (`raft-addr`) or with underscores (`raft_addr`);
#   * a flag given on the command line wins over the file;
#   * an unknown key, a block, or a key given twice stops the node with an
#     error naming the key and its line;
#   * lists are joined with commas, so `peers = ["a", "b"]` is `--peers a,b`;
#   * durations are Go durations in quotes ("500ms", "30s", "10m").

# ---- identity and addresses ------------------------------------------------
id         = "n0"                     # unique in the cluster, never reused
data-dir   = "/var/lib/moonraft"      # Raft log (raft.db) and snapshots/
raft-addr  = "10.0.0.1:7200"          # Raft traffic; also what peers dial: no 0.0.0.0
grpc-addr  = "10.0.0.1:7100"          # clients (inference engines, moonctl)
http-addr  = "10.0.0.1:7300"          # /metrics /healthz /readyz /status
cluster-id = "mooncake_cluster"       # must match on every node and in etcd

# ---- forming the cluster ---------------------------------------------------
# The same list on all three nodes; it is only used when data-dir is empty.
# A node added later uses `join` (the gRPC address of any member) instead.
bootstrap = true
peers = [
  "n0=10.0.0.1:7200",
  "n1=10.0.0.2:7200",
  "n2=10.0.0.3:7200",
]
# join = "10.0.0.1:7100"

# ---- TLS on every link -----------------------------------------------------
# One certificate per node with both server and client usage and the node's
# IP (or DNS name) as a SAN; `make certs` makes a test set. With tls-ca,
# gRPC and Raft require client certificates signed by that CA (mutual TLS).
tls-cert = "/etc/moonraft/tls/n0.pem"
tls-key  = "/etc/moonraft/tls/n0-key.pem"
tls-ca   = "/etc/moonraft/tls/ca.pem"
# tls-server-name = "moonraft"        # verify this name instead of the IP dialled
http-tls = false                      # true: /metrics etc. over HTTPS with tls-cert

# ---- admin auth ------------------------------------------------------------
# Members, AddVoter, RemoveServer, TransferLeadership, SnapshotSave,
# SnapshotRestore and RemoveAll need "authorization: Bearer <token>".
# The same token on every node (a joining node sends it too). Mode 0600.
admin-token-file = "/etc/moonraft/admin-token"

# ---- etcd (the OpLog export) ----------------------------------------------
etcd-endpoints = ["https://10.0.0.11:2379", "https://10.0.0.12:2379", "https://10.0.0.13:2379"]
etcd-prefix    = "mooncake-store"
# With https:// endpoints and no etcd-* files, the tls-* files above are used
# for etcd as well. Give these to use another identity towards etcd:
# etcd-cert = "/etc/moonraft/tls/etcd-client.pem"
# etcd-key  = "/etc/moonraft/tls/etcd-client-key.pem"
# etcd-ca   = "/etc/moonraft/tls/etcd-ca.pem"
etcd-max-txn-ops     = 128            # etcd's own --max-txn-ops
etcd-export-renewals = true           # lease_renewals/ once a second
etcd-export-linger   = "200ms"        # under load, an OpLog entry waits this long at most for a fuller transaction
oplog-retain         = 10000          # OpLog entries kept behind the last snapshot
export-ring          = 1000000        # entries held while etcd is down before writes fail

# ---- limits (past one: a clear error, never an out-of-memory) --------------
max-message-bytes        = 16777216   # one gRPC message, each way
max-batch                = 10000      # keys or items in one batch RPC
max-regex-len            = 4096       # regex of *ByRegex RPCs (4096 at most)
max-in-flight-per-client = 256        # per client id (else per connection); -1: no cap
max-pending-writes       = 512        # client writes waiting for the log on this node; -1: no bound
gc-percent               = 200        # Go's GOGC (default 200, or $GOGC when set): memory for CPU
heap-headroom            = 0.5        # a large heap grows this fraction past its live part at most; 0: GOGC alone

# ---- cache semantics (the leader's values apply cluster-wide) --------------
lease-ttl      = "5s"
soft-pin-ttl   = "30m"
client-ttl     = "10s"
tick           = "100ms"
high-watermark = 0.95
eviction-ratio = 0.05
graceful-unmount-max = "30s"          # longest wait of GracefulUnmountSegment

# ---- Raft ------------------------------------------------------------------
heartbeat-timeout  = "300ms"          # raise both on a WAN or a busy host
election-timeout   = "300ms"          # (docs/OPERATIONS.md, "Timeouts")
# Reads: "lease" answers from the leader's memory under a read lease a quorum
# confirmed (at most 90% of heartbeat-timeout; 0 takes that); "quorum" waits
# for a quorum round per read. Every node must run the same heartbeat-timeout.
# See docs/OPERATIONS.md, "Read modes".
read-mode          = "lease"
read-lease         = "0s"
snapshot-interval  = "10s"
snapshot-threshold = 16384            # log entries, or 256 bytes of log each
snapshot-log-ratio = 0.5              # and this many times the last snapshot's size in log bytes
raft-wal-segment-mb = 64              # raft-wal segment files, preallocated (docs/OPERATIONS.md)

log-level = "info"
