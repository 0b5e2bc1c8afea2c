package oplog

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash"

	"github.com/moonraft/moonraft/errcode"
)

// Record is one OpLog entry as stored in etcd: its sequence id (from the
// key) and the raw JSON value, decoded and verified by the reader.
type Record struct {
	Seq   uint64
	Value []byte
}

// Renewal is one lease_renewals/ value (seed 000): a key's read lease and
// soft pin deadlines as of TimestampMs.
type Renewal struct {
	Key              string `json:"key"`
	LeaseTimeoutMs   int64  `json:"lease_timeout_ms"`
	SoftPinTimeoutMs int64  `json:"soft_pin_timeout_ms"`
	TimestampMs      int64  `json:"timestamp_ms"`
}

// EncodeRenewal returns the JSON value of r.
func EncodeRenewal(r Renewal) []byte {
	b, _ := json.Marshal(r) // a struct of strings and integers always marshals
	return b
}

// DecodeRenewal parses a lease_renewals/ value.
func DecodeRenewal(b []byte) (Renewal, error) {
	var r Renewal
	if err := json.Unmarshal(b, &r); err != nil {
		return Renewal{}, errcode.New(errcode.InvalidParams, "lease renewal: %v", err)
	}
	if r.Key == "" {
		return Renewal{}, errcode.New(errcode.InvalidParams, "lease renewal: key is empty")
	}
	return r, nil
}

// RenewalKeyHash names a key's lease_renewals/ entry: FNV-1a 64 in hex,
// so arbitrary keys make safe, fixed-length etcd key suffixes.
func RenewalKeyHash(key string) string {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return fmt.Sprintf("%016x", h)
}

// WatchEvent is what a Feed's watch delivers: OpLog records and lease
// renewals put after the watch's start revision, or the error that ended it.
type WatchEvent struct {
	Records  []Record
	Renewals []Renewal
	Err      error
}

// Feed is the OpLog as a follower reads it (etcdbridge implements it on
// etcd). Reads return the etcd revision they saw, so a watch started after
// that revision misses nothing in between.
type Feed interface {
	// ReadSince returns up to limit records with seq > after, in seq order.
	ReadSince(ctx context.Context, after uint64, limit int) (recs []Record, rev int64, err error)
	// ReadRenewals returns every current lease renewal.
	ReadRenewals(ctx context.Context) (rs []Renewal, rev int64, err error)
	// Watch streams records and renewals put after revision afterRev. The
	// channel closes when ctx ends, after an event with Err if the watch
	// failed (for example because afterRev was compacted).
	Watch(ctx context.Context, afterRev int64) <-chan WatchEvent
}

// ObjectSetHasher computes the object-set digest: SHA-256 over the
// (key, size, key_sequence_id) of every complete object, fed in key order.
// The leader's state machine and an etcd follower compute it alike, which
// is how a follower proves it holds the leader's object set at a seq.
type ObjectSetHasher struct {
	h   hash.Hash
	buf []byte
}

// NewObjectSetHasher returns an empty hasher.
func NewObjectSetHasher() *ObjectSetHasher { return &ObjectSetHasher{h: sha256.New()} }

// Add feeds one object; keys must come in ascending order.
func (o *ObjectSetHasher) Add(key string, size, keySeq uint64) {
	b := binary.AppendUvarint(o.buf[:0], uint64(len(key)))
	b = append(b, key...)
	b = binary.AppendUvarint(b, size)
	b = binary.AppendUvarint(b, keySeq)
	o.h.Write(b)
	o.buf = b
}

// Sum returns the digest of the objects added so far.
func (o *ObjectSetHasher) Sum() [32]byte {
	var d [32]byte
	o.h.Sum(d[:0])
	return d
}
