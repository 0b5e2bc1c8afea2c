// Package mooncakeapi is the Mooncake front: the Mooncake master's RPC
// messages of release 0.3.12.post1 (kvcache-ai/Mooncake 3b5a594:
// mooncake-store/include/ rpc_service.h, rpc_types.h, types.h, replica.h,
// allocator.h) as Go types for structpack, the table of its functions
// (coro_rpc id, arguments, result), their mapping onto the service
// contract (Handler), and the Front that answers on the leader and
// forwards from followers. Field order and types follow the C++
// declarations exactly: the type hash struct_pack sends is computed from
// them.
package mooncakeapi

import (
	"encoding/binary"
	"fmt"
	"reflect"

	"github.com/moonraft/moonraft/structpack"
)

// UUID is std::pair<uint64_t, uint64_t>, copied as its C layout.
type UUID struct{ First, Second uint64 }

func (UUID) StructPackTrivial() {}

// String is the id moonraft keeps for u: a client's or a segment's.
func (u UUID) String() string { return fmt.Sprintf("%016x-%016x", u.First, u.Second) }

// Segment is a client's mounted memory (types.h).
type Segment struct {
	ID         UUID
	Name       string
	Base       uint64
	Size       uint64
	TEEndpoint string // the transfer engine's ip:port
	Protocol   string
	HostID     string
}

// ObjectMeta names an object at PutEnd (rpc_types.h).
type ObjectMeta struct {
	Key            string
	ObjectChecksum *uint64
}

// ReplicateConfig is replica.h's ReplicateConfig.
type ReplicateConfig struct {
	ReplicaNum            uint64
	NoFReplicaNum         uint64
	DFSReplicaNum         uint64
	SoftPinAction         uint8 // enum class : uint8_t
	SoftPinTTLMs          *uint64
	WithHardPin           bool
	PreferredSegments     []string
	PreferredSegment      string
	PreferredNoFSegments  []string
	PreferAllocInSameNode bool
	DataType              uint8 // ObjectDataType, enum class : uint8_t
	HostID                string
	GroupIDs              *[]string
}

// BufferDescriptor is AllocatedBuffer::Descriptor (allocator.h).
type BufferDescriptor struct {
	Size              uint64
	BufferAddress     uint64
	Protocol          string
	TransportEndpoint string
}

// MemoryDescriptor and the other alternatives of a replica's descriptor.
type (
	MemoryDescriptor struct{ Buffer BufferDescriptor }
	NoFDescriptor    struct{ Buffer BufferDescriptor }
	DiskDescriptor   struct {
		FilePath   string
		ObjectSize uint64
	}
	LocalDiskDescriptor struct {
		ClientID          UUID
		ObjectSize        uint64
		TransportEndpoint string
	}
	DistributedFSDescriptor struct {
		FilePath    string
		Offset      uint64
		ObjectSize  uint64
		AlignedSize uint64
		ShardIdx    int32
	}
)

// DescriptorVariant is Replica::Descriptor's std::variant. A memory
// replica, nearly every one, is held unboxed: a read's answer allocates
// none for it.
type DescriptorVariant struct {
	index int
	mem   MemoryDescriptor // alternative 0, when isMem
	isMem bool
	value any // the other alternatives
}

func (v *DescriptorVariant) Alternatives() []reflect.Type {
	return []reflect.Type{
		reflect.TypeFor[MemoryDescriptor](), reflect.TypeFor[NoFDescriptor](), reflect.TypeFor[DiskDescriptor](),
		reflect.TypeFor[LocalDiskDescriptor](), reflect.TypeFor[DistributedFSDescriptor](),
	}
}
func (v *DescriptorVariant) Index() int { return v.index }

func (v *DescriptorVariant) Value() any {
	if v.isMem {
		return v.mem
	}
	return v.value
}

func (v *DescriptorVariant) Set(i int, x any) {
	if m, ok := x.(MemoryDescriptor); ok && i == 0 {
		*v = Memory(m.Buffer)
		return
	}
	*v = DescriptorVariant{index: i, value: x}
}

// Memory returns a variant holding a memory replica's buffer.
func Memory(b BufferDescriptor) DescriptorVariant {
	return DescriptorVariant{index: 0, mem: MemoryDescriptor{Buffer: b}, isMem: true}
}

// ReplicaStatus values (replica.h).
const (
	ReplicaUndefined  int32 = 0
	ReplicaProcessing int32 = 2
	ReplicaComplete   int32 = 3
)

// ReplicaDescriptor is Replica::Descriptor.
type ReplicaDescriptor struct {
	ID         uint64
	Descriptor DescriptorVariant
	Status     int32
}

// GetReplicaListResponse (rpc_types.h).
type GetReplicaListResponse struct {
	Replicas       []ReplicaDescriptor
	LeaseTTLMs     uint64
	ObjectChecksum *uint64
}

// A read's answer is encoded by hand (structpack.Packer) when its replicas
// are all in memory, the answer of nearly every read: the reflection walk
// took 0.6 µs a key at BatchGet.

// PackMaxLen is part of structpack.Packer.
func (r *GetReplicaListResponse) PackMaxLen() (int, bool) {
	n := len(r.Replicas)
	for i := range r.Replicas {
		m, ok := r.Replicas[i].memory()
		if !ok {
			return 0, false
		}
		n = max(n, len(m.Buffer.Protocol), len(m.Buffer.TransportEndpoint))
	}
	return n, true
}

// AppendPack is part of structpack.Packer.
func (r *GetReplicaListResponse) AppendPack(b []byte, width int) ([]byte, bool) {
	start := len(b)
	b = structpack.AppendLength(b, width, len(r.Replicas))
	for i := range r.Replicas {
		rep := &r.Replicas[i]
		m, ok := rep.memory()
		if !ok {
			return b[:start], false
		}
		b = binary.LittleEndian.AppendUint64(b, rep.ID)
		b = append(b, 0) // the variant's alternative: MemoryDescriptor
		b = binary.LittleEndian.AppendUint64(b, m.Buffer.Size)
		b = binary.LittleEndian.AppendUint64(b, m.Buffer.BufferAddress)
		b = append(structpack.AppendLength(b, width, len(m.Buffer.Protocol)), m.Buffer.Protocol...)
		b = append(structpack.AppendLength(b, width, len(m.Buffer.TransportEndpoint)), m.Buffer.TransportEndpoint...)
		b = binary.LittleEndian.AppendUint32(b, uint32(rep.Status))
	}
	b = binary.LittleEndian.AppendUint64(b, r.LeaseTTLMs)
	if r.ObjectChecksum == nil {
		return append(b, 0), true
	}
	return binary.LittleEndian.AppendUint64(append(b, 1), *r.ObjectChecksum), true
}

func (r *ReplicaDescriptor) memory() (*MemoryDescriptor, bool) {
	return &r.Descriptor.mem, r.Descriptor.isMem
}

// PingResponse (rpc_types.h); ClientStatus: 0 undefined, 1 OK, 2 NEED_REMOUNT.
type PingResponse struct {
	ViewVersionID int64
	ClientStatus  int32
}

// Client statuses (types.h).
const (
	ClientOK          int32 = 1
	ClientNeedRemount int32 = 2
)

// GetStorageConfigResponse (rpc_types.h).
type GetStorageConfigResponse struct {
	FSDir              string
	EnableDiskEviction bool
	QuotaBytes         uint64
}

// TaskAssignment is what FetchTasks hands a client (rpc_types.h).
type TaskAssignment struct {
	ID               UUID
	Type             int32
	Payload          string
	CreatedAtMsEpoch int64
	MaxRetryAttempts uint32
}

// Expected is tl::expected<T, ErrorCode>.
type Expected[T any] = structpack.Expected[T]

// Void is the void of tl::expected<void, ErrorCode>.
type Void = structpack.Void
