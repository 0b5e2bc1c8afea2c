// Package service is the contract both front doors call: the gRPC server
// (transport) and the Mooncake protocol (mooncakeapi) turn requests into
// calls of Data and Admin, and node.Node implements both. Its signatures
// hold plain Go types (fsm commands and results, NodeStatus, Member), so a
// front depends on this package and not on another front's wire code.
//
// Data is what clients call: mounts, puts and upserts (as fsm commands
// through Propose), reads, removes, pings, and the serving node's status.
// Admin is what operators call: members, snapshots, leadership transfer. A
// server with no Raft group behind it (the etcd follower, moonbench's
// baseline) implements Data alone.
//
// The context helpers (NoWait, MustNotWait) let a front ask a read not to
// wait: the Mooncake event loop runs quick reads itself.
package service
