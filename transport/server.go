package transport

import (
	"bufio"
	"context"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/buildinfo"
	"github.com/moonraft/moonraft/service"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// MaxBatch is the default of the most items one batch RPC may carry
	// (Limits.MaxBatch).
	MaxBatch = 10000

	// streamWorkers serve requests on goroutines that keep their stacks;
	// idle ones cost a few KiB each.
	streamWorkers = 128
)

// NewServer returns a gRPC server serving moonraft.v1.Master from d, with
// cfg's admin backend, limits, admin token and metrics hook; opts (TLS
// credentials, say) come after the defaults, so they may override them.
func NewServer(d service.Data, cfg ServerConfig, opts ...grpc.ServerOption) *grpc.Server {
	g := newGuard(cfg)
	lim := g.cfg.Limits
	opts = append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(lim.MaxMessageBytes),
		// Reused goroutines for requests: a goroutine per request grows its
		// stack anew each time (copystack was 16% of a leader's CPU under
		// 256 readers). Past this many busy workers gRPC spawns goroutines.
		grpc.NumStreamWorkers(streamWorkers),
		grpc.MaxSendMsgSize(lim.MaxMessageBytes),
		grpc.ChainUnaryInterceptor(g.unary),
		grpc.ChainStreamInterceptor(g.stream),
	}, opts...)
	a := cfg.Admin
	if a == nil {
		a = noAdmin{role: d.Progress().Role}
	}
	s := grpc.NewServer(opts...)
	moonraftpb.RegisterMasterServer(s, &server{b: d, a: a, lim: lim})
	return s
}

// server turns requests into fsm commands or service reads. Argument checks
// are the FSM's (authoritative, and the same on every node); the server only
// checks what the FSM never sees, such as the length of a batch.
type server struct {
	moonraftpb.UnimplementedMasterServer
	b   service.Data
	a   service.Admin
	lim Limits
}

func (s *server) propose(ctx context.Context, cmd fsm.Command) (fsm.Result, *moonraftpb.Status) {
	r, err := s.b.Propose(ctx, cmd)
	if err != nil {
		return r, writeStatusOf(err)
	}
	return r, statusOf(r.Err)
}

func (s *server) ExistKey(ctx context.Context, req *moonraftpb.ExistKeyRequest) (*moonraftpb.ExistKeyResponse, error) {
	return s.existKey(ctx, req.GetKey()), nil
}

func (s *server) existKey(ctx context.Context, key string) *moonraftpb.ExistKeyResponse {
	ok, g, err := s.b.ExistKey(ctx, key)
	resp := &moonraftpb.ExistKeyResponse{Status: statusOf(err)}
	if err == nil && ok {
		resp.Exists, resp.LeaseUntilMs = true, g.UntilMs
	}
	return resp
}

func (s *server) GetReplicaList(ctx context.Context, req *moonraftpb.GetReplicaListRequest) (*moonraftpb.GetReplicaListResponse, error) {
	return s.getReplicaList(ctx, req.GetKey()), nil
}

func (s *server) getReplicaList(ctx context.Context, key string) *moonraftpb.GetReplicaListResponse {
	rs, g, err := s.b.GetReplicaList(ctx, key)
	resp := &moonraftpb.GetReplicaListResponse{Status: statusOf(err)}
	if err == nil {
		resp.Replicas, resp.LeaseUntilMs = moonraftpb.ReplicasToPB(rs), g.UntilMs
	}
	return resp
}

func (s *server) BatchExistKey(ctx context.Context, req *moonraftpb.BatchExistKeyRequest) (*moonraftpb.BatchExistKeyResponse, error) {
	rs, st := s.batchRead(ctx, req.GetKeys(), s.b.BatchExistKey)
	resp := &moonraftpb.BatchExistKeyResponse{Status: st, Results: make([]*moonraftpb.ExistKeyResponse, len(rs))}
	answers := make([]moonraftpb.ExistKeyResponse, len(rs))
	for i, r := range rs {
		er := &answers[i]
		er.Status, er.Exists = itemStatus(r.Err, st), r.Found
		if r.Found {
			er.LeaseUntilMs = r.Grant.UntilMs
		}
		resp.Results[i] = er
	}
	return resp, nil
}

func (s *server) BatchGetReplicaList(ctx context.Context, req *moonraftpb.BatchGetReplicaListRequest) (*moonraftpb.BatchGetReplicaListResponse, error) {
	rs, st := s.batchRead(ctx, req.GetKeys(), s.b.BatchGetReplicaList)
	resp := &moonraftpb.BatchGetReplicaListResponse{Status: st, Results: make([]*moonraftpb.GetReplicaListResponse, len(rs))}
	answers := make([]moonraftpb.GetReplicaListResponse, len(rs))
	var descs moonraftpb.Descriptors
	for _, r := range rs {
		descs.Reserve(r.Replicas)
	}
	for i, r := range rs {
		gr := &answers[i]
		gr.Status = itemStatus(r.Err, st)
		if r.Found {
			gr.Replicas, gr.LeaseUntilMs = descs.ToPB(r.Replicas), r.Grant.UntilMs
		}
		resp.Results[i] = gr
	}
	return resp, nil
}

// batchRead checks a batch read's length and runs it as one backend read.
func (s *server) batchRead(ctx context.Context, keys []string, read func(context.Context, []string) ([]fsm.KeyRead, error)) ([]fsm.KeyRead, *moonraftpb.Status) {
	if len(keys) > s.lim.MaxBatch {
		return nil, statusOf(batchTooLong(len(keys), s.lim.MaxBatch))
	}
	if len(keys) == 0 {
		return nil, statusOf(nil)
	}
	rs, err := read(ctx, keys)
	if err != nil {
		return nil, statusOf(err)
	}
	return rs, statusOf(nil)
}

func (s *server) GetReplicaListByRegex(ctx context.Context, req *moonraftpb.GetReplicaListByRegexRequest) (*moonraftpb.GetReplicaListByRegexResponse, error) {
	if err := s.checkRegex(req.GetRegex()); err != nil {
		return &moonraftpb.GetReplicaListByRegexResponse{Status: statusOf(err)}, nil
	}
	objs, err := s.b.GetReplicaListByRegex(ctx, req.GetRegex())
	resp := &moonraftpb.GetReplicaListByRegexResponse{Status: statusOf(err)}
	for _, o := range objs {
		resp.Objects = append(resp.Objects, &moonraftpb.KeyReplicas{Key: o.Key, Replicas: moonraftpb.ReplicasToPB(o.Replicas), LeaseUntilMs: o.Grant.UntilMs})
	}
	return resp, nil
}

func (s *server) PutStart(ctx context.Context, req *moonraftpb.PutStartRequest) (*moonraftpb.PutStartResponse, error) {
	return s.putStart(ctx, req), nil
}

func (s *server) putStart(ctx context.Context, req *moonraftpb.PutStartRequest) *moonraftpb.PutStartResponse {
	r, st := s.propose(ctx, s.putStartCmd(req))
	return &moonraftpb.PutStartResponse{Status: st, Replicas: moonraftpb.ReplicasToPB(r.Replicas)}
}

func (s *server) putStartCmd(req *moonraftpb.PutStartRequest) *fsm.PutStart {
	cfg := req.GetConfig() // nil leaves replica_num 0, which the FSM refuses
	return &fsm.PutStart{
		NowMs:            s.b.Now(),
		Key:              req.GetKey(),
		SliceLengths:     req.GetSliceLengths(),
		ReplicaNum:       cfg.GetReplicaNum(),
		SoftPin:          cfg.GetWithSoftPin(),
		PreferredSegment: cfg.GetPreferredSegment(),
		ClientID:         req.GetClientId(),
	}
}

func (s *server) PutEnd(ctx context.Context, req *moonraftpb.PutEndRequest) (*moonraftpb.PutEndResponse, error) {
	_, st := s.propose(ctx, &fsm.PutEnd{NowMs: s.b.Now(), Key: req.GetKey(), ClientID: req.GetClientId()})
	return &moonraftpb.PutEndResponse{Status: st}, nil
}

func (s *server) PutRevoke(ctx context.Context, req *moonraftpb.PutRevokeRequest) (*moonraftpb.PutRevokeResponse, error) {
	_, st := s.propose(ctx, &fsm.PutRevoke{NowMs: s.b.Now(), Key: req.GetKey(), ClientID: req.GetClientId()})
	return &moonraftpb.PutRevokeResponse{Status: st}, nil
}

// proposeBatch replicates a batch RPC's writes as one log entry, applied in
// request order (two items of one key meet the FSM as the client gave
// them). It returns the top-level status and, when that is OK, the results.
func (s *server) proposeBatch(ctx context.Context, cmds []fsm.Command) (*moonraftpb.Status, []fsm.Result) {
	if len(cmds) > s.lim.MaxBatch {
		return statusOf(batchTooLong(len(cmds), s.lim.MaxBatch)), nil
	}
	if len(cmds) == 0 {
		return statusOf(nil), nil
	}
	rs, err := s.b.ProposeBatch(ctx, cmds)
	if err != nil {
		return writeStatusOf(err), nil
	}
	return statusOf(nil), rs
}

func (s *server) BatchPutStart(ctx context.Context, req *moonraftpb.BatchPutStartRequest) (*moonraftpb.BatchPutStartResponse, error) {
	return s.batchPutStart(ctx, req, func(p *fsm.PutStart) fsm.Command { return p }), nil
}

func (s *server) UpsertStart(ctx context.Context, req *moonraftpb.PutStartRequest) (*moonraftpb.PutStartResponse, error) {
	r, st := s.propose(ctx, &fsm.UpsertStart{PutStart: *s.putStartCmd(req), Copy: true})
	return &moonraftpb.PutStartResponse{Status: st, Replicas: moonraftpb.ReplicasToPB(r.Replicas)}, nil
}

// UpsertEnd and UpsertRevoke are PutEnd and PutRevoke, as in Mooncake.
func (s *server) UpsertEnd(ctx context.Context, req *moonraftpb.PutEndRequest) (*moonraftpb.PutEndResponse, error) {
	return s.PutEnd(ctx, req)
}

func (s *server) UpsertRevoke(ctx context.Context, req *moonraftpb.PutRevokeRequest) (*moonraftpb.PutRevokeResponse, error) {
	return s.PutRevoke(ctx, req)
}

func (s *server) BatchUpsertStart(ctx context.Context, req *moonraftpb.BatchPutStartRequest) (*moonraftpb.BatchPutStartResponse, error) {
	return s.batchPutStart(ctx, req, func(p *fsm.PutStart) fsm.Command { return &fsm.UpsertStart{PutStart: *p, Copy: true} }), nil
}

func (s *server) BatchUpsertEnd(ctx context.Context, req *moonraftpb.BatchPutEndRequest) (*moonraftpb.BatchPutEndResponse, error) {
	return s.BatchPutEnd(ctx, req)
}

func (s *server) BatchUpsertRevoke(ctx context.Context, req *moonraftpb.BatchPutRevokeRequest) (*moonraftpb.BatchPutRevokeResponse, error) {
	return s.BatchPutRevoke(ctx, req)
}

// batchPutStart proposes the items as one batch of as(PutStart) commands.
func (s *server) batchPutStart(ctx context.Context, req *moonraftpb.BatchPutStartRequest, as func(*fsm.PutStart) fsm.Command) *moonraftpb.BatchPutStartResponse {
	items := req.GetItems()
	cmds := make([]fsm.Command, len(items))
	for i, it := range items {
		cmds[i] = as(s.putStartCmd(it))
	}
	top, rs := s.proposeBatch(ctx, cmds)
	resp := &moonraftpb.BatchPutStartResponse{Status: top, Results: make([]*moonraftpb.PutStartResponse, len(rs))}
	answers := make([]moonraftpb.PutStartResponse, len(rs))
	var descs moonraftpb.Descriptors
	for _, r := range rs {
		descs.Reserve(r.Replicas)
	}
	for i, r := range rs {
		pr := &answers[i]
		pr.Status, pr.Replicas = itemStatus(r.Err, top), descs.ToPB(r.Replicas)
		resp.Results[i] = pr
	}
	return resp
}

func (s *server) BatchPutEnd(ctx context.Context, req *moonraftpb.BatchPutEndRequest) (*moonraftpb.BatchPutEndResponse, error) {
	top, sts := s.keysBatch(ctx, req.GetKeys(), func(k string) fsm.Command {
		return &fsm.PutEnd{NowMs: s.b.Now(), Key: k, ClientID: req.GetClientId()}
	})
	resp := &moonraftpb.BatchPutEndResponse{Status: top}
	for _, st := range sts {
		resp.Results = append(resp.Results, &moonraftpb.PutEndResponse{Status: st})
	}
	return resp, nil
}

func (s *server) BatchPutRevoke(ctx context.Context, req *moonraftpb.BatchPutRevokeRequest) (*moonraftpb.BatchPutRevokeResponse, error) {
	top, sts := s.keysBatch(ctx, req.GetKeys(), func(k string) fsm.Command {
		return &fsm.PutRevoke{NowMs: s.b.Now(), Key: k, ClientID: req.GetClientId()}
	})
	resp := &moonraftpb.BatchPutRevokeResponse{Status: top}
	for _, st := range sts {
		resp.Results = append(resp.Results, &moonraftpb.PutRevokeResponse{Status: st})
	}
	return resp, nil
}

// keysBatch proposes one command per key as one batch and returns the
// top-level status and each item's.
func (s *server) keysBatch(ctx context.Context, keys []string, cmd func(string) fsm.Command) (*moonraftpb.Status, []*moonraftpb.Status) {
	cmds := make([]fsm.Command, len(keys))
	for i, k := range keys {
		cmds[i] = cmd(k)
	}
	top, rs := s.proposeBatch(ctx, cmds)
	sts := make([]*moonraftpb.Status, len(rs))
	for i, r := range rs {
		sts[i] = itemStatus(r.Err, top)
	}
	return top, sts
}

func (s *server) Remove(ctx context.Context, req *moonraftpb.RemoveRequest) (*moonraftpb.RemoveResponse, error) {
	r, st := s.propose(ctx, &fsm.Remove{NowMs: s.b.Now(), Key: req.GetKey(), Force: req.GetForce()})
	return &moonraftpb.RemoveResponse{Status: st, Removed: r.Removed}, nil
}

func (s *server) BatchRemove(ctx context.Context, req *moonraftpb.BatchRemoveRequest) (*moonraftpb.BatchRemoveResponse, error) {
	top, sts := s.keysBatch(ctx, req.GetKeys(), func(k string) fsm.Command {
		return &fsm.Remove{NowMs: s.b.Now(), Key: k, Force: req.GetForce()}
	})
	resp := &moonraftpb.BatchRemoveResponse{Status: top}
	for _, st := range sts {
		r := &moonraftpb.RemoveResponse{Status: st}
		if isOK(st) {
			r.Removed = 1
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

func (s *server) RemoveByRegex(ctx context.Context, req *moonraftpb.RemoveByRegexRequest) (*moonraftpb.RemoveByRegexResponse, error) {
	if err := s.checkRegex(req.GetRegex()); err != nil {
		return &moonraftpb.RemoveByRegexResponse{Status: statusOf(err)}, nil
	}
	r, st := s.propose(ctx, &fsm.RemoveByRegex{NowMs: s.b.Now(), Regex: req.GetRegex(), Force: req.GetForce()})
	return &moonraftpb.RemoveByRegexResponse{Status: st, Removed: r.Removed}, nil
}

func (s *server) RemoveAll(ctx context.Context, req *moonraftpb.RemoveAllRequest) (*moonraftpb.RemoveAllResponse, error) {
	r, st := s.propose(ctx, &fsm.RemoveAll{NowMs: s.b.Now(), Force: req.GetForce()})
	return &moonraftpb.RemoveAllResponse{Status: st, Removed: r.Removed}, nil
}

func (s *server) MountSegment(ctx context.Context, req *moonraftpb.MountSegmentRequest) (*moonraftpb.MountSegmentResponse, error) {
	_, st := s.propose(ctx, &fsm.MountSegment{NowMs: s.b.Now(), ClientID: req.GetClientId(), Segment: moonraftpb.SegmentFromPB(req.GetSegment())})
	return &moonraftpb.MountSegmentResponse{Status: st}, nil
}

func (s *server) ReMountSegment(ctx context.Context, req *moonraftpb.ReMountSegmentRequest) (*moonraftpb.ReMountSegmentResponse, error) {
	segs := make([]fsm.SegmentSpec, len(req.GetSegments()))
	for i, sg := range req.GetSegments() {
		segs[i] = moonraftpb.SegmentFromPB(sg)
	}
	_, st := s.propose(ctx, &fsm.RemountSegments{NowMs: s.b.Now(), ClientID: req.GetClientId(), Segments: segs})
	return &moonraftpb.ReMountSegmentResponse{Status: st}, nil
}

func (s *server) UnmountSegment(ctx context.Context, req *moonraftpb.UnmountSegmentRequest) (*moonraftpb.UnmountSegmentResponse, error) {
	_, st := s.propose(ctx, &fsm.UnmountSegment{NowMs: s.b.Now(), ClientID: req.GetClientId(), SegmentID: req.GetSegmentId()})
	return &moonraftpb.UnmountSegmentResponse{Status: st}, nil
}

func (s *server) GracefulUnmountSegment(ctx context.Context, req *moonraftpb.GracefulUnmountSegmentRequest) (*moonraftpb.UnmountSegmentResponse, error) {
	_, st := s.propose(ctx, &fsm.GracefulUnmount{NowMs: s.b.Now(), ClientID: req.GetClientId(), SegmentID: req.GetSegmentId(), GraceMs: req.GetGracePeriodMs()})
	return &moonraftpb.UnmountSegmentResponse{Status: st}, nil
}

func (s *server) QuerySegmentStatus(ctx context.Context, req *moonraftpb.QuerySegmentStatusRequest) (*moonraftpb.QuerySegmentStatusResponse, error) {
	name, id := req.GetSegmentName(), req.GetSegmentId()
	if (name == "") == (id == "") {
		return &moonraftpb.QuerySegmentStatusResponse{Status: statusOf(errcode.New(errcode.InvalidParams,
			"name the segment by exactly one of segment_name and segment_id"))}, nil
	}
	sts, err := s.b.SegmentStatus(ctx, name+id, name != "")
	if err != nil {
		return &moonraftpb.QuerySegmentStatusResponse{Status: statusOf(err)}, nil
	}
	return &moonraftpb.QuerySegmentStatusResponse{Status: statusOf(nil), Segment: segmentStateToPB(sts[0])}, nil
}

func (s *server) ListSegments(ctx context.Context, _ *moonraftpb.ListSegmentsRequest) (*moonraftpb.ListSegmentsResponse, error) {
	sts, err := s.b.SegmentStatus(ctx, "", false)
	resp := &moonraftpb.ListSegmentsResponse{Status: statusOf(err)}
	for _, st := range sts {
		resp.Segments = append(resp.Segments, segmentStateToPB(st))
	}
	return resp, nil
}

func (s *server) ServiceReady(context.Context, *moonraftpb.ServiceReadyRequest) (*moonraftpb.ServiceReadyResponse, error) {
	return &moonraftpb.ServiceReadyResponse{Status: statusOf(nil), Version: buildinfo.Version()}, nil
}

func (s *server) Ping(ctx context.Context, req *moonraftpb.PingRequest) (*moonraftpb.PingResponse, error) {
	need, err := s.b.Ping(ctx, req.GetClientId())
	resp := &moonraftpb.PingResponse{Status: statusOf(err)}
	if err == nil {
		resp.ClientStatus, resp.TtlMs = moonraftpb.ClientStatus_CLIENT_STATUS_OK, s.b.ClientTTLMs()
		resp.ViewVersion = s.b.ViewVersion()
		if need {
			resp.ClientStatus = moonraftpb.ClientStatus_CLIENT_STATUS_NEED_REMOUNT
		}
	}
	return resp, nil
}

func (s *server) Status(_ context.Context, req *moonraftpb.StatusRequest) (*moonraftpb.StatusResponse, error) {
	if req.GetSkipDigests() {
		return &moonraftpb.StatusResponse{Status: statusOf(nil), Node: NodeStatusPB(s.b.Progress())}, nil
	}
	return &moonraftpb.StatusResponse{Status: statusOf(nil), Node: NodeStatusPB(s.b.Status())}, nil
}

func (s *server) Members(ctx context.Context, _ *moonraftpb.MembersRequest) (*moonraftpb.MembersResponse, error) {
	ms, err := s.a.Members(ctx)
	return &moonraftpb.MembersResponse{Status: statusOf(err), Members: membersPB(ms)}, nil
}

func (s *server) AddVoter(ctx context.Context, req *moonraftpb.AddVoterRequest) (*moonraftpb.AddVoterResponse, error) {
	return &moonraftpb.AddVoterResponse{Status: statusOf(s.a.AddVoter(ctx, req.GetId(), req.GetRaftAddr(), req.GetGrpcAddr()))}, nil
}

func (s *server) RemoveServer(ctx context.Context, req *moonraftpb.RemoveServerRequest) (*moonraftpb.RemoveServerResponse, error) {
	return &moonraftpb.RemoveServerResponse{Status: statusOf(s.a.RemoveServer(ctx, req.GetId()))}, nil
}

func (s *server) TransferLeadership(ctx context.Context, req *moonraftpb.TransferLeadershipRequest) (*moonraftpb.TransferLeadershipResponse, error) {
	return &moonraftpb.TransferLeadershipResponse{Status: statusOf(s.a.TransferLeadership(ctx, req.GetId()))}, nil
}

func (s *server) SnapshotSave(_ *moonraftpb.SnapshotSaveRequest, stream moonraftpb.Master_SnapshotSaveServer) error {
	// bufio gathers the backend's small writes into chunks of up to
	// moonraftpb.SnapshotChunkBytes; chunkWriter splits the large ones bufio passes on.
	bw := bufio.NewWriterSize(chunkWriter{stream}, moonraftpb.SnapshotChunkBytes)
	err := s.a.SnapshotSave(stream.Context(), bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return grpcError(statusOf(err))
	}
	return nil
}

func (s *server) SnapshotRestore(stream moonraftpb.Master_SnapshotRestoreServer) error {
	err := s.a.SnapshotRestore(stream.Context(), &chunkReader{stream: stream})
	var st *moonraftpb.Status
	if err != nil {
		st = writeStatusOf(err)
	} else {
		st = statusOf(nil)
	}
	return stream.SendAndClose(&moonraftpb.SnapshotRestoreResponse{Status: st})
}

// grpcError is the stream error of a failed SnapshotSave: a gRPC code for
// generic clients, and the Status in its details for ours.
func grpcError(st *moonraftpb.Status) error {
	c := codes.Internal
	switch errcode.Code(st.GetCode()) {
	case errcode.NotLeader:
		c = codes.FailedPrecondition
	case errcode.UnavailableInCurrentStatus:
		c = codes.Unavailable
	case errcode.PermissionDenied:
		c = codes.PermissionDenied
	case errcode.TooManyRequests:
		c = codes.ResourceExhausted
	case errcode.InvalidParams, errcode.InvalidKey:
		c = codes.InvalidArgument
	}
	gs := status.New(c, st.GetName()+": "+st.GetMessage())
	if d, err := gs.WithDetails(st); err == nil {
		gs = d
	}
	return gs.Err()
}

type chunkWriter struct {
	stream moonraftpb.Master_SnapshotSaveServer
}

// Write sends p in chunks of at most moonraftpb.SnapshotChunkBytes. Send marshals
// before it returns, so the caller may reuse p.
func (w chunkWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), moonraftpb.SnapshotChunkBytes)
		if err := w.stream.Send(&moonraftpb.SnapshotChunk{Data: p[:c]}); err != nil {
			return n, err
		}
		n, p = n+c, p[c:]
	}
	return n, nil
}

// chunkReader reads the data of a client stream of chunks; io.EOF once the
// client has closed it.
type chunkReader struct {
	stream moonraftpb.Master_SnapshotRestoreServer
	buf    []byte
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		c, err := r.stream.Recv()
		if err != nil {
			return 0, err
		}
		r.buf = c.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func batchTooLong(n, limit int) error {
	return errcode.New(errcode.InvalidParams, "batch of %d items, the limit is %d", n, limit)
}

// checkRegex refuses a regex over the server's length limit before it
// reaches the FSM (whose own limit, fsm.MaxRegexLen, is the upper bound).
func (s *server) checkRegex(re string) error {
	if len(re) > s.lim.MaxRegexLen {
		return errcode.New(errcode.InvalidParams, "regex is %d bytes, the limit is %d", len(re), s.lim.MaxRegexLen)
	}
	return nil
}

func isOK(st *moonraftpb.Status) bool { return st.GetCode() == int32(errcode.OK) }
