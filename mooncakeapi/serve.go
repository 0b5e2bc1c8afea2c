package mooncakeapi

import (
	"context"
	"fmt"
	"reflect"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/service"
	"github.com/moonraft/moonraft/structpack"
)

// StoreVersion is what ServiceReady answers. A Mooncake client compares it
// with its own version and refuses a master that differs
// (master_client.cpp): this release's clients say "2.0.0".
const StoreVersion = "2.0.0"

// DefaultTenant is the only tenant moonraft serves: it has one key space.
const DefaultTenant = "default"

// Handler serves the Mooncake master's functions on a backend, the same
// one moonraft's gRPC API uses: each call maps onto the FSM command of its
// gRPC twin.
type Handler struct {
	b       service.Data
	log     cororpc.Logger
	leaseMs uint64
	table   map[uint32]method
}

type method func(ctx context.Context, body, dst []byte) ([]byte, cororpc.Errc, string)

// NewHandler returns a handler for b; leaseTTLMs is what GetReplicaList
// reports as lease_ttl_ms.
func NewHandler(b service.Data, log cororpc.Logger, leaseTTLMs uint64) *Handler {
	h := &Handler{b: b, log: log, leaseMs: leaseTTLMs, table: map[uint32]method{}}
	h.register()
	return h
}

// Call implements cororpc.Handler.
func (h *Handler) Call(ctx context.Context, id uint32, body, dst []byte) ([]byte, cororpc.Errc, string) {
	m, ok := h.table[id]
	if !ok {
		h.log.Warn("mooncake protocol: call of a function this release does not serve", "function_id", fmt.Sprintf("%08x", id))
		return dst, cororpc.ErrcFunctionNotRegistered, "the rpc function not registered"
	}
	return m(ctx, body, dst)
}

// keyReads are the reads of given keys: answered from the leader's memory
// under its read lease (or after one quorum round when it has lapsed).
var keyReads = map[uint32]bool{
	FunctionID("GetReplicaList"): true, FunctionID("BatchGetReplicaList"): true,
	FunctionID("ExistKey"): true, FunctionID("BatchExistKey"): true,
}

// repeatable are the calls that change nothing a client could tell from
// running them twice: the reads and Ping.
var repeatable = map[uint32]bool{
	FunctionID("ServiceReady"): true, FunctionID("GetStorageConfig"): true, FunctionID("GetFsdir"): true,
	FunctionID("FetchTasks"): true, FunctionID("Ping"): true, FunctionID("GetReplicaListByRegex"): true,
}

// Repeatable reports whether the call id may run twice: a front whose
// node lost its leadership while running one may ask the new leader again.
func Repeatable(id uint32) bool { return keyReads[id] || repeatable[id] }

// pingID is Ping's function id.
var pingID = FunctionID("Ping")

// CallInline implements cororpc.Inliner: the key reads and Ping are quick
// where they are answered, on the leader, unless they would wait (for a
// lease round, for a leader, or for a removal of the key in flight). A
// Ping answered inline also needs no worker goroutine on its connection.
func (h *Handler) CallInline(ctx context.Context, id uint32, body, dst []byte) ([]byte, cororpc.Errc, string, bool) {
	if !keyReads[id] && id != pingID {
		return dst, 0, "", false
	}
	nctx := service.NoWait(ctx)
	out, errc, msg := h.Call(nctx, id, body, dst)
	if nctx.Waited() {
		return dst, 0, "", false
	}
	return out, errc, msg, true
}

// serve registers f as the function name, after checking its Go types are
// the ones the protocol table says.
func serve[A, R any](h *Handler, name string, f func(ctx context.Context, a A) R) {
	fn := Functions[FunctionID(name)]
	args := reflect.TypeFor[A]()
	if fn.Name != name || fn.Result != reflect.TypeFor[R]() || (fn.Args != args && !(fn.Args == nil && args == reflect.TypeFor[Void]())) {
		panic("mooncakeapi: " + name + " served with types other than its table entry") // a programming error, caught by every test
	}
	// The codecs are resolved once: a call then costs no layout look-up,
	// and the answer is encoded in place, not boxed and copied.
	argsCodec, err := structpack.CodecOf[A]()
	if err != nil {
		panic("mooncakeapi: " + name + "'s arguments have no encoding: " + err.Error())
	}
	resultCodec, err := structpack.CodecOf[R]()
	if err != nil {
		panic("mooncakeapi: " + name + "'s result has no encoding: " + err.Error())
	}
	h.table[fn.ID] = func(ctx context.Context, body, dst []byte) ([]byte, cororpc.Errc, string) {
		var a A
		if fn.Args != nil {
			if err := argsCodec.Unmarshal(body, &a); err != nil {
				h.log.Warn("mooncake protocol: undecodable arguments", "function", name, "error", err)
				return dst, cororpc.ErrcInvalidArguments, "invalid rpc arg"
			}
		} else if len(body) != 0 {
			return dst, cororpc.ErrcInvalidArguments, "invalid rpc arg"
		}
		r := f(ctx, a)
		out, err := resultCodec.Append(dst, &r)
		if err != nil {
			h.log.Error("mooncake protocol: unencodable result", "function", name, "error", err)
			return dst, cororpc.ErrcRPCThrowException, err.Error()
		}
		return out, cororpc.ErrcOK, ""
	}
}

// ID strings: moonraft's client and segment ids for Mooncake's UUIDs.
// codeOf is the Mooncake error code for err. moonraft's own codes, which a
// Mooncake client does not know, become the nearest of Mooncake's.
func codeOf(err error) structpack.ErrorCode {
	switch c := errcode.Of(err); c {
	case errcode.NotLeader, errcode.TooManyRequests:
		return structpack.ErrorCode(errcode.UnavailableInCurrentStatus)
	case errcode.OutcomeUnknown:
		return structpack.ErrorCode(errcode.InternalError)
	case errcode.PermissionDenied:
		return structpack.ErrorCode(errcode.IllegalClient)
	default:
		return structpack.ErrorCode(c)
	}
}

func fail[T any](err error) Expected[T] { return structpack.Fail[T](codeOf(err)) }

func tenantErr(tenant string) error {
	if tenant == "" || tenant == DefaultTenant {
		return nil
	}
	return errcode.New(errcode.InvalidParams, "tenant %q: moonraft serves the default tenant only", tenant)
}

// done turns a proposal's outcome into an Expected[Void].
func done(r fsm.Result, err error) Expected[Void] {
	if err == nil {
		err = r.Err
	}
	if err != nil {
		return fail[Void](err)
	}
	return Expected[Void]{}
}

// replicasOf converts moonraft's descriptors: a Mooncake memory replica is
// one buffer, so an object written in several slices (through gRPC) cannot
// be described to a Mooncake client.
func replicasOf(rs []oplog.ReplicaDesc) ([]ReplicaDescriptor, error) {
	return appendReplicas(make([]ReplicaDescriptor, 0, len(rs)), rs)
}

// appendReplicas appends the descriptors of rs to dst.
func appendReplicas(dst []ReplicaDescriptor, rs []oplog.ReplicaDesc) ([]ReplicaDescriptor, error) {
	for i, r := range rs {
		if len(r.Buffers) != 1 {
			return dst, errcode.New(errcode.InvalidRead, "the object is in %d slices; a Mooncake client reads objects of one", len(r.Buffers))
		}
		b := r.Buffers[0]
		status := ReplicaComplete
		if r.Status != oplog.ReplicaComplete {
			status = ReplicaProcessing
		}
		protocol := b.Protocol
		if protocol == "" {
			protocol = defaultProtocol
		}
		dst = append(dst, ReplicaDescriptor{ID: uint64(i + 1), Status: status,
			Descriptor: Memory(BufferDescriptor{Size: b.Size, BufferAddress: b.Address, Protocol: protocol, TransportEndpoint: b.Endpoint})})
	}
	return dst, nil
}

// defaultProtocol is the transfer protocol a buffer's descriptor names when
// its segment was mounted without one (master_bench mounts so): the C++
// master's buffers say "tcp" unless told otherwise (types.h
// DEFAULT_PROTOCOL), and a client ranking replicas by protocol takes an
// empty one for an unknown, least preferred one.
const defaultProtocol = "tcp"

func expectedReplicas(rs []oplog.ReplicaDesc, err error) Expected[[]ReplicaDescriptor] {
	if err != nil {
		return fail[[]ReplicaDescriptor](err)
	}
	out, err := replicasOf(rs)
	if err != nil {
		return fail[[]ReplicaDescriptor](err)
	}
	return structpack.OK(out)
}

func (h *Handler) segment(s Segment) fsm.SegmentSpec {
	return fsm.SegmentSpec{ID: s.ID.String(), Name: s.Name, Base: s.Base, Size: s.Size, Endpoint: s.TEEndpoint, Protocol: s.Protocol}
}

func (h *Handler) putStart(a PutStartArgs) fsm.PutStart {
	pref := a.Config.PreferredSegment
	if pref == "" && len(a.Config.PreferredSegments) > 0 {
		pref = a.Config.PreferredSegments[0]
	}
	return fsm.PutStart{NowMs: h.b.Now(), Key: a.Key, SliceLengths: []uint64{a.SliceLength}, ReplicaNum: uint32(min(a.Config.ReplicaNum, fsm.MaxReplicas+1)),
		SoftPin: a.Config.SoftPinAction == softPinEnable, PreferredSegment: pref, ClientID: a.ClientID.String()}
}

// softPinEnable is SoftPinAction::ENABLE (replica.h).
const softPinEnable = 1

func errInvalid(format string, args ...any) error {
	return errcode.New(errcode.InvalidParams, format, args...)
}

// batch proposes cmds as one entry, after the tenant check.
func (h *Handler) batch(ctx context.Context, tenant string, cmds []fsm.Command) ([]fsm.Result, error) {
	if err := tenantErr(tenant); err != nil {
		return nil, err
	}
	if len(cmds) == 0 {
		return nil, nil
	}
	return h.b.ProposeBatch(ctx, cmds)
}

// voids proposes cmds as one entry and answers each.
func (h *Handler) voids(ctx context.Context, tenant string, cmds []fsm.Command) []Expected[Void] {
	rs, err := h.batch(ctx, tenant, cmds)
	out := make([]Expected[Void], len(cmds))
	for i := range out {
		if err != nil {
			out[i] = fail[Void](err)
			continue
		}
		out[i] = done(rs[i], nil)
	}
	return out
}

func (h *Handler) batchRead(ctx context.Context, a KeysArgs, read func(context.Context, []string) ([]fsm.KeyRead, error)) ([]fsm.KeyRead, error) {
	if err := tenantErr(a.TenantID); err != nil {
		return nil, err
	}
	return read(ctx, a.Keys)
}

func (h *Handler) replicaList(rs []oplog.ReplicaDesc, err error) Expected[GetReplicaListResponse] {
	a, _ := h.replicaListIn(make([]ReplicaDescriptor, 0, len(rs)), rs, err)
	return a
}

// replicaListIn is replicaList with the descriptors appended to slab, which
// it returns grown: a batch's answers share one allocation.
func (h *Handler) replicaListIn(slab []ReplicaDescriptor, rs []oplog.ReplicaDesc, err error) (Expected[GetReplicaListResponse], []ReplicaDescriptor) {
	if err != nil {
		return fail[GetReplicaListResponse](err), slab
	}
	start := len(slab)
	grown, err := appendReplicas(slab, rs)
	if err != nil {
		return fail[GetReplicaListResponse](err), slab
	}
	return structpack.OK(GetReplicaListResponse{Replicas: grown[start:len(grown):len(grown)], LeaseTTLMs: h.leaseMs}), grown
}
