// Package structpack reads and writes yalantinglibs' struct_pack encoding
// as the Mooncake master of release 0.3.12.post1 uses it (alibaba/
// yalantinglibs 7801bc9, kvcache-ai/Mooncake 3b5a594): a 4-byte type hash,
// a metainfo byte, the type literal (this release sends it), then the
// fields, little-endian, with container lengths in the width the metainfo
// names.
//
// Go types stand for C++ types: bool, the sized integers, float32/64,
// string (std::string), slices (std::vector), pointers (std::optional),
// maps (std::unordered_map, written in key order), structs (field by
// field; one implementing Trivial is copied as its C layout), Expected[T] (tl::expected<T, ErrorCode>), Void (the void of
// tl::expected<void, …>) and Variant (std::variant). The type literal and
// the hash are computed from the Go type, so a type that does not match
// the peer's is refused by its hash, as struct_pack refuses it.
package structpack

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"reflect"
	"sync"
)

// type_id of type_calculate.hpp.
const (
	idInt32     = 1
	idUint32    = 2
	idInt64     = 3
	idUint64    = 4
	idInt8      = 5
	idUint8     = 6
	idInt16     = 7
	idUint16    = 8
	idBool      = 11
	idChar      = 12
	idFloat32   = 17
	idFloat64   = 18
	idString    = 128
	idArray     = 129
	idMap       = 130
	idContainer = 132
	idOptional  = 133
	idVariant   = 134
	idExpected  = 135
	idMonostate = 250
	idStruct    = 253
	idEnd       = 255
)

// Void is the value type of tl::expected<void, E>: nothing on the wire.
type Void struct{}

// ErrorCode is the error type of every tl::expected in the Mooncake API
// (an enum of int32).
type ErrorCode int32

// Expected is tl::expected<T, ErrorCode>: a value, or an error code.
type Expected[T any] struct {
	Value T
	Err   ErrorCode // 0: has a value
}

// OK returns an Expected holding v.
func OK[T any](v T) Expected[T] { return Expected[T]{Value: v} }

// Fail returns an Expected holding the error code e (non-zero).
func Fail[T any](e ErrorCode) Expected[T] { return Expected[T]{Err: e} }

// expected lets the codec reach an Expected[T] of any T.
type expected interface {
	expectedValue() (reflect.Value, ErrorCode)
}

func (e Expected[T]) expectedValue() (reflect.Value, ErrorCode) {
	return reflect.ValueOf(e.Value), e.Err
}

var expectedType = reflect.TypeFor[expected]()

// Variant is implemented (on the pointer) by the Go types that stand for a
// std::variant: Alternatives lists the types of its alternatives in order,
// Index says which one a value holds and Value returns it; Set makes the
// variant hold v (of alternative i).
type Variant interface {
	Alternatives() []reflect.Type
	Index() int
	Value() any
	Set(i int, v any)
}

var variantType = reflect.TypeFor[Variant]()

// Trivial is implemented by the Go structs that stand for a C++ aggregate
// struct_pack copies as its C layout, padding included (std::pair of
// numbers, plain structs of numbers). Other structs (those with YLT_REFL,
// std::tuple) go field by field, and are what a struct is by default.
type Trivial interface{ StructPackTrivial() }

var trivialType = reflect.TypeFor[Trivial]()

// Packer is implemented (on the pointer) by a type on a hot path that
// encodes itself without the reflection walk, for the values it knows: it
// must produce exactly the bytes the walk would (test it against a twin
// type without the methods). For a value it does not know it reports
// false, having appended nothing, and the walk encodes it.
type Packer interface {
	// PackMaxLen is the longest string or container in the value.
	PackMaxLen() (n int, ok bool)
	// AppendPack appends the value, container lengths width bytes wide
	// (AppendLength).
	AppendPack(b []byte, width int) ([]byte, bool)
}

var packerType = reflect.TypeFor[Packer]()

// AppendLength appends a container's or string's length width bytes wide,
// for a Packer.
func AppendLength(b []byte, width, n int) []byte {
	switch width {
	case 1:
		return append(b, byte(n))
	case 2:
		return binary.LittleEndian.AppendUint16(b, uint16(n))
	case 4:
		return binary.LittleEndian.AppendUint32(b, uint32(n))
	}
	return binary.LittleEndian.AppendUint64(b, uint64(n))
}

// class is the kind of a Go type as struct_pack sees it. Its layout holds
// it, so encoding and decoding ask one cached lookup per value: reflect's
// Implements and PointerTo per value were a tenth of a leader's CPU under
// batch reads.
type class uint8

const (
	classOther class = iota
	classVoid
	classExpected
	classVariant
)

func classOf(t reflect.Type) class {
	switch {
	case t == reflect.TypeFor[Void]():
		return classVoid
	case reflect.PointerTo(t).Implements(variantType):
		return classVariant
	case t.Kind() == reflect.Struct && t.Implements(expectedType) && t.NumField() == 2 && t.Field(1).Name == "Err":
		return classExpected
	}
	return classOther
}

// asVariant returns v (whose pointer implements Variant) as a Variant.
func asVariant(v reflect.Value) Variant {
	if v.CanAddr() {
		return v.Addr().Interface().(Variant)
	}
	p := reflect.New(v.Type())
	p.Elem().Set(v)
	return p.Interface().(Variant)
}

// layout is what the codec knows of a type: its literal and, for a type
// copied as its C layout, its size and alignment.
type layout struct {
	literal []byte
	hash    uint32 // Hash(literal), set by layoutOf on the layouts it caches
	class   class
	trivial bool // fixed size: copied as its C layout
	packer  bool // the type's pointer is a Packer
	packs   bool // the type or a part of it is a Packer
	size    int
	align   int
	// The layouts of the parts, resolved once so that a value costs no
	// lookup: elem of a slice, pointer, array or map (its values) and the
	// value of an Expected; key of a map; fields of a struct; alts of a
	// variant, in order.
	elem   *layout
	key    *layout
	fields []*layout
	alts   []*layout
}

var layouts sync.Map // reflect.Type → *layout

func layoutOf(t reflect.Type) (*layout, error) {
	if l, ok := layouts.Load(t); ok {
		return l.(*layout), nil
	}
	l, err := computeLayout(t, nil)
	if err != nil {
		return nil, err
	}
	l.hash = Hash(l.literal)
	l.packs = l.hasPacker()
	layouts.Store(t, l)
	return l, nil
}

// hasPacker reports whether l or one of its parts is a Packer's (see
// layout.packs).
func (l *layout) hasPacker() bool {
	if l == nil {
		return false
	}
	if l.packer || l.elem.hasPacker() || l.key.hasPacker() {
		return true
	}
	for _, p := range l.fields {
		if p.hasPacker() {
			return true
		}
	}
	for _, p := range l.alts {
		if p.hasPacker() {
			return true
		}
	}
	return false
}

func fixed(id byte, size int) *layout {
	return &layout{literal: []byte{id}, trivial: true, size: size, align: size}
}

func computeLayout(t reflect.Type, parents []reflect.Type) (*layout, error) {
	for _, p := range parents {
		if p == t {
			return nil, fmt.Errorf("structpack: recursive type %v", t)
		}
	}
	switch classOf(t) {
	case classVoid:
		return &layout{literal: []byte{idMonostate}, class: classVoid}, nil
	case classVariant:
		l := &layout{literal: []byte{idVariant}, class: classVariant}
		for _, a := range reflect.New(t).Interface().(Variant).Alternatives() {
			al, err := computeLayout(a, append(parents, t))
			if err != nil {
				return nil, err
			}
			l.literal = append(l.literal, al.literal...)
			l.alts = append(l.alts, al)
		}
		l.literal = append(l.literal, idEnd)
		return l, nil
	case classExpected:
		vl, err := computeLayout(t.Field(0).Type, append(parents, t))
		if err != nil {
			return nil, err
		}
		return &layout{literal: append(append([]byte{idExpected}, vl.literal...), idInt32), class: classExpected, elem: vl}, nil
	}
	switch t.Kind() {
	case reflect.Bool:
		return fixed(idBool, 1), nil
	case reflect.Int8:
		return fixed(idInt8, 1), nil
	case reflect.Uint8:
		return fixed(idUint8, 1), nil
	case reflect.Int16:
		return fixed(idInt16, 2), nil
	case reflect.Uint16:
		return fixed(idUint16, 2), nil
	case reflect.Int32:
		return fixed(idInt32, 4), nil
	case reflect.Uint32:
		return fixed(idUint32, 4), nil
	case reflect.Int64:
		return fixed(idInt64, 8), nil
	case reflect.Uint64:
		return fixed(idUint64, 8), nil
	case reflect.Float32:
		return fixed(idFloat32, 4), nil
	case reflect.Float64:
		return fixed(idFloat64, 8), nil
	case reflect.String:
		return &layout{literal: []byte{idString, idChar}}, nil
	case reflect.Slice, reflect.Pointer, reflect.Array:
		el, err := computeLayout(t.Elem(), append(parents, t))
		if err != nil {
			return nil, err
		}
		switch t.Kind() {
		case reflect.Slice:
			return &layout{literal: append([]byte{idContainer}, el.literal...), elem: el}, nil
		case reflect.Pointer:
			return &layout{literal: append([]byte{idOptional}, el.literal...), elem: el}, nil
		}
		l := &layout{literal: append(append([]byte{idArray}, el.literal...), sizeLiteral(t.Len())...), elem: el}
		if el.trivial {
			l.trivial, l.size, l.align = true, el.size*t.Len(), el.align
		}
		return l, nil
	case reflect.Map:
		kl, err := computeLayout(t.Key(), append(parents, t))
		if err != nil {
			return nil, err
		}
		vl, err := computeLayout(t.Elem(), append(parents, t))
		if err != nil {
			return nil, err
		}
		return &layout{literal: append(append([]byte{idMap}, kl.literal...), vl.literal...), key: kl, elem: vl}, nil
	case reflect.Struct:
		lit := []byte{idStruct}
		var fields []*layout
		trivial, off, align := true, 0, 1
		for i := range t.NumField() {
			fl, err := computeLayout(t.Field(i).Type, append(parents, t))
			if err != nil {
				return nil, err
			}
			lit = append(lit, fl.literal...)
			fields = append(fields, fl)
			if !fl.trivial {
				trivial = false
				continue
			}
			off = roundUp(off, fl.align) + fl.size
			align = max(align, fl.align)
		}
		l := &layout{literal: lit, fields: fields, packer: reflect.PointerTo(t).Implements(packerType)}
		if trivial && t.NumField() > 0 && t.Implements(trivialType) {
			l.trivial, l.size, l.align = true, roundUp(off, align), align
			l.literal = append(append(l.literal, sizeLiteral(align)...), sizeLiteral(align)...)
		}
		l.literal = append(l.literal, idEnd)
		return l, nil
	}
	return nil, fmt.Errorf("structpack: no C++ counterpart for Go type %v", t)
}

func roundUp(n, a int) int { return (n + a - 1) / a * a }

// sizeLiteral is get_size_literal: base 127, low digits first, the last
// digit marked by +129.
func sizeLiteral(n int) []byte {
	var out []byte
	for n >= 127 {
		out = append(out, byte(n%127+1))
		n /= 127
	}
	return append(out, byte(n+129))
}

// Literal returns the type literal struct_pack computes for the C++ type
// that t stands for (the root of a message: a struct's literal, or, for
// the arguments of a call, see ArgsLiteral).
func Literal(t reflect.Type) ([]byte, error) {
	l, err := layoutOf(t)
	if err != nil {
		return nil, err
	}
	return l.literal, nil
}

// Hash is the 32-bit type code of a literal: the first four bytes of its
// MD5, big-endian, with the low bit cleared (the bit says whether a
// metainfo byte follows).
func Hash(literal []byte) uint32 {
	h := md5.Sum(literal)
	return binary.BigEndian.Uint32(h[:4]) &^ 1
}
