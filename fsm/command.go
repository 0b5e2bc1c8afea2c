package fsm

import (
	"slices"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/lease"
)

// CmdType is the first byte of every Raft log entry moonraft writes.
type CmdType uint8

// Command types. Values are part of the log format: never renumber.
const (
	CmdMountSegment    CmdType = 1
	CmdUnmountSegment  CmdType = 2
	CmdRemountSegments CmdType = 3
	CmdPutStart        CmdType = 4
	CmdPutEnd          CmdType = 5
	CmdPutRevoke       CmdType = 6
	CmdRemove          CmdType = 7
	CmdRemoveByRegex   CmdType = 8
	CmdRemoveAll       CmdType = 9
	CmdTick            CmdType = 10
	CmdPromote         CmdType = 11
	CmdExported        CmdType = 12
	CmdBatch           CmdType = 13
	CmdUpsertStart     CmdType = 14
	CmdGracefulUnmount CmdType = 15
	CmdDrainSegments   CmdType = 16
	// MountSegment and RemountSegments whose segments carry a transfer
	// engine endpoint (the Mooncake protocol's segments): their own types,
	// so a node of an earlier release halts on them rather than reading
	// the fields it does not know as others.
	CmdMountSegmentTransport    CmdType = 17
	CmdRemountSegmentsTransport CmdType = 18
	// Promote of a leader that also serves the Mooncake protocol.
	CmdPromoteMooncake CmdType = 19
	CmdMember          CmdType = 20
	// ReleaseRemovals: an older node halts on it rather than differ from
	// the others in what bulk removals export.
	CmdReleaseRemovals CmdType = 21
	// UpsertStart that writes a leased object into fresh buffers
	// (UpsertStart.Copy): an older node, which would refuse it
	// OBJECT_REPLICA_BUSY, halts on it instead.
	CmdUpsertStartCopy CmdType = 22

	// IgnoreUnknownFlag marks a command an older node may skip if it does
	// not know the type (Consul's pattern, for rolling upgrades): a newer
	// leader sets it on commands that only add optional state.
	IgnoreUnknownFlag CmdType = 0x80
)

// Command is one entry of the replicated log.
type Command interface {
	Type() CmdType
	encode(e *enc)
	decode(d *dec)
}

// SegmentSpec describes a memory segment a client mounts: the address range
// [Base, Base+Size) in the client's address space.
type SegmentSpec struct {
	ID   string
	Name string
	Base uint64
	Size uint64
	// Where a Mooncake client's transfer engine serves the segment ("ip:port")
	// and over what ("tcp", "rdma"): the descriptors of the Mooncake protocol
	// carry them. Empty for gRPC clients.
	Endpoint string
	Protocol string
}

func (s *SegmentSpec) hasTransport() bool { return s.Endpoint != "" || s.Protocol != "" }

// MountSegment adds a segment and attaches it to the client's session,
// creating the session if needed. Mounting the same segment again is a no-op.
type MountSegment struct {
	NowMs    int64
	ClientID string
	Segment  SegmentSpec
}

// UnmountSegment drops a segment, the replicas on it, and objects left with none.
type UnmountSegment struct {
	NowMs     int64
	ClientID  string
	SegmentID string
}

// RemountSegments re-registers a client's segments after NEED_REMOUNT.
type RemountSegments struct {
	NowMs    int64
	ClientID string
	Segments []SegmentSpec
}

// PutStart allocates buffers for a new object; its replicas are PROCESSING.
type PutStart struct {
	NowMs            int64
	Key              string
	SliceLengths     []uint64
	ReplicaNum       uint32
	SoftPin          bool
	PreferredSegment string // a segment name; "" for none
	ClientID         string
}

// PutEnd marks the replicas COMPLETE and starts the soft pin.
type PutEnd struct {
	NowMs    int64
	Key      string
	ClientID string
}

// PutRevoke drops PROCESSING replicas, and the object if none remain.
type PutRevoke struct {
	NowMs    int64
	Key      string
	ClientID string
}

// Remove deletes one object; a leased one only when forced.
type Remove struct {
	NowMs int64
	Key   string
	Force bool
}

// RemoveByRegex deletes every complete object whose key matches, skipping
// leased ones unless forced.
type RemoveByRegex struct {
	NowMs int64
	Regex string
	Force bool
}

// RemoveAll deletes every complete object, skipping leased ones unless forced.
type RemoveAll struct {
	NowMs int64
	Force bool
}

// Tick carries the leader's clock and what it batched since the last tick.
// Evict is the leader's decision to run eviction (it saw EvictionDue): the
// state machine evicts only when told, because the leader must hold reads
// while an evicting tick is in flight, so it has to know in advance.
type Tick struct {
	NowMs    int64
	Renewals []lease.Renewal
	Pings    []lease.Ping
	Evict    bool
	// ExpireMax bounds the objects the tick's expired sessions hold: once
	// they reach it, sessions past their deadline wait for the next tick,
	// and all of the tick's REMOVEs count as one bulk removal. A tick is
	// one apply under the state's lock, and pings wait for it: 5,000
	// clients gone at once, 1.5 million objects, held it for many seconds
	// and every other client's session expired too. 0 is the earlier rule
	// (every expired session at once, a bulk removal each), and is not
	// written, so a tick without it decodes on an older release.
	ExpireMax uint64
}

// Promote is the one-time cleanup a new leader proposes before serving. It
// also carries the leader's tunables, so every node applies the log with the
// same parameters whatever its own flags say.
type Promote struct {
	NowMs      int64
	LeaderID   string
	LeaderAddr string // the leader's client (gRPC) address, for NOT_LEADER answers
	Term       uint64
	Params     Params
	// MooncakeAddr is the leader's Mooncake-protocol address, where
	// followers forward Mooncake clients' calls; empty when it serves none.
	MooncakeAddr string
	// SessionGraceMs is added to the client TTL that every session gets at
	// the promotion: the time its client needs to find the new leader
	// once the old one went silent (a few failed pings, a lookup in etcd
	// beside every other client's, a connection) is the cluster's outage,
	// not the client's. Written only when set: an older node halts at a
	// Promote that carries it.
	SessionGraceMs int64
}

// MaxSessionGraceMs bounds Promote.SessionGraceMs: a day.
const MaxSessionGraceMs = 24 * 60 * 60 * 1000

// Member records a member's client (gRPC) address, so that every node can
// name every member's (moonctl members list); an empty GRPCAddr forgets
// the member.
type Member struct {
	ID       string
	GRPCAddr string
}

// ReleaseRemovals moves up to Max deferred REMOVEs into the export ring
// (the leader sends it at etcd's pace) and sets Direct, the REMOVEs a bulk
// removal exports at once before it defers the rest; the first one a
// cluster applies turns deferral on (docs/STATE_MACHINE.md, "Bulk
// removals").
type ReleaseRemovals struct {
	NowMs  int64
	Max    uint64
	Direct uint64
}

// Exported trims the export ring up to Seq once etcd holds it.
type Exported struct {
	Seq uint64
}

// Batch carries client writes (puts, upserts, removes) applied in order in
// one log entry, each with its own result: one Raft round trip for a whole
// batch RPC.
type Batch struct {
	Cmds []Command
}

// Batchable reports whether c may go in a Batch: the per-key client writes.
// Nothing time-driven belongs in a client batch. (UpsertStart and Remove
// check leases: the leader flushes renewals before proposing them.)
func Batchable(c Command) bool {
	switch c.(type) {
	case *PutStart, *PutEnd, *PutRevoke, *UpsertStart, *Remove:
		return true
	}
	return false
}

// UpsertStart puts Key if it is absent and overwrites it if present
// (Mooncake's UpsertStart); its fields are PutStart's. UpsertEnd and
// UpsertRevoke are PutEnd and PutRevoke, as in Mooncake.
type UpsertStart struct {
	PutStart
	// Copy: an object a reader's lease covers is written into fresh
	// buffers, its leased ones held until the lease ends, instead of being
	// refused OBJECT_REPLICA_BUSY. The command's type carries it
	// (CmdUpsertStartCopy); leaders of this release always set it.
	Copy bool
}

// GracefulUnmount stops new allocations on a segment at once and unmounts
// it once nothing on it is leased or being written, or GraceMs after this
// command at the latest (DrainSegments does it).
type GracefulUnmount struct {
	NowMs     int64
	ClientID  string
	SegmentID string
	GraceMs   int64
}

// DrainSegments unmounts every draining segment that is idle or past its
// deadline. The leader proposes it while segments drain, with every lease
// a read returned flushed into the log first, as for an evicting Tick.
type DrainSegments struct {
	NowMs int64
}

func (c *MountSegment) Type() CmdType {
	if c.Segment.hasTransport() {
		return CmdMountSegmentTransport
	}
	return CmdMountSegment
}
func (*UnmountSegment) Type() CmdType { return CmdUnmountSegment }
func (c *RemountSegments) Type() CmdType {
	for i := range c.Segments {
		if c.Segments[i].hasTransport() {
			return CmdRemountSegmentsTransport
		}
	}
	return CmdRemountSegments
}
func (*PutStart) Type() CmdType      { return CmdPutStart }
func (*PutEnd) Type() CmdType        { return CmdPutEnd }
func (*PutRevoke) Type() CmdType     { return CmdPutRevoke }
func (*Remove) Type() CmdType        { return CmdRemove }
func (*RemoveByRegex) Type() CmdType { return CmdRemoveByRegex }
func (*RemoveAll) Type() CmdType     { return CmdRemoveAll }
func (*Tick) Type() CmdType          { return CmdTick }
func (c *Promote) Type() CmdType {
	if c.MooncakeAddr != "" {
		return CmdPromoteMooncake
	}
	return CmdPromote
}
func (c *UpsertStart) Type() CmdType {
	if c.Copy {
		return CmdUpsertStartCopy
	}
	return CmdUpsertStart
}
func (*Exported) Type() CmdType        { return CmdExported }
func (*Batch) Type() CmdType           { return CmdBatch }
func (*GracefulUnmount) Type() CmdType { return CmdGracefulUnmount }
func (*DrainSegments) Type() CmdType   { return CmdDrainSegments }
func (*Member) Type() CmdType          { return CmdMember }
func (*ReleaseRemovals) Type() CmdType { return CmdReleaseRemovals }

// encode writes the spec; the transport fields only with transport (the
// command types that carry them, and snapshot records of segments that
// have them).
func (s *SegmentSpec) encode(e *enc, transport bool) {
	e.str(s.ID)
	e.str(s.Name)
	e.u64(s.Base)
	e.u64(s.Size)
	if transport {
		e.str(s.Endpoint)
		e.str(s.Protocol)
	}
}

func (s *SegmentSpec) decode(d *dec, transport bool) {
	s.ID = d.str()
	s.Name = d.str()
	s.Base = d.u64()
	s.Size = d.u64()
	if transport {
		s.Endpoint = d.str()
		s.Protocol = d.str()
	}
}

func (c *MountSegment) encode(e *enc) {
	e.i64(c.NowMs)
	e.str(c.ClientID)
	c.Segment.encode(e, c.Segment.hasTransport())
}
func (c *MountSegment) decode(d *dec) {
	c.NowMs = d.i64()
	c.ClientID = d.str()
	c.Segment.decode(d, d.transport)
}

func (c *UnmountSegment) encode(e *enc) { e.i64(c.NowMs); e.str(c.ClientID); e.str(c.SegmentID) }
func (c *UnmountSegment) decode(d *dec) {
	c.NowMs = d.i64()
	c.ClientID = d.str()
	c.SegmentID = d.str()
}

func (c *RemountSegments) encode(e *enc) {
	e.i64(c.NowMs)
	e.str(c.ClientID)
	e.u64(uint64(len(c.Segments)))
	transport := c.Type() == CmdRemountSegmentsTransport
	for i := range c.Segments {
		c.Segments[i].encode(e, transport)
	}
}

func (c *RemountSegments) decode(d *dec) {
	c.NowMs = d.i64()
	c.ClientID = d.str()
	c.Segments = make([]SegmentSpec, d.count(4))
	for i := range c.Segments {
		c.Segments[i].decode(d, d.transport)
	}
}

func (c *PutStart) encode(e *enc) {
	e.i64(c.NowMs)
	e.str(c.Key)
	e.u64(uint64(len(c.SliceLengths)))
	for _, l := range c.SliceLengths {
		e.u64(l)
	}
	e.u64(uint64(c.ReplicaNum))
	e.bool(c.SoftPin)
	e.str(c.PreferredSegment)
	e.str(c.ClientID)
}

func (c *PutStart) decode(d *dec) {
	c.NowMs = d.i64()
	c.Key = d.str()
	c.SliceLengths = make([]uint64, d.count(1))
	for i := range c.SliceLengths {
		c.SliceLengths[i] = d.u64()
	}
	n := d.u64()
	if n > MaxReplicas {
		d.Fail("replica_num %d", n)
	}
	c.ReplicaNum = uint32(n)
	c.SoftPin = d.bool()
	c.PreferredSegment = d.str()
	c.ClientID = d.str()
}

// An UpsertStart encodes as its PutStart; Copy is in the type byte.
func (c *UpsertStart) decode(d *dec) {
	c.PutStart.decode(d)
	c.Copy = d.upsertCopy
}

func (c *PutEnd) encode(e *enc) { e.i64(c.NowMs); e.str(c.Key); e.str(c.ClientID) }
func (c *PutEnd) decode(d *dec) {
	c.NowMs = d.i64()
	c.Key = d.str()
	c.ClientID = d.str()
}

func (c *PutRevoke) encode(e *enc) { e.i64(c.NowMs); e.str(c.Key); e.str(c.ClientID) }
func (c *PutRevoke) decode(d *dec) {
	c.NowMs = d.i64()
	c.Key = d.str()
	c.ClientID = d.str()
}

func (c *Remove) encode(e *enc) { e.i64(c.NowMs); e.str(c.Key); e.bool(c.Force) }
func (c *Remove) decode(d *dec) {
	c.NowMs = d.i64()
	c.Key = d.str()
	c.Force = d.bool()
}

func (c *RemoveByRegex) encode(e *enc) { e.i64(c.NowMs); e.str(c.Regex); e.bool(c.Force) }
func (c *RemoveByRegex) decode(d *dec) {
	c.NowMs = d.i64()
	c.Regex = d.str()
	c.Force = d.bool()
}

func (c *RemoveAll) encode(e *enc) { e.i64(c.NowMs); e.bool(c.Force) }
func (c *RemoveAll) decode(d *dec) {
	c.NowMs = d.i64()
	c.Force = d.bool()
}

func (c *Tick) encode(e *enc) {
	e.i64(c.NowMs)
	e.u64(uint64(len(c.Renewals)))
	for _, r := range c.Renewals {
		e.str(r.Key)
		e.i64(r.AtMs)
	}
	e.u64(uint64(len(c.Pings)))
	for _, p := range c.Pings {
		e.str(p.ClientID)
		e.i64(p.AtMs)
	}
	e.bool(c.Evict)
	if c.ExpireMax > 0 {
		e.u64(c.ExpireMax)
	}
}

func (c *Tick) decode(d *dec) {
	c.NowMs = d.i64()
	if n := d.count(2); n > 0 {
		c.Renewals = make([]lease.Renewal, n)
		for i := range c.Renewals {
			c.Renewals[i] = lease.Renewal{Key: d.str(), AtMs: d.i64()}
		}
	}
	if n := d.count(2); n > 0 {
		c.Pings = make([]lease.Ping, n)
		for i := range c.Pings {
			c.Pings[i] = lease.Ping{ClientID: d.str(), AtMs: d.i64()}
		}
	}
	c.Evict = d.bool()
	if d.Remaining() > 0 {
		if c.ExpireMax = d.u64(); c.ExpireMax == 0 && d.err() == nil {
			d.Fail("expiry bound written as 0")
		}
	}
}

func (c *Promote) encode(e *enc) {
	e.i64(c.NowMs)
	e.str(c.LeaderID)
	e.str(c.LeaderAddr)
	e.u64(c.Term)
	c.Params.encode(e)
	if c.MooncakeAddr != "" {
		e.str(c.MooncakeAddr)
	}
	if c.SessionGraceMs != 0 {
		e.i64(c.SessionGraceMs)
	}
}

func (c *Promote) decode(d *dec) {
	c.NowMs = d.i64()
	c.LeaderID = d.str()
	c.LeaderAddr = d.str()
	c.Term = d.u64()
	c.Params.decode(d)
	if d.promoteMooncake {
		c.MooncakeAddr = d.str()
	}
	if d.Remaining() > 0 {
		if c.SessionGraceMs = d.i64(); (c.SessionGraceMs <= 0 || c.SessionGraceMs > MaxSessionGraceMs) && d.err() == nil {
			d.Fail("session grace written as %d ms, want 1 to %d", c.SessionGraceMs, MaxSessionGraceMs)
		}
	}
}

func (c *GracefulUnmount) encode(e *enc) {
	e.i64(c.NowMs)
	e.str(c.ClientID)
	e.str(c.SegmentID)
	e.i64(c.GraceMs)
}

func (c *GracefulUnmount) decode(d *dec) {
	c.NowMs = d.i64()
	c.ClientID = d.str()
	c.SegmentID = d.str()
	c.GraceMs = d.i64()
}

func (c *DrainSegments) encode(e *enc) { e.i64(c.NowMs) }
func (c *DrainSegments) decode(d *dec) { c.NowMs = d.i64() }

func (c *Member) encode(e *enc) { e.str(c.ID); e.str(c.GRPCAddr) }
func (c *Member) decode(d *dec) { c.ID, c.GRPCAddr = d.str(), d.str() }

func (c *ReleaseRemovals) encode(e *enc) { e.i64(c.NowMs); e.u64(c.Max); e.u64(c.Direct) }
func (c *ReleaseRemovals) decode(d *dec) { c.NowMs, c.Max, c.Direct = d.i64(), d.u64(), d.u64() }

func (c *Exported) encode(e *enc) { e.u64(c.Seq) }
func (c *Exported) decode(d *dec) { c.Seq = d.u64() }

func (c *Batch) encode(e *enc) {
	e.u64(uint64(len(c.Cmds)))
	e.b = slices.Grow(e.b, 64*len(c.Cmds))
	item := enc{b: make([]byte, 0, 128)} // reused: each item is copied into e
	for _, cmd := range c.Cmds {
		item.b = append(item.b[:0], byte(cmd.Type()))
		cmd.encode(&item)
		e.bytes(item.b)
	}
}

func (c *Batch) decode(d *dec) {
	c.Cmds = make([]Command, d.count(2))
	for i := range c.Cmds {
		b := d.bytes() // Decode copies what it keeps
		if d.err() != nil {
			return
		}
		cmd, err := Decode(b)
		if err == nil && (cmd == nil || !Batchable(cmd)) {
			err = errcode.New(errcode.InvalidParams, "a batch holds only PutStart, PutEnd, PutRevoke, UpsertStart and Remove (item %d)", i)
		}
		if err != nil {
			d.Fail("item %d: %v", i, err)
			return
		}
		c.Cmds[i] = cmd
	}
}

// Encode returns the log entry bytes of c: its type byte, then its payload.
func Encode(c Command) []byte {
	e := enc{b: make([]byte, 1, 64)}
	e.b[0] = byte(c.Type())
	c.encode(&e)
	return e.b
}

// Decode parses a log entry. It returns (nil, nil) for an unknown type that
// carries IgnoreUnknownFlag, which the caller skips.
func Decode(b []byte) (Command, error) {
	if len(b) == 0 {
		return nil, errcode.New(errcode.InvalidParams, "command: empty log entry")
	}
	t := CmdType(b[0])
	c := newCommand(t)
	if c == nil {
		if t&IgnoreUnknownFlag != 0 {
			return nil, nil
		}
		return nil, errcode.New(errcode.InvalidVersion,
			"command: unknown type %d; the leader may run a newer moonraft than this node: upgrade it", t)
	}
	d := newDec(b[1:], "command", t.String())
	d.transport = t == CmdMountSegmentTransport || t == CmdRemountSegmentsTransport
	d.promoteMooncake = t == CmdPromoteMooncake
	d.upsertCopy = t == CmdUpsertStartCopy
	c.decode(&d)
	if err := d.done(); err != nil {
		return nil, err
	}
	return c, nil
}
