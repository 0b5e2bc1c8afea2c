package node

import (
	"bufio"
	"context"
	"maps"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/errcode"
	mc "github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/structpack"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mcConn is a Mooncake-protocol client for tests: one call at a time.
type mcConn struct {
	t   *testing.T
	c   net.Conn
	r   *bufio.Reader
	seq uint32
}

func dialMooncake(t *testing.T, addr string) *mcConn {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &mcConn{t: t, c: c, r: bufio.NewReader(c)}
}

// raw sends a call with the given id and body and returns the answer.
func (m *mcConn) raw(id uint32, body []byte) cororpc.Response {
	m.send(id, body)
	return m.answer()
}

// send sends a call without waiting for its answer.
func (m *mcConn) send(id uint32, body []byte) {
	m.seq++
	require.NoError(m.t, m.c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err := m.c.Write(cororpc.AppendRequest(nil, cororpc.Request{Header: cororpc.ReqHeader{Seq: m.seq, FunctionID: id}, Body: body}))
	require.NoError(m.t, err)
}

// answer reads the answer to the call sent last.
func (m *mcConn) answer() cororpc.Response {
	require.NoError(m.t, m.c.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := cororpc.ReadResponse(m.r)
	require.NoError(m.t, err)
	require.Equal(m.t, m.seq, resp.Header.Seq)
	return resp
}

// mcCall calls the Mooncake function name with args (nil: none) and
// decodes its result.
func mcCall[R any](m *mcConn, name string, args any) R {
	m.send(mc.FunctionID(name), mcArgs(m.t, args))
	return mcAnswer[R](m, name)
}

func mcArgs(t *testing.T, args any) []byte {
	if args == nil {
		return nil
	}
	body, err := structpack.Marshal(args)
	require.NoError(t, err)
	return body
}

// mcAnswer reads and decodes the answer to the call of name sent last.
func mcAnswer[R any](m *mcConn, name string) R {
	resp := m.answer()
	require.Equal(m.t, cororpc.ErrcOK, resp.Header.Errc, name)
	var r R
	require.NoError(m.t, structpack.Unmarshal(resp.Body, &r), name)
	return r
}

// mountAndPut mounts a segment for a client through m and completes a put
// of each key in it; it returns the client's id.
func mountAndPut(t *testing.T, m *mcConn, keys ...string) mc.UUID {
	client := mc.UUID{First: 1, Second: 2}
	seg := mc.Segment{ID: mc.UUID{First: 3, Second: 4}, Name: "host-a:12000", Base: 1 << 40, Size: 64 << 20, TEEndpoint: "127.0.0.1:15000", Protocol: "tcp"}
	require.Zero(t, mcCall[structpack.Expected[mc.Void]](m, "MountSegment", mc.MountArgs{Segment: seg, ClientID: client}).Err)
	for _, k := range keys {
		require.Zero(t, mcCall[structpack.Expected[[]mc.ReplicaDescriptor]](m, "PutStart", mc.PutStartArgs{ClientID: client, Key: k, SliceLength: 1, Config: mc.ReplicateConfig{ReplicaNum: 1}}).Err)
		require.Zero(t, mcCall[structpack.Expected[mc.Void]](m, "PutEnd", mc.PutEndArgs{ClientID: client, Meta: mc.ObjectMeta{Key: k}}).Err)
	}
	return client
}

// sendHeldRead sends a GetReplicaList of key through m to the leader nd,
// under nd's read lease, while a removal of key is in flight on nd (as one
// holds reads of its key), and returns once nd has read the call; the
// returned func ends the removal.
func sendHeldRead(t *testing.T, nd *Node, m *mcConn, key string) (endRemoval func()) {
	endRemoval = nd.gate.closeKey(key)
	require.NoError(t, nd.confirmLeader(ctx(t)))
	_, leased := nd.leadership.lease()
	require.True(t, leased, "the read starts on the event loop, under the lease")
	m.send(mc.FunctionID("GetReplicaList"), mcArgs(t, mc.KeyArgs{Key: key}))
	time.Sleep(50 * time.Millisecond) // read by the server
	return endRemoval
}

func withMooncake(t testing.TB) func(*Config) {
	return func(cfg *Config) { cfg.MooncakeAddr = freeAddr(t) }
}

func codeIs[T any](t *testing.T, want errcode.Code, e structpack.Expected[T], msg string) {
	t.Helper()
	assert.Equal(t, structpack.ErrorCode(want), e.Err, msg)
}

// TestMooncakeProtocol: every kind of call a Mooncake client session
// makes, through the leader's Mooncake address, with their error answers.
func TestMooncakeProtocol(t *testing.T) {
	c := newCluster(t, 3, 100*time.Millisecond, withMooncake(t))
	li := c.leader()
	m := dialMooncake(t, c.cfgs[li].MooncakeAddr)
	client := mc.UUID{First: 1, Second: 2}
	seg := mc.Segment{ID: mc.UUID{First: 3, Second: 4}, Name: "host-a:12000", Base: 1 << 40, Size: 64 << 20, TEEndpoint: "127.0.0.1:15000", Protocol: "tcp"}
	one := mc.ReplicateConfig{ReplicaNum: 1}

	assert.Equal(t, structpack.OK(mc.StoreVersion), mcCall[structpack.Expected[string]](m, "ServiceReady", nil))
	ping := mcCall[structpack.Expected[mc.PingResponse]](m, "Ping", client)
	assert.Equal(t, mc.ClientNeedRemount, ping.Value.ClientStatus, "an unknown client is told to remount")
	assert.Zero(t, mcCall[structpack.Expected[mc.Void]](m, "MountSegment", mc.MountArgs{Segment: seg, ClientID: client}).Err)
	assert.Zero(t, mcCall[structpack.Expected[mc.Void]](m, "MountSegment", mc.MountArgs{Segment: seg, ClientID: client}).Err, "mounting again is a no-op")
	moved := seg
	moved.TEEndpoint = "127.0.0.1:15001"
	codeIs(t, errcode.SegmentAlreadyExists, mcCall[structpack.Expected[mc.Void]](m, "MountSegment", mc.MountArgs{Segment: moved, ClientID: client}), "same id, other endpoint")
	ping = mcCall[structpack.Expected[mc.PingResponse]](m, "Ping", client)
	assert.Equal(t, mc.ClientOK, ping.Value.ClientStatus)
	assert.Positive(t, ping.Value.ViewVersionID, "the term the leader was promoted in")

	put := mcCall[structpack.Expected[[]mc.ReplicaDescriptor]](m, "PutStart", mc.PutStartArgs{ClientID: client, Key: "k", SliceLength: 4096, Config: one, TenantID: "default"})
	require.Zero(t, put.Err)
	require.Len(t, put.Value, 1)
	buf := put.Value[0].Descriptor.Value().(mc.MemoryDescriptor).Buffer
	assert.Equal(t, mc.BufferDescriptor{Size: 4096, BufferAddress: seg.Base, Protocol: "tcp", TransportEndpoint: "127.0.0.1:15000"}, buf,
		"the transfer engine finds the buffer at the segment's endpoint")
	assert.Equal(t, mc.ReplicaProcessing, put.Value[0].Status)
	codeIs(t, errcode.ReplicaIsNotReady, mcCall[structpack.Expected[mc.GetReplicaListResponse]](m, "GetReplicaList", mc.KeyArgs{Key: "k", TenantID: "default"}), "not readable while written")
	codeIs(t, errcode.IllegalClient, mcCall[structpack.Expected[mc.Void]](m, "PutEnd", mc.PutEndArgs{ClientID: mc.UUID{First: 9}, Meta: mc.ObjectMeta{Key: "k"}, TenantID: "default"}), "another client's put")
	assert.Zero(t, mcCall[structpack.Expected[mc.Void]](m, "PutEnd", mc.PutEndArgs{ClientID: client, Meta: mc.ObjectMeta{Key: "k"}, TenantID: "default"}).Err)
	got := mcCall[structpack.Expected[mc.GetReplicaListResponse]](m, "GetReplicaList", mc.KeyArgs{Key: "k", TenantID: "default"})
	require.Zero(t, got.Err)
	assert.Equal(t, mc.ReplicaComplete, got.Value.Replicas[0].Status)
	assert.Equal(t, uint64(c.cfgs[li].Params.LeaseTTLMs), got.Value.LeaseTTLMs)
	assert.Equal(t, structpack.OK(true), mcCall[structpack.Expected[bool]](m, "ExistKey", mc.KeyArgs{Key: "k", TenantID: "default"}))
	codeIs(t, errcode.InvalidParams, mcCall[structpack.Expected[bool]](m, "ExistKey", mc.KeyArgs{Key: "k", TenantID: "other"}), "one tenant only")

	batch := mcCall[[]structpack.Expected[[]mc.ReplicaDescriptor]](m, "BatchPutStart", mc.BatchPutStartArgs{ClientID: client, Keys: []string{"a", "k"}, SliceLengths: []uint64{10, 10}, Config: one, TenantID: "default"})
	require.Len(t, batch, 2)
	assert.Zero(t, batch[0].Err)
	codeIs(t, errcode.ObjectAlreadyExists, batch[1], "a key of the batch that exists")
	ends := mcCall[[]structpack.Expected[mc.Void]](m, "BatchPutEnd", mc.BatchPutEndArgs{ClientID: client, Metas: []mc.ObjectMeta{{Key: "a"}, {Key: "nope"}}, TenantID: "default"})
	assert.Zero(t, ends[0].Err)
	codeIs(t, errcode.ObjectNotFound, ends[1], "PutEnd of a key never started")
	mismatched := mcCall[[]structpack.Expected[[]mc.ReplicaDescriptor]](m, "BatchPutStart", mc.BatchPutStartArgs{ClientID: client, Keys: []string{"x", "y"}, SliceLengths: []uint64{10}, Config: one})
	codeIs(t, errcode.InvalidParams, mismatched[1], "as many slice lengths as keys")
	reads := mcCall[[]structpack.Expected[mc.GetReplicaListResponse]](m, "BatchGetReplicaList", mc.KeysArgs{Keys: []string{"a", "gone"}, TenantID: "default"})
	assert.Zero(t, reads[0].Err)
	codeIs(t, errcode.ObjectNotFound, reads[1], "a key that does not exist")
	removed := mcCall[[]structpack.Expected[mc.Void]](m, "BatchRemove", mc.BatchRemoveArgs{Keys: []string{"a", "k"}, Force: true, TenantID: "default"})
	assert.Equal(t, []structpack.Expected[mc.Void]{{}, {}}, removed)
	assert.Equal(t, structpack.OK(false), mcCall[structpack.Expected[bool]](m, "ExistKey", mc.KeyArgs{Key: "k", TenantID: "default"}))
	assert.Zero(t, mcCall[structpack.Expected[mc.Void]](m, "UnmountSegment", mc.UnmountArgs{SegmentID: seg.ID, ClientID: client}).Err)
	assert.Zero(t, mcCall[structpack.Expected[mc.Void]](m, "UnmountSegment", mc.UnmountArgs{SegmentID: seg.ID, ClientID: client}).Err,
		"unmounting a segment that is gone succeeds, as Mooncake's master answers")

	unknown := m.raw(0x12345678, nil)
	assert.Equal(t, cororpc.ErrcFunctionNotRegistered, unknown.Header.Errc, "a function this release does not have")
	garbled := m.raw(mc.FunctionID("ExistKey"), []byte{1, 2, 3})
	assert.Equal(t, cororpc.ErrcInvalidArguments, garbled.Header.Errc)
	var msg string
	require.NoError(t, structpack.Unmarshal(garbled.Body, &msg))
	assert.Equal(t, "invalid rpc arg", msg)

	// Through a follower: forwarded to the leader, frame for frame.
	f := dialMooncake(t, c.cfgs[(li+1)%3].MooncakeAddr)
	require.Zero(t, mcCall[structpack.Expected[mc.Void]](f, "MountSegment", mc.MountArgs{Segment: seg, ClientID: client}).Err)
	require.Zero(t, mcCall[structpack.Expected[[]mc.ReplicaDescriptor]](f, "PutStart", mc.PutStartArgs{ClientID: client, Key: "f", SliceLength: 1, Config: one}).Err)
	require.Zero(t, mcCall[structpack.Expected[mc.Void]](f, "PutEnd", mc.PutEndArgs{ClientID: client, Meta: mc.ObjectMeta{Key: "f"}}).Err)
	fromFollower := mcCall[structpack.Expected[mc.GetReplicaListResponse]](f, "GetReplicaList", mc.KeyArgs{Key: "f"})
	require.Zero(t, fromFollower.Err)
	assert.Equal(t, mc.ReplicaComplete, fromFollower.Value.Replicas[0].Status)
	assert.Equal(t, cororpc.ErrcFunctionNotRegistered, f.raw(0x12345678, nil).Header.Errc, "the leader's error answers come back as they are")
}

// TestMooncakeReadThatWouldWaitHoldsUpNoOne: a read of a key whose
// removal is in flight waits for it, on a worker: the event loop that read
// it answers the reads of other clients meanwhile, and the waiting read is
// answered once the removal ends.
func TestMooncakeReadThatWouldWaitHoldsUpNoOne(t *testing.T) {
	c := newCluster(t, 3, 100*time.Millisecond, withMooncake(t))
	li := c.leader()
	addr := c.cfgs[li].MooncakeAddr
	a, b := dialMooncake(t, addr), dialMooncake(t, addr)
	mountAndPut(t, a, "k", "other")

	endRemoval := sendHeldRead(t, c.nodes[li], a, "k")
	require.Zero(t, mcCall[structpack.Expected[mc.GetReplicaListResponse]](b, "GetReplicaList", mc.KeyArgs{Key: "other"}).Err,
		"another client's read is answered while k's waits")
	require.NoError(t, a.c.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
	_, err := a.r.Peek(1)
	require.Error(t, err, "the read of k waits for the removal")

	endRemoval()
	got := mcAnswer[structpack.Expected[mc.GetReplicaListResponse]](a, "GetReplicaList")
	assert.Zero(t, got.Err, "answered once the removal ended")
}

// TestMooncakeReadAcrossLeaderChange: a read the leader was running when
// its leadership moved (here held by a removal of its key in flight, as a
// paused leader holds what it had queued) is answered by the new leader,
// not with an error: master_bench ends on the first Ping that fails.
func TestMooncakeReadAcrossLeaderChange(t *testing.T) {
	c := newCluster(t, 3, 100*time.Millisecond, withMooncake(t))
	li := c.leader()
	a := dialMooncake(t, c.cfgs[li].MooncakeAddr)
	client := mountAndPut(t, a, "k")

	nd := c.nodes[li]
	endRemoval := sendHeldRead(t, nd, a, "k")
	target := (li + 1) % 3
	require.NoError(t, nd.TransferLeadership(ctx(t), c.cfgs[target].ID))
	require.Eventually(t, func() bool { _, ok := nd.promotedLeader(); return ok }, 5*time.Second, 10*time.Millisecond,
		"the new leader's Promote reaches the old one")
	endRemoval()

	got := mcAnswer[structpack.Expected[mc.GetReplicaListResponse]](a, "GetReplicaList")
	assert.Zero(t, got.Err, "answered by the new leader")
	assert.Len(t, got.Value.Replicas, 1)

	ping := mcCall[structpack.Expected[mc.PingResponse]](a, "Ping", client)
	assert.Zero(t, ping.Err, "a Ping through the old leader reaches the new one")
}

// TestMooncakeCallsNoClientSends: the calls `make mooncake-golden` sends to
// the real master because no client of its build does (the Upsert family,
// BatchPutRevoke, GetReplicaListByRegex, BatchRemove,
// GracefulUnmountSegment), in the same order, answered as the real master
// answered them: every one succeeds, and the regex finds the completed
// upserts only.
func TestMooncakeCallsNoClientSends(t *testing.T) {
	c := newCluster(t, 3, 100*time.Millisecond, withMooncake(t))
	m := dialMooncake(t, c.cfgs[c.leader()].MooncakeAddr)
	client := mc.UUID{First: 7, Second: 8}
	seg := mc.Segment{ID: mc.UUID{First: 9, Second: 10}, Name: "127.0.0.1:12999", Base: 1 << 40, Size: 64 << 20,
		TEEndpoint: "127.0.0.1:15999", Protocol: "tcp"}
	one := mc.ReplicateConfig{ReplicaNum: 1}
	const tenant = "default"
	type void = structpack.Expected[mc.Void]
	type reps = structpack.Expected[[]mc.ReplicaDescriptor]

	require.Zero(t, mcCall[void](m, "MountSegment", mc.MountArgs{Segment: seg, ClientID: client}).Err)
	for _, key := range []string{"golden/u", "golden/r"} {
		r := mcCall[reps](m, "UpsertStart", mc.PutStartArgs{ClientID: client, Key: key, SliceLength: 16, Config: one, TenantID: tenant})
		require.Zero(t, r.Err, key)
		require.Len(t, r.Value, 1)
	}
	assert.Zero(t, mcCall[void](m, "UpsertEnd", mc.PutEndArgs{ClientID: client, Meta: mc.ObjectMeta{Key: "golden/u"}, TenantID: tenant}).Err)
	assert.Zero(t, mcCall[void](m, "UpsertRevoke", mc.PutRevokeArgs{ClientID: client, Key: "golden/r", TenantID: tenant}).Err)
	batch := mcCall[[]reps](m, "BatchUpsertStart", mc.BatchPutStartArgs{ClientID: client, Keys: []string{"golden/b1", "golden/b2"}, SliceLengths: []uint64{16, 16}, Config: one, TenantID: tenant})
	require.Len(t, batch, 2)
	assert.Zero(t, batch[0].Err)
	assert.Zero(t, batch[1].Err)
	assert.Equal(t, []void{{}}, mcCall[[]void](m, "BatchUpsertEnd", mc.BatchUpsertEndArgs{ClientID: client, Metas: []mc.ObjectMeta{{Key: "golden/b1"}}, TenantID: tenant}))
	assert.Equal(t, []void{{}}, mcCall[[]void](m, "BatchUpsertRevoke", mc.BatchUpsertRevokeArgs{ClientID: client, Keys: []string{"golden/b2"}, TenantID: tenant}))
	batch = mcCall[[]reps](m, "BatchPutStart", mc.BatchPutStartArgs{ClientID: client, Keys: []string{"golden/p1", "golden/p2"}, SliceLengths: []uint64{16, 16}, Config: one, TenantID: tenant})
	require.Len(t, batch, 2)
	assert.Zero(t, batch[0].Err)
	assert.Zero(t, batch[1].Err)
	assert.Equal(t, []void{{}, {}}, mcCall[[]void](m, "BatchPutRevoke", mc.BatchPutRevokeArgs{ClientID: client, Keys: []string{"golden/p1", "golden/p2"}, TenantID: tenant}))
	byRegex := mcCall[structpack.Expected[map[string][]mc.ReplicaDescriptor]](m, "GetReplicaListByRegex", mc.KeyArgs{Key: "^golden/", TenantID: tenant})
	require.Zero(t, byRegex.Err)
	assert.ElementsMatch(t, []string{"golden/u", "golden/b1"}, slices.Collect(maps.Keys(byRegex.Value)), "the completed upserts")
	assert.Equal(t, []void{{}, {}}, mcCall[[]void](m, "BatchRemove", mc.BatchRemoveArgs{Keys: []string{"golden/u", "golden/b1"}, Force: true, TenantID: tenant}))
	assert.Zero(t, mcCall[void](m, "GracefulUnmountSegment", mc.GracefulUnmountArgs{SegmentID: seg.ID, ClientID: client}).Err)
	assert.Equal(t, structpack.OK(false), mcCall[structpack.Expected[bool]](m, "ExistKey", mc.KeyArgs{Key: "golden/u", TenantID: tenant}))
}

// TestDrainMooncakeWithoutANewLeader: when no other node promotes (here a
// lone node, its own leader), the drain waits two election timeouts for
// one, then ends once its clients are quiet, long before its bound.
func TestDrainMooncakeWithoutANewLeader(t *testing.T) {
	c := newCluster(t, 1, time.Hour, withMooncake(t))
	nd := c.nodes[c.leader()]
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	listenersOf(nd).DrainMooncake(dctx, 50*time.Millisecond)
	assert.NoError(t, dctx.Err(), "the drain ended by itself, not at its bound")
}

// TestMooncakeForwardAcrossLeaderLoss: a client of a follower keeps
// writing when the leader its calls were forwarded to stops. The follower
// still names the old leader for a while; its forwards there are not sent
// (the connection is gone), so they go again to the new leader once one is
// promoted, writes as well as reads, within the forward's deadline.
func TestMooncakeForwardAcrossLeaderLoss(t *testing.T) {
	c := newCluster(t, 3, 100*time.Millisecond, withMooncake(t))
	li := c.leader()
	fi := (li + 1) % 3
	f := dialMooncake(t, c.cfgs[fi].MooncakeAddr)
	client := mountAndPut(t, f, "before")

	c.stop(li)
	time.Sleep(100 * time.Millisecond) // the follower's forwarding connection sees the close
	require.Equal(t, c.cfgs[li].MooncakeAddr, c.nodes[fi].LeaderMooncakeAddr(), "the follower still names the old leader")

	start := time.Now()
	put := mcCall[structpack.Expected[[]mc.ReplicaDescriptor]](f, "PutStart", mc.PutStartArgs{ClientID: client, Key: "after", SliceLength: 1, Config: mc.ReplicateConfig{ReplicaNum: 1}})
	require.Zero(t, put.Err, "the PutStart went to the new leader")
	require.Zero(t, mcCall[structpack.Expected[mc.Void]](f, "PutEnd", mc.PutEndArgs{ClientID: client, Meta: mc.ObjectMeta{Key: "after"}}).Err)
	t.Logf("the put through the follower was answered %v after the leader stopped", time.Since(start).Round(time.Millisecond))
	ping := mcCall[structpack.Expected[mc.PingResponse]](f, "Ping", client)
	assert.Zero(t, ping.Err)
	for _, k := range []string{"before", "after"} {
		got := mcCall[structpack.Expected[mc.GetReplicaListResponse]](f, "GetReplicaList", mc.KeyArgs{Key: k})
		assert.Zero(t, got.Err, k)
	}
}
