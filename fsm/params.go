package fsm

import "github.com/moonraft/moonraft/errcode"

// Params are the tunables the state machine applies commands with. They
// live in the replicated state and change only through Promote, so all
// nodes use the leader's values. Ratios are integers in parts per million
// so no float arithmetic can differ between machines.
type Params struct {
	LeaseTTLMs           int64  // read lease granted by GetReplicaList / ExistKey
	SoftPinTTLMs         int64  // soft pin granted at PutEnd and extended by reads
	ClientTTLMs          int64  // a client session expires this long after its last ping
	HighWatermarkPPM     uint64 // evict when used/capacity exceeds this
	EvictionRatioPPM     uint64 // evict at least this share of capacity
	PutStartDiscardMs    int64  // a new PutStart may preempt a PROCESSING object this old
	PutStartReleaseMs    int64  // a PROCESSING object this old is reclaimed by Tick
	AllowEvictSoftPinned bool   // second eviction pass may take soft-pinned objects
	ExportRingCap        uint64 // export ring bound; 0 disables export (no etcd)
	KeySeqRetainMs       int64  // key_sequence_id of a removed key is kept this long
}

// DefaultParams are the defaults a cluster runs with until a leader's
// Promote carries its own (docs/OPERATIONS.md lists them as flags).
func DefaultParams() Params {
	return Params{
		LeaseTTLMs:           5_000,
		SoftPinTTLMs:         30 * 60_000,
		ClientTTLMs:          10_000,
		HighWatermarkPPM:     950_000,
		EvictionRatioPPM:     50_000,
		PutStartDiscardMs:    30_000,
		PutStartReleaseMs:    600_000,
		AllowEvictSoftPinned: true,
		ExportRingCap:        1_000_000,
		KeySeqRetainMs:       3_600_000,
	}
}

// Validate reports the first out-of-range parameter.
func (p Params) Validate() error {
	switch {
	case p.LeaseTTLMs <= 0:
		return errcode.New(errcode.InvalidParams, "lease TTL must be positive, got %d ms", p.LeaseTTLMs)
	case p.SoftPinTTLMs <= 0:
		return errcode.New(errcode.InvalidParams, "soft pin TTL must be positive, got %d ms", p.SoftPinTTLMs)
	case p.ClientTTLMs <= 0:
		return errcode.New(errcode.InvalidParams, "client TTL must be positive, got %d ms", p.ClientTTLMs)
	case p.HighWatermarkPPM == 0 || p.HighWatermarkPPM > ppm:
		return errcode.New(errcode.InvalidParams, "high watermark must be in (0, 1], got %g", float64(p.HighWatermarkPPM)/ppm)
	case p.EvictionRatioPPM == 0 || p.EvictionRatioPPM > ppm:
		return errcode.New(errcode.InvalidParams, "eviction ratio must be in (0, 1], got %g", float64(p.EvictionRatioPPM)/ppm)
	case p.PutStartDiscardMs <= 0 || p.PutStartReleaseMs < p.PutStartDiscardMs:
		return errcode.New(errcode.InvalidParams,
			"put-start timeouts must satisfy 0 < discard (%d ms) <= release (%d ms)", p.PutStartDiscardMs, p.PutStartReleaseMs)
	case p.KeySeqRetainMs < 0:
		return errcode.New(errcode.InvalidParams, "key sequence retention must not be negative, got %d ms", p.KeySeqRetainMs)
	}
	return nil
}

const ppm = 1_000_000

func (p *Params) encode(e *enc) {
	e.i64(p.LeaseTTLMs)
	e.i64(p.SoftPinTTLMs)
	e.i64(p.ClientTTLMs)
	e.u64(p.HighWatermarkPPM)
	e.u64(p.EvictionRatioPPM)
	e.i64(p.PutStartDiscardMs)
	e.i64(p.PutStartReleaseMs)
	e.bool(p.AllowEvictSoftPinned)
	e.u64(p.ExportRingCap)
	e.i64(p.KeySeqRetainMs)
}

func (p *Params) decode(d *dec) {
	p.LeaseTTLMs = d.i64()
	p.SoftPinTTLMs = d.i64()
	p.ClientTTLMs = d.i64()
	p.HighWatermarkPPM = d.u64()
	p.EvictionRatioPPM = d.u64()
	p.PutStartDiscardMs = d.i64()
	p.PutStartReleaseMs = d.i64()
	p.AllowEvictSoftPinned = d.bool()
	p.ExportRingCap = d.u64()
	p.KeySeqRetainMs = d.i64()
}
