// Package errcode holds the Mooncake master's error codes and an error type
// that carries one. Every package of moonraft that rejects input returns an
// *errcode.Error, so the gRPC layer can answer with the code's name and a
// person gets a message saying what was wrong.
package errcode

import (
	"errors"
	"fmt"
)

// Code is a Mooncake ErrorCode. The numeric values are Mooncake's own
// (mooncake-store/include/types.h) so that logs and clients agree; the
// codes below -2000 are moonraft's additions.
type Code int32

// Mooncake's codes used by moonraft.
const (
	OK                         Code = 0
	InternalError              Code = -1
	SegmentNotFound            Code = -101
	SegmentAlreadyExists       Code = -102
	ClientNotFound             Code = -103
	NoAvailableHandle          Code = -200
	InvalidVersion             Code = -300
	InvalidKey                 Code = -400
	InvalidParams              Code = -600
	IllegalClient              Code = -601
	InvalidWrite               Code = -700
	InvalidRead                Code = -701
	InvalidReplica             Code = -702
	ReplicaIsNotReady          Code = -703
	ObjectNotFound             Code = -704
	ObjectAlreadyExists        Code = -705
	ObjectHasLease             Code = -706
	ObjectReplicaBusy          Code = -714
	ChecksumMismatch           Code = -801
	EtcdOperationError         Code = -1000
	EtcdKeyNotExist            Code = -1001
	EtcdTransactionFail        Code = -1002
	OplogEntryNotFound         Code = -1004
	IncompleteOplogCatchUp     Code = -1007
	UnavailableInCurrentStatus Code = -1010
	UnavailableInCurrentMode   Code = -1011
	FileNotFound               Code = -1100
	FileOpenFail               Code = -1101
	FileReadFail               Code = -1102
	FileWriteFail              Code = -1103
	FileLockFail               Code = -1105

	// NotLeader is moonraft's: the node is a follower; the answer names the
	// leader's address.
	NotLeader Code = -2001
	// OutcomeUnknown is moonraft's: a write reached a leader that was lost
	// before answering, so it may or may not have been applied.
	OutcomeUnknown Code = -2002
	// PermissionDenied is moonraft's: an admin RPC came without the admin
	// token, or with a wrong one, on a node configured with one.
	PermissionDenied Code = -2003
	// TooManyRequests is moonraft's: the client already has as many
	// requests in flight on this node as it may; the request was not
	// applied and may be sent again once earlier ones have finished.
	TooManyRequests Code = -2004
)

var names = map[Code]string{
	OK:                         "OK",
	InternalError:              "INTERNAL_ERROR",
	SegmentNotFound:            "SEGMENT_NOT_FOUND",
	SegmentAlreadyExists:       "SEGMENT_ALREADY_EXISTS",
	ClientNotFound:             "CLIENT_NOT_FOUND",
	NoAvailableHandle:          "NO_AVAILABLE_HANDLE",
	InvalidVersion:             "INVALID_VERSION",
	InvalidKey:                 "INVALID_KEY",
	InvalidParams:              "INVALID_PARAMS",
	IllegalClient:              "ILLEGAL_CLIENT",
	InvalidWrite:               "INVALID_WRITE",
	InvalidRead:                "INVALID_READ",
	InvalidReplica:             "INVALID_REPLICA",
	ReplicaIsNotReady:          "REPLICA_IS_NOT_READY",
	ObjectNotFound:             "OBJECT_NOT_FOUND",
	ObjectAlreadyExists:        "OBJECT_ALREADY_EXISTS",
	ObjectHasLease:             "OBJECT_HAS_LEASE",
	ObjectReplicaBusy:          "OBJECT_REPLICA_BUSY",
	ChecksumMismatch:           "CHECKSUM_MISMATCH",
	EtcdOperationError:         "ETCD_OPERATION_ERROR",
	EtcdKeyNotExist:            "ETCD_KEY_NOT_EXIST",
	EtcdTransactionFail:        "ETCD_TRANSACTION_FAIL",
	OplogEntryNotFound:         "OPLOG_ENTRY_NOT_FOUND",
	IncompleteOplogCatchUp:     "INCOMPLETE_OPLOG_CATCH_UP",
	UnavailableInCurrentStatus: "UNAVAILABLE_IN_CURRENT_STATUS",
	UnavailableInCurrentMode:   "UNAVAILABLE_IN_CURRENT_MODE",
	FileNotFound:               "FILE_NOT_FOUND",
	FileOpenFail:               "FILE_OPEN_FAIL",
	FileReadFail:               "FILE_READ_FAIL",
	FileWriteFail:              "FILE_WRITE_FAIL",
	FileLockFail:               "FILE_LOCK_FAIL",
	NotLeader:                  "NOT_LEADER",
	OutcomeUnknown:             "OUTCOME_UNKNOWN",
	PermissionDenied:           "PERMISSION_DENIED",
	TooManyRequests:            "TOO_MANY_REQUESTS",
}

var byName = func() map[string]Code {
	m := make(map[string]Code, len(names))
	for c, n := range names {
		m[n] = c
	}
	return m
}()

// String returns the Mooncake name of the code, or CODE(n) for one moonraft
// does not know.
func (c Code) String() string {
	if n, ok := names[c]; ok {
		return n
	}
	return fmt.Sprintf("CODE(%d)", int32(c))
}

// Parse returns the code with the given Mooncake name.
func Parse(name string) (Code, bool) {
	c, ok := byName[name]
	return c, ok
}

// Error is an error with a Mooncake code and a message for a person.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Msg
}

// New returns an *Error with a formatted message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Of returns the code carried by err: OK for nil, InternalError for an error
// that carries none.
func Of(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return InternalError
}

// Retryable reports whether a request answered with c was certainly not
// applied and may succeed if sent again later or elsewhere: NOT_LEADER
// (retry at the leader), UNAVAILABLE_IN_CURRENT_STATUS (no promoted
// leader yet, shutting down, queue full) and TOO_MANY_REQUESTS (the
// client's in-flight cap on that node; retry there after a backoff).
// ETCD_OPERATION_ERROR is not: it means the leader fails writes closed
// until etcd is back, which takes far longer than a client's retry budget,
// so the caller decides. OUTCOME_UNKNOWN is not: the write may have been
// applied.
func (c Code) Retryable() bool {
	return c == NotLeader || c == UnavailableInCurrentStatus || c == TooManyRequests
}
