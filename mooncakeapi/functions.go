package mooncakeapi

import (
	"crypto/md5"
	"encoding/binary"
	"reflect"
)

// Argument tuples of the functions with more than one argument (a single
// argument goes as itself, none as an empty body).
type (
	KeyArgs struct {
		Key, TenantID string
	}
	KeysArgs struct {
		Keys     []string
		TenantID string
	}
	MountArgs struct {
		Segment  Segment
		ClientID UUID
	}
	ReMountArgs struct {
		Segments []Segment
		ClientID UUID
	}
	UnmountArgs         struct{ SegmentID, ClientID UUID }
	GracefulUnmountArgs struct {
		SegmentID, ClientID UUID
		GracePeriodMs       uint64
	}
	FetchTasksArgs struct {
		ClientID  UUID
		BatchSize uint64
	}
	PutStartArgs struct {
		ClientID    UUID
		Key         string
		SliceLength uint64
		Config      ReplicateConfig
		TenantID    string
	}
	PutEndArgs struct {
		ClientID    UUID
		Meta        ObjectMeta
		ReplicaType int32
		TenantID    string
	}
	PutRevokeArgs struct {
		ClientID    UUID
		Key         string
		ReplicaType int32
		TenantID    string
	}
	BatchPutStartArgs struct {
		ClientID     UUID
		Keys         []string
		SliceLengths []uint64
		Config       ReplicateConfig
		TenantID     string
	}
	BatchPutEndArgs struct {
		ClientID    UUID
		Metas       []ObjectMeta
		ReplicaType int32
		TenantID    string
	}
	BatchPutRevokeArgs struct {
		ClientID    UUID
		Keys        []string
		ReplicaType int32
		TenantID    string
	}
	BatchUpsertEndArgs struct {
		ClientID UUID
		Metas    []ObjectMeta
		TenantID string
	}
	BatchUpsertRevokeArgs struct {
		ClientID UUID
		Keys     []string
		TenantID string
	}
	RemoveArgs struct {
		Key      string
		Force    bool
		TenantID string
	}
	RemoveAllArgs struct {
		Force    bool
		TenantID string
	}
	BatchRemoveArgs struct {
		Keys     []string
		Force    bool
		TenantID string
	}
)

// Function is one RPC of the master: its name, its coro_rpc id, and the Go
// types of its arguments (nil: none) and result.
type Function struct {
	Name   string
	ID     uint32
	Args   reflect.Type
	Result reflect.Type
}

type (
	replicas      = []ReplicaDescriptor
	replicasByKey = map[string][]ReplicaDescriptor
)

// FunctionName is the name of the function with coro_rpc id id, "unknown"
// for one moonraft does not serve.
func FunctionName(id uint32) string {
	if f, ok := Functions[id]; ok {
		return f.Name
	}
	return "unknown"
}

// Functions lists the functions moonraft serves, by id.
var Functions = index(
	fn[Void, Expected[string]]("ServiceReady"),
	fn[Void, Expected[GetStorageConfigResponse]]("GetStorageConfig"),
	fn[Void, Expected[string]]("GetFsdir"),
	fn[MountArgs, Expected[Void]]("MountSegment"),
	fn[ReMountArgs, Expected[Void]]("ReMountSegment"),
	fn[UnmountArgs, Expected[Void]]("UnmountSegment"),
	fn[GracefulUnmountArgs, Expected[Void]]("GracefulUnmountSegment"),
	fn[UUID, Expected[PingResponse]]("Ping"),
	fn[FetchTasksArgs, Expected[[]TaskAssignment]]("FetchTasks"),
	fn[KeyArgs, Expected[bool]]("ExistKey"),
	fn[KeysArgs, []Expected[bool]]("BatchExistKey"),
	fn[KeyArgs, Expected[GetReplicaListResponse]]("GetReplicaList"),
	fn[KeysArgs, []Expected[GetReplicaListResponse]]("BatchGetReplicaList"),
	fn[KeyArgs, Expected[replicasByKey]]("GetReplicaListByRegex"),
	fn[PutStartArgs, Expected[replicas]]("PutStart"),
	fn[PutEndArgs, Expected[Void]]("PutEnd"),
	fn[PutRevokeArgs, Expected[Void]]("PutRevoke"),
	fn[BatchPutStartArgs, []Expected[replicas]]("BatchPutStart"),
	fn[BatchPutEndArgs, []Expected[Void]]("BatchPutEnd"),
	fn[BatchPutRevokeArgs, []Expected[Void]]("BatchPutRevoke"),
	fn[PutStartArgs, Expected[replicas]]("UpsertStart"),
	fn[PutEndArgs, Expected[Void]]("UpsertEnd"),
	fn[PutRevokeArgs, Expected[Void]]("UpsertRevoke"),
	fn[BatchPutStartArgs, []Expected[replicas]]("BatchUpsertStart"),
	fn[BatchUpsertEndArgs, []Expected[Void]]("BatchUpsertEnd"),
	fn[BatchUpsertRevokeArgs, []Expected[Void]]("BatchUpsertRevoke"),
	fn[RemoveArgs, Expected[Void]]("Remove"),
	fn[RemoveArgs, Expected[int64]]("RemoveByRegex"),
	fn[RemoveAllArgs, int64]("RemoveAll"),
	fn[BatchRemoveArgs, []Expected[Void]]("BatchRemove"),
)

func fn[A, R any](name string) Function {
	f := Function{Name: name, ID: FunctionID(name), Result: reflect.TypeFor[R]()}
	if a := reflect.TypeFor[A](); a != reflect.TypeFor[Void]() {
		f.Args = a
	}
	return f
}

func index(fs ...Function) map[uint32]Function {
	m := make(map[uint32]Function, len(fs))
	for _, f := range fs {
		m[f.ID] = f
	}
	return m
}

// FunctionID is coro_rpc's id of a WrappedMasterService member function:
// the first four bytes of the MD5 of its qualified name, big-endian.
func FunctionID(name string) uint32 {
	h := md5.Sum([]byte("mooncake::WrappedMasterService::" + name))
	return binary.BigEndian.Uint32(h[:4])
}
