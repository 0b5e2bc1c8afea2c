package etcdbridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/moonraft/moonraft/errcode"
)

// FencedError says a guarded OpLog write lost: latest in etcd is not the
// prev the writer continued from, so someone else (a newer leader, or this
// one before an ambiguous failure) advanced it. Entries are deterministic, so
// a writer whose batch ends at or below Latest may count it as written.
type FencedError struct {
	Latest uint64 // latest found in etcd
	Prev   uint64 // the prev the write was guarded on
}

func (e *FencedError) Error() string { return e.code().Error() }

// Unwrap gives errcode.Of its code: ETCD_TRANSACTION_FAIL.
func (e *FencedError) Unwrap() error { return e.code() }

func (e *FencedError) code() *errcode.Error {
	return errcode.New(errcode.EtcdTransactionFail,
		"oplog: someone else advanced latest to %d (this write continued from %d)", e.Latest, e.Prev)
}

// StaleTermError says PublishMasterView lost to a view of an equal or
// higher term already in etcd.
type StaleTermError struct {
	Term   uint64     // the term that was refused
	Stored MasterView // what etcd holds
}

func (e *StaleTermError) Error() string { return e.code().Error() }

// Unwrap gives errcode.Of its code: ETCD_TRANSACTION_FAIL.
func (e *StaleTermError) Unwrap() error { return e.code() }

func (e *StaleTermError) code() *errcode.Error {
	return errcode.New(errcode.EtcdTransactionFail,
		"master_view: term %d already published by %s (grpc %s); refusing term %d",
		e.Stored.Term, e.Stored.LeaderID, e.Stored.GRPCAddr, e.Term)
}

// opError is ETCD_OPERATION_ERROR that keeps its cause, so callers can
// still test errors.Is(err, context.DeadlineExceeded).
type opError struct {
	code  *errcode.Error
	cause error
}

func (e *opError) Error() string   { return e.code.Error() }
func (e *opError) Unwrap() []error { return []error{e.code, e.cause} }

// opErr wraps a failed etcd call, with a hint where etcd's answer has a
// known remedy.
func opErr(cause error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...) + ": " + cause.Error()
	switch {
	case errors.Is(cause, rpctypes.ErrTooManyOps):
		msg += " (MaxTxnOps is above etcd's --max-txn-ops)"
	case errors.Is(cause, rpctypes.ErrRequestTooLarge):
		msg += " (write fewer entries per batch: see FitBatch, or raise etcd's --max-request-bytes)"
	case errors.Is(cause, context.DeadlineExceeded):
		msg += " (etcd unreachable or too slow)"
	case errors.Is(cause, rpctypes.ErrNoSpace):
		// etcd keeps refusing writes until the alarm is disarmed, even
		// once compaction has freed the space.
		msg += " (etcd's database reached its space quota and its NOSPACE alarm refuses writes: compact and defragment etcd, then `etcdctl alarm disarm`; docs/OPERATIONS.md, \"etcd compaction\")"
	}
	return &opError{code: errcode.New(errcode.EtcdOperationError, "%s", msg), cause: cause}
}

// badData reports a value or key in etcd that moonraft cannot read.
func badData(key string, format string, args ...any) error {
	return errcode.New(errcode.InvalidParams, "etcd key %q: %s", key, fmt.Sprintf(format, args...))
}

// seqKeyLen is the length of seqKeyPart: uint64's 20 digits.
const seqKeyLen = 20

// seqKeyPart is the zero-padded form of a sequence id, so that key order is
// numeric order.
func seqKeyPart(seq uint64) string {
	return string(appendSeqKeyPart(make([]byte, 0, seqKeyLen), seq))
}

func appendSeqKeyPart(b []byte, seq uint64) []byte {
	var d [seqKeyLen]byte
	digits := strconv.AppendUint(d[:0], seq, 10)
	for range seqKeyLen - len(digits) {
		b = append(b, '0')
	}
	return append(b, digits...)
}

// parseEntryKey returns the sequence id of an entry key.
func (s *Store) parseEntryKey(key []byte) (uint64, error) {
	k := string(key)
	if len(k) != len(s.oplogDir)+seqKeyLen || k[:len(s.oplogDir)] != s.oplogDir {
		return 0, badData(k, "in the OpLog entry range but not {dir}/{20-digit sequence id}")
	}
	part := k[len(s.oplogDir):]
	for i := 0; i < len(part); i++ {
		if part[i] < '0' || part[i] > '9' {
			return 0, badData(k, "in the OpLog entry range but not a 20-digit sequence id")
		}
	}
	seq, err := strconv.ParseUint(part, 10, 64)
	if err != nil || seq == 0 {
		return 0, badData(k, "sequence id %s is out of range (1..%d)", part, uint64(1<<64-1))
	}
	return seq, nil
}

// parseDecimal reads a decimal sequence id stored as a value.
func parseDecimal(key string, v []byte) (uint64, error) {
	if len(v) == 0 {
		return 0, badData(key, "empty value, want a decimal sequence id")
	}
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, badData(key, "value %q is not a decimal sequence id", truncate(v))
		}
	}
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		return 0, badData(key, "value %q is out of range for a sequence id", truncate(v))
	}
	return n, nil
}

func truncate(v []byte) string {
	if len(v) > 64 {
		return string(v[:64]) + "..."
	}
	return string(v)
}
