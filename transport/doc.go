// Package transport is moonraft's gRPC front door: the server
// (moonraft.v1.Master) in front of the service contract, its limits and
// admin-token guard, and the TLS settings of every link. It holds no
// business rules: requests become fsm commands or service.Data reads,
// results become responses. The Go client is package client.
//
// # Errors
//
// Every unary RPC answers with gRPC status OK and a moonraftpb.Status
// carrying the Mooncake code (retryable as errcode.Code.Retryable says).
// SnapshotSave, and calls refused by the server's interceptor
// (PERMISSION_DENIED, TOO_MANY_REQUESTS), fail with a gRPC error whose
// details carry the Status.
//
// # Security and limits
//
// TLSFiles builds the TLS configuration of a server (mutual TLS when it
// has a CA), of a client (client.Config.TLS) and of the Raft transport
// (raftnet.NewTLSStreamLayer). ServerConfig.AdminToken makes the admin RPCs
// (moonraftpb.AdminMethod) require "authorization: Bearer <token>", sent by clients
// given client.Config.AdminToken; others get PERMISSION_DENIED. Limits caps
// message size, batch length, regex length and each client's requests in
// flight. docs/OPERATIONS.md describes them for operators.
package transport
