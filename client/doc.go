// Package client is the Go client of moonraft's gRPC API
// (moonraft.v1.Master): connections to the cluster's nodes, leader
// discovery and following, the retry rules, and the typed calls. Keeper
// keeps a client session alive.
//
// # Errors
//
// Every unary RPC answers with gRPC status OK and a moonraftpb.Status
// carrying the Mooncake code; the client turns a non-OK one into an
// *errcode.Error, so callers use errcode.Of. Only NOT_LEADER,
// UNAVAILABLE_IN_CURRENT_STATUS and TOO_MANY_REQUESTS are retryable
// (errcode.Code.Retryable). SnapshotSave, and calls refused by the server's interceptor
// (PERMISSION_DENIED, TOO_MANY_REQUESTS), fail with a gRPC error whose
// details carry the Status.
//
// # Retries
//
// The client tries the last known leader first. A NOT_LEADER answer moves
// it to the leader it names (learning the address if new) and is retried
// there at once, the first time a call is sent to that leader (after a
// backoff the next time) — unless the connection to it has failed: for half
// a heartbeat timeout after a leader dies its followers still name it, so
// the client moves on instead. UNAVAILABLE_IN_CURRENT_STATUS and connection
// failures (a failed TLS handshake among them) move it to the next endpoint
// whose connection has not failed after a backoff (20 ms doubling to
// Config.MaxBackoff, jittered), until the caller's context is done, when the
// last error is returned. TOO_MANY_REQUESTS is retried at the same endpoint
// after the same backoff.
//
// A Keeper's ping is the exception: it tries each endpoint once, at once,
// following a NOT_LEADER redirect, and a round without an answer waits for
// the next one (a second later), as Mooncake's clients do; only
// TOO_MANY_REQUESTS (the client's own calls in flight) is retried within
// the round. Backing off
// within the round, thousands of clients that pinged during an election
// came back to the new leader in the same few hundred milliseconds.
//
// A call that has waited Config.LeaderCheckAfter (400 ms) at one endpoint
// has the client ask every endpoint for its status, and again every
// quarter of that while it waits; one round of asking serves every call
// that waits meanwhile or within a quarter of that after it (a round that
// finds no leader, during an election, ends once the others have answered).
// Once the endpoint does not answer and another serves as the leader, the client follows
// that one and the call is ended as if its connection had failed after it
// was sent (below): a leader that died answers nothing, and its connection
// fails only once its kernel has freed its memory (a second or more for a
// large master), or never if its host crashed. An endpoint that answers
// its status answers the call too, in time.
//
// What may be retried depends on whether the request can have been applied:
//
//   - A request answered NOT_LEADER or UNAVAILABLE_IN_CURRENT_STATUS was not
//     applied, nor one that never got onto a connection (gRPC reports no
//     peer for it: the dial failed, or the endpoint was not connected
//     within Config.ConnectTimeout). Every RPC is retried on these.
//   - A request whose connection failed after it was sent, whose deadline
//     passed in flight, or that was ended because another node leads, may
//     have been applied. Idempotent RPCs are retried:
//     reads, Ping, MountSegment, ReMountSegment, PutEnd (ending a complete
//     object again is OK), Members, AddVoter, RemoveServer, and
//     SnapshotSave until its first byte is written. The others — PutStart,
//     PutRevoke, Remove, RemoveByRegex, RemoveAll, UnmountSegment, the
//     batch writes but BatchPutEnd, TransferLeadership and SnapshotRestore —
//     are not resent: the call fails with OUTCOME_UNKNOWN, and the caller
//     checks (GetReplicaList, ExistKey) before trying again.
//   - A server's own OUTCOME_UNKNOWN (its leadership was lost mid-write) is
//     returned as is, never retried.
//
// Requests are encoded and size-checked before sending, so an oversized or
// unencodable request fails with INVALID_PARAMS rather than looking like one
// that may have been sent; a request the server refuses for its size (its
// limit being lower) is INVALID_PARAMS too, since gRPC refuses it before
// decoding it.
//
// # Security
//
// Config.TLS secures every connection (transport.TLSFiles builds one);
// Config.AdminToken is sent with the admin RPCs only.
package client
