package client

import (
	"context"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
)

// ReplicateConfig says how a put is replicated.
type ReplicateConfig struct {
	ReplicaNum       uint32
	SoftPin          bool
	PreferredSegment string // a segment name; "" for any
}

func (r ReplicateConfig) pb() *moonraftpb.ReplicateConfig {
	return &moonraftpb.ReplicateConfig{ReplicaNum: r.ReplicaNum, WithSoftPin: r.SoftPin, PreferredSegment: r.PreferredSegment}
}

// KeyReplicas is one key found by GetReplicaListByRegex.
type KeyReplicas struct {
	Key          string
	Replicas     []oplog.ReplicaDesc
	LeaseUntilMs int64
}

// ExistResult is one answer of BatchExistKey.
type ExistResult struct {
	Exists       bool
	LeaseUntilMs int64
	Err          error
}

// ReplicaListResult is one answer of BatchGetReplicaList.
type ReplicaListResult struct {
	Replicas     []oplog.ReplicaDesc
	LeaseUntilMs int64
	Err          error
}

// PutStartItem is one put of BatchPutStart.
type PutStartItem struct {
	Key          string
	SliceLengths []uint64
	Config       ReplicateConfig
	ClientID     string
}

// PutStartResult is one answer of BatchPutStart.
type PutStartResult struct {
	Replicas []oplog.ReplicaDesc
	Err      error
}

// ExistKey reports whether key has a complete replica and the read lease granted.
func (c *Client) ExistKey(ctx context.Context, key string) (bool, int64, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.ExistKey, &moonraftpb.ExistKeyRequest{Key: key})
	if err != nil {
		return false, 0, err
	}
	return r.GetExists(), r.GetLeaseUntilMs(), nil
}

// GetReplicaList returns where key's replicas are and the read lease granted.
func (c *Client) GetReplicaList(ctx context.Context, key string) ([]oplog.ReplicaDesc, int64, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.GetReplicaList, &moonraftpb.GetReplicaListRequest{Key: key})
	if err != nil {
		return nil, 0, err
	}
	return moonraftpb.ReplicasFromPB(r.GetReplicas()), r.GetLeaseUntilMs(), nil
}

// GetReplicaListByRegex returns every complete object whose key matches re (RE2), by key.
func (c *Client) GetReplicaListByRegex(ctx context.Context, re string) ([]KeyReplicas, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.GetReplicaListByRegex, &moonraftpb.GetReplicaListByRegexRequest{Regex: re})
	if err != nil {
		return nil, err
	}
	out := make([]KeyReplicas, len(r.GetObjects()))
	for i, o := range r.GetObjects() {
		out[i] = KeyReplicas{Key: o.GetKey(), Replicas: moonraftpb.ReplicasFromPB(o.GetReplicas()), LeaseUntilMs: o.GetLeaseUntilMs()}
	}
	return out, nil
}

// BatchExistKey is ExistKey for many keys: one result per key, in order.
// The error is for the batch as a whole.
func (c *Client) BatchExistKey(ctx context.Context, keys []string) ([]ExistResult, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.BatchExistKey, &moonraftpb.BatchExistKeyRequest{Keys: keys})
	if err != nil {
		return nil, err
	}
	if err := checkCount(len(r.GetResults()), len(keys)); err != nil {
		return nil, err
	}
	out := make([]ExistResult, len(keys))
	for i, it := range r.GetResults() {
		out[i] = ExistResult{Exists: it.GetExists(), LeaseUntilMs: it.GetLeaseUntilMs(), Err: moonraftpb.ErrorOf(it.GetStatus())}
	}
	return out, nil
}

// BatchGetReplicaList is GetReplicaList for many keys: one result per key,
// in order. The error is for the batch as a whole.
func (c *Client) BatchGetReplicaList(ctx context.Context, keys []string) ([]ReplicaListResult, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.BatchGetReplicaList, &moonraftpb.BatchGetReplicaListRequest{Keys: keys})
	if err != nil {
		return nil, err
	}
	if err := checkCount(len(r.GetResults()), len(keys)); err != nil {
		return nil, err
	}
	out := make([]ReplicaListResult, len(keys))
	for i, it := range r.GetResults() {
		out[i] = ReplicaListResult{Replicas: moonraftpb.ReplicasFromPB(it.GetReplicas()), LeaseUntilMs: it.GetLeaseUntilMs(), Err: moonraftpb.ErrorOf(it.GetStatus())}
	}
	return out, nil
}

// PutStart allocates the replicas of a new object. It is never resent once
// it may have reached the leader: a lost answer is OUTCOME_UNKNOWN.
func (c *Client) PutStart(ctx context.Context, key string, sliceLengths []uint64, cfg ReplicateConfig, clientID string) ([]oplog.ReplicaDesc, error) {
	return c.start(ctx, moonraftpb.MasterClient.PutStart, PutStartItem{key, sliceLengths, cfg, clientID})
}

// UpsertStart puts key if absent and overwrites it if present (rules in
// docs/STATE_MACHINE.md). Like PutStart it is never resent once it may have
// reached the leader: a lost answer is OUTCOME_UNKNOWN.
func (c *Client) UpsertStart(ctx context.Context, key string, sliceLengths []uint64, cfg ReplicateConfig, clientID string) ([]oplog.ReplicaDesc, error) {
	return c.start(ctx, moonraftpb.MasterClient.UpsertStart, PutStartItem{key, sliceLengths, cfg, clientID})
}

type startRPC = func(moonraftpb.MasterClient, context.Context, *moonraftpb.PutStartRequest, ...grpc.CallOption) (*moonraftpb.PutStartResponse, error)

func (c *Client) start(ctx context.Context, rpc startRPC, it PutStartItem) ([]oplog.ReplicaDesc, error) {
	r, err := call(ctx, c, false, rpc, it.pb())
	if err != nil {
		return nil, err
	}
	return moonraftpb.ReplicasFromPB(r.GetReplicas()), nil
}

func (it PutStartItem) pb() *moonraftpb.PutStartRequest {
	return &moonraftpb.PutStartRequest{Key: it.Key, SliceLengths: it.SliceLengths, Config: it.Config.pb(), ClientId: it.ClientID}
}

// PutEnd completes a put; retried freely, since completing a complete
// object again is OK.
func (c *Client) PutEnd(ctx context.Context, key, clientID string) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.PutEnd, &moonraftpb.PutEndRequest{Key: key, ClientId: clientID})
	return err
}

// PutRevoke abandons a put (not resent: a second one would find nothing).
func (c *Client) PutRevoke(ctx context.Context, key, clientID string) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.PutRevoke, &moonraftpb.PutRevokeRequest{Key: key, ClientId: clientID})
	return err
}

// BatchPutStart is PutStart for many objects: one result per item, in
// order. The error is for the batch as a whole.
func (c *Client) BatchPutStart(ctx context.Context, items []PutStartItem) ([]PutStartResult, error) {
	return c.batchStart(ctx, moonraftpb.MasterClient.BatchPutStart, items)
}

// BatchUpsertStart is UpsertStart for many objects, one log entry: one
// result per item, in order. The error is for the batch as a whole.
func (c *Client) BatchUpsertStart(ctx context.Context, items []PutStartItem) ([]PutStartResult, error) {
	return c.batchStart(ctx, moonraftpb.MasterClient.BatchUpsertStart, items)
}

type batchStartRPC = func(moonraftpb.MasterClient, context.Context, *moonraftpb.BatchPutStartRequest, ...grpc.CallOption) (*moonraftpb.BatchPutStartResponse, error)

func (c *Client) batchStart(ctx context.Context, rpc batchStartRPC, items []PutStartItem) ([]PutStartResult, error) {
	req := &moonraftpb.BatchPutStartRequest{Items: make([]*moonraftpb.PutStartRequest, len(items))}
	for i, it := range items {
		req.Items[i] = it.pb()
	}
	r, err := call(ctx, c, false, rpc, req)
	if err != nil {
		return nil, err
	}
	if err := checkCount(len(r.GetResults()), len(items)); err != nil {
		return nil, err
	}
	out := make([]PutStartResult, len(items))
	for i, it := range r.GetResults() {
		out[i] = PutStartResult{Replicas: moonraftpb.ReplicasFromPB(it.GetReplicas()), Err: moonraftpb.ErrorOf(it.GetStatus())}
	}
	return out, nil
}

// BatchPutEnd is PutEnd for many keys of one client: one error per key.
func (c *Client) BatchPutEnd(ctx context.Context, clientID string, keys []string) ([]error, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.BatchPutEnd, &moonraftpb.BatchPutEndRequest{Keys: keys, ClientId: clientID})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// BatchPutRevoke is PutRevoke for many keys of one client: one error per key.
func (c *Client) BatchPutRevoke(ctx context.Context, clientID string, keys []string) ([]error, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.BatchPutRevoke, &moonraftpb.BatchPutRevokeRequest{Keys: keys, ClientId: clientID})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// UpsertEnd completes an upsert; retried freely, as PutEnd is.
func (c *Client) UpsertEnd(ctx context.Context, key, clientID string) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.UpsertEnd, &moonraftpb.PutEndRequest{Key: key, ClientId: clientID})
	return err
}

// UpsertRevoke abandons an upsert: the object goes, old value included.
// Not resent, as PutRevoke is not.
func (c *Client) UpsertRevoke(ctx context.Context, key, clientID string) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.UpsertRevoke, &moonraftpb.PutRevokeRequest{Key: key, ClientId: clientID})
	return err
}

// BatchUpsertEnd is UpsertEnd for many keys of one client: one error per key.
func (c *Client) BatchUpsertEnd(ctx context.Context, clientID string, keys []string) ([]error, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.BatchUpsertEnd, &moonraftpb.BatchPutEndRequest{Keys: keys, ClientId: clientID})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// BatchUpsertRevoke is UpsertRevoke for many keys of one client: one error per key.
func (c *Client) BatchUpsertRevoke(ctx context.Context, clientID string, keys []string) ([]error, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.BatchUpsertRevoke, &moonraftpb.BatchPutRevokeRequest{Keys: keys, ClientId: clientID})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// BatchRemove is Remove for many keys, one log entry: one error per key.
// Not resent: a second one would find the removed keys gone.
func (c *Client) BatchRemove(ctx context.Context, keys []string, force bool) ([]error, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.BatchRemove, &moonraftpb.BatchRemoveRequest{Keys: keys, Force: force})
	if err != nil {
		return nil, err
	}
	return itemErrors(r.GetResults(), len(keys))
}

// Remove deletes key; force ignores its read lease.
func (c *Client) Remove(ctx context.Context, key string, force bool) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.Remove, &moonraftpb.RemoveRequest{Key: key, Force: force})
	return err
}

// RemoveByRegex deletes the objects whose key matches re and says how many.
func (c *Client) RemoveByRegex(ctx context.Context, re string, force bool) (uint64, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.RemoveByRegex, &moonraftpb.RemoveByRegexRequest{Regex: re, Force: force})
	return r.GetRemoved(), err
}

// RemoveAll deletes every object and says how many.
func (c *Client) RemoveAll(ctx context.Context, force bool) (uint64, error) {
	r, err := call(ctx, c, false, moonraftpb.MasterClient.RemoveAll, &moonraftpb.RemoveAllRequest{Force: force})
	return r.GetRemoved(), err
}

// MountSegment registers a segment of clientID (idempotent).
func (c *Client) MountSegment(ctx context.Context, clientID string, seg fsm.SegmentSpec) error {
	_, err := call(ctx, c, true, moonraftpb.MasterClient.MountSegment, &moonraftpb.MountSegmentRequest{ClientId: clientID, Segment: moonraftpb.SegmentToPB(seg)})
	return err
}

// ReMountSegment re-registers all of clientID's segments after NEED_REMOUNT.
func (c *Client) ReMountSegment(ctx context.Context, clientID string, segs []fsm.SegmentSpec) error {
	req := &moonraftpb.ReMountSegmentRequest{ClientId: clientID, Segments: make([]*moonraftpb.Segment, len(segs))}
	for i, s := range segs {
		req.Segments[i] = moonraftpb.SegmentToPB(s)
	}
	_, err := call(ctx, c, true, moonraftpb.MasterClient.ReMountSegment, req)
	return err
}

// UnmountSegment removes a segment and the replicas on it (not resent: a
// second one would find no segment).
func (c *Client) UnmountSegment(ctx context.Context, clientID, segmentID string) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.UnmountSegment, &moonraftpb.UnmountSegmentRequest{ClientId: clientID, SegmentId: segmentID})
	return err
}

// GracefulUnmountSegment stops allocations on clientID's segment at once
// and has it unmounted once nothing on it is leased or written, or after
// grace at the latest (0: the server's bound). Not resent: once the
// segment is gone a second one finds none.
func (c *Client) GracefulUnmountSegment(ctx context.Context, clientID, segmentID string, grace time.Duration) error {
	_, err := call(ctx, c, false, moonraftpb.MasterClient.GracefulUnmountSegment, &moonraftpb.GracefulUnmountSegmentRequest{
		ClientId: clientID, SegmentId: segmentID, GracePeriodMs: grace.Milliseconds()})
	return err
}

// SegmentStatus is QuerySegmentStatus's answer.
type SegmentStatus struct {
	State        string // OK or GRACEFULLY_UNMOUNTING
	Segment      fsm.SegmentSpec
	ClientID     string
	UsedBytes    uint64
	Objects      uint64
	DrainUntilMs int64 // while GRACEFULLY_UNMOUNTING
}

// QuerySegmentStatus describes the segment named name, or, with byID, the
// segment with id name.
func (c *Client) QuerySegmentStatus(ctx context.Context, name string, byID bool) (SegmentStatus, error) {
	req := &moonraftpb.QuerySegmentStatusRequest{SegmentName: name}
	if byID {
		req = &moonraftpb.QuerySegmentStatusRequest{SegmentId: name}
	}
	r, err := call(ctx, c, true, moonraftpb.MasterClient.QuerySegmentStatus, req)
	if err != nil {
		return SegmentStatus{}, err
	}
	return segmentStateFromPB(r.GetSegment()), nil
}

// ListSegments describes every mounted segment, by id.
func (c *Client) ListSegments(ctx context.Context) ([]SegmentStatus, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.ListSegments, &moonraftpb.ListSegmentsRequest{})
	if err != nil {
		return nil, err
	}
	out := make([]SegmentStatus, len(r.GetSegments()))
	for i, st := range r.GetSegments() {
		out[i] = segmentStateFromPB(st)
	}
	return out, nil
}

// ServiceReady returns the server's version once a node answers.
func (c *Client) ServiceReady(ctx context.Context) (string, error) {
	r, err := call(ctx, c, true, moonraftpb.MasterClient.ServiceReady, &moonraftpb.ServiceReadyRequest{})
	return r.GetVersion(), err
}

// PingResult is a Ping's answer.
type PingResult struct {
	// NeedRemount: the master has no session for the client; call
	// ReMountSegment (KeepAlive does).
	NeedRemount bool
	TTLMs       int64 // the session TTL
	// ViewVersion is the term the serving leader was promoted in: a new
	// value means a failover happened since the last ping.
	ViewVersion uint64
}

// Ping renews clientID's session.
func (c *Client) Ping(ctx context.Context, clientID string) (PingResult, error) {
	return c.ping(ctx, clientID, retryMode{idempotent: true})
}

func (c *Client) ping(ctx context.Context, clientID string, mode retryMode) (PingResult, error) {
	r, err := callIn(ctx, c, mode, moonraftpb.MasterClient.Ping, &moonraftpb.PingRequest{ClientId: clientID})
	if err != nil {
		return PingResult{}, err
	}
	return PingResult{
		NeedRemount: r.GetClientStatus() == moonraftpb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT,
		TTLMs:       r.GetTtlMs(),
		ViewVersion: r.GetViewVersion(),
	}, nil
}

func checkCount(got, want int) error {
	if got != want {
		return errcode.New(errcode.InternalError, "the master answered %d results for %d items", got, want)
	}
	return nil
}

func itemErrors[R interface{ GetStatus() *moonraftpb.Status }](res []R, n int) ([]error, error) {
	if err := checkCount(len(res), n); err != nil {
		return nil, err
	}
	out := make([]error, n)
	for i, it := range res {
		out[i] = moonraftpb.ErrorOf(it.GetStatus())
	}
	return out, nil
}

func segmentStateFromPB(st *moonraftpb.SegmentState) SegmentStatus {
	return SegmentStatus{State: st.GetState(), Segment: moonraftpb.SegmentFromPB(st.GetSegment()), ClientID: st.GetClientId(),
		UsedBytes: st.GetUsedBytes(), Objects: st.GetObjects(), DrainUntilMs: st.GetDrainUntilMs()}
}
