package oplog

import (
	"math"
	"strconv"
	"unsafe"
)

// Replica statuses as they appear in ReplicaDesc.Status.
const (
	ReplicaProcessing = "PROCESSING"
	ReplicaComplete   = "COMPLETE"
)

// BufferDesc is where one slice of a replica lives.
type BufferDesc struct {
	SegmentID   string `json:"segment_id"`
	SegmentName string `json:"segment_name"`
	Address     uint64 `json:"buffer_address"` // segment base + offset, what a client uses for RDMA/TCP
	Size        uint64 `json:"size"`
	// The segment's transfer-engine endpoint and protocol, for the
	// descriptors of the Mooncake protocol: answers only, never in the
	// OpLog (a follower resolves them from its own segments).
	Endpoint string `json:"-"`
	Protocol string `json:"-"`
}

// ReplicaDesc is one replica of an object.
type ReplicaDesc struct {
	Status  string       `json:"status"`  // ReplicaComplete or ReplicaProcessing
	Buffers []BufferDesc `json:"buffers"` // one per slice, in slice order
}

// PutEndPayload is the payload of a PUT_END entry: the object's size and
// where its replicas are.
type PutEndPayload struct {
	Size     uint64        `json:"size"`
	Replicas []ReplicaDesc `json:"replicas"`
}

// EncodePutEndPayload returns the payload's JSON, in struct field order and
// deterministic like Encode. Nil slices are written as [], so that nil and
// empty encode alike.
func EncodePutEndPayload(p PutEndPayload) string {
	n := 32
	for _, r := range p.Replicas {
		n += 32
		for _, b := range r.Buffers {
			n += 96 + len(b.SegmentID) + len(b.SegmentName)
		}
	}
	b := AppendPutEndPayload(make([]byte, 0, n), p)
	// The buffer is never touched again, so it can become the string
	// without a copy (as strings.Builder does).
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// AppendPutEndPayload appends the payload's JSON (as EncodePutEndPayload)
// to dst.
func AppendPutEndPayload(dst []byte, p PutEndPayload) []byte {
	dst = append(dst, `{"size":`...)
	dst = strconv.AppendUint(dst, p.Size, 10)
	dst = append(dst, `,"replicas":[`...)
	for i, r := range p.Replicas {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"status":`...)
		dst = appendString(dst, r.Status)
		dst = append(dst, `,"buffers":[`...)
		for j, b := range r.Buffers {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"segment_id":`...)
			dst = appendString(dst, b.SegmentID)
			dst = append(dst, `,"segment_name":`...)
			dst = appendString(dst, b.SegmentName)
			dst = append(dst, `,"buffer_address":`...)
			dst = strconv.AppendUint(dst, b.Address, 10)
			dst = append(dst, `,"size":`...)
			dst = strconv.AppendUint(dst, b.Size, 10)
			dst = append(dst, '}')
		}
		dst = append(dst, "]}"...)
	}
	return append(dst, "]}"...)
}

// DecodePutEndPayload parses a payload strictly, like Decode: every field
// exactly once, unknown fields ignored, a status of ReplicaComplete or
// ReplicaProcessing. Empty arrays decode as nil slices. It does not check
// that the buffers add up to the size; that is the FSM's rule, not the
// format's. Errors are errcode.InvalidParams.
func DecodePutEndPayload(s string) (PutEndPayload, error) {
	d := decoder{b: bytesOf(s), what: "put_end payload"}
	if err := d.top(); err != nil {
		return PutEndPayload{}, err
	}
	var p PutEndPayload
	err := d.fields(payloadFields[:], func(f int) error {
		if f == 0 {
			var err error
			p.Size, err = d.uintField("size", math.MaxUint64)
			return err
		}
		return d.arrayField("replicas", func() error {
			var r ReplicaDesc
			err := d.replica(&r)
			p.Replicas = append(p.Replicas, r)
			return err
		})
	})
	if err == nil {
		err = d.end()
	}
	if err != nil {
		return PutEndPayload{}, d.result(err)
	}
	return p, nil
}

var (
	payloadFields = [...]string{"size", "replicas"}
	replicaFields = [...]string{"status", "buffers"}
	bufferFields  = [...]string{"segment_id", "segment_name", "buffer_address", "size"}
)

func (d *decoder) replica(r *ReplicaDesc) error {
	if d.peek() != '{' {
		return d.typeErr("", "an object")
	}
	return d.fields(replicaFields[:], func(f int) error {
		if f == 0 {
			var err error
			if r.Status, err = d.stringField("status"); err == nil &&
				r.Status != ReplicaComplete && r.Status != ReplicaProcessing {
				err = d.fieldErr("status", "unknown value %q", r.Status)
			}
			return err
		}
		return d.arrayField("buffers", func() error {
			var b BufferDesc
			err := d.buffer(&b)
			r.Buffers = append(r.Buffers, b)
			return err
		})
	})
}

func (d *decoder) buffer(b *BufferDesc) error {
	if d.peek() != '{' {
		return d.typeErr("", "an object")
	}
	return d.fields(bufferFields[:], func(f int) error {
		var err error
		switch f {
		case 0:
			b.SegmentID, err = d.stringField("segment_id")
		case 1:
			b.SegmentName, err = d.stringField("segment_name")
		case 2:
			b.Address, err = d.uintField("buffer_address", math.MaxUint64)
		case 3:
			b.Size, err = d.uintField("size", math.MaxUint64)
		}
		return err
	})
}

// arrayField reads the array value of field name, calling elem at each
// element; errors inside an element get the path name[i].
func (d *decoder) arrayField(name string, elem func() error) error {
	if d.peek() != '[' {
		return d.typeErr(name, "an array")
	}
	return d.array(func(i int) error {
		if err := elem(); err != nil {
			return within(within(err, "["+strconv.Itoa(i)+"]"), name)
		}
		return nil
	})
}

// fields reads an object whose fields are all required, calling value with
// the index in names of each known field and skipping the others.
func (d *decoder) fields(names []string, value func(f int) error) error {
	var seen uint
	err := d.object(func(name []byte) error {
		f := -1
		for i, n := range names {
			if string(name) == n {
				f = i
				break
			}
		}
		if f < 0 {
			return d.skip(0)
		}
		if seen&(1<<f) != 0 {
			return d.fieldErr(names[f], "appears twice")
		}
		seen |= 1 << f
		return value(f)
	})
	if err != nil {
		return err
	}
	for f, n := range names {
		if seen&(1<<f) == 0 {
			return d.fieldErr(n, "missing")
		}
	}
	return nil
}
