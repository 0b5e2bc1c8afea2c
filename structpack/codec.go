package structpack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
)

// Metainfo bits (calculate_size.hpp): the width of container lengths, and
// whether the type literal follows.
const (
	metaSizeShift   = 3
	metaSizeMask    = 0b11000
	metaTypeLiteral = 0b100
	metaCompatible  = 0b11
)

// Marshal encodes v as this release's master and client do: hash with the
// metainfo bit, metainfo, the literal and its NUL, then the value, with
// container lengths one byte wide unless a container or string is longer
// than 255.
func Marshal(v any) ([]byte, error) {
	b, err := AppendMarshal(make([]byte, 0, 64), v)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// AppendMarshal is Marshal appending to dst; on an error, dst comes back
// as it was.
func AppendMarshal(dst []byte, v any) ([]byte, error) {
	rv := reflect.ValueOf(v)
	l, err := layoutOf(rv.Type())
	if err != nil {
		return dst, err
	}
	if l.packs {
		// A Packer is reached through its address: a copy makes v and its
		// parts (an expected<>'s value, a field) addressable.
		p := reflect.New(rv.Type())
		p.Elem().Set(rv)
		rv = p.Elem()
	}
	return appendValue(dst, rv, l)
}

func appendValue(dst []byte, rv reflect.Value, l *layout) ([]byte, error) {
	width := lengthWidth(maxLen(rv, l))
	meta := byte(metaTypeLiteral)
	switch width {
	case 2:
		meta |= 1 << metaSizeShift
	case 4:
		meta |= 2 << metaSizeShift
	case 8:
		meta |= 3 << metaSizeShift
	}
	out := binary.LittleEndian.AppendUint32(dst, l.hash|1)
	out = append(out, meta)
	out = append(append(out, l.literal...), 0)
	e := encoder{b: out, width: width}
	if err := e.value(rv, l); err != nil {
		return dst, err
	}
	return e.b, nil
}

// Codec encodes and decodes T with T's layout resolved once, and encodes
// from a pointer, so a Packer in T is reached without copying T: for a
// server that answers the same types on every call.
type Codec[T any] struct{ l *layout }

// CodecOf returns T's Codec, or why T has no struct_pack encoding.
func CodecOf[T any]() (Codec[T], error) {
	l, err := layoutOf(reflect.TypeFor[T]())
	return Codec[T]{l}, err
}

// Append is AppendMarshal of *v.
func (c Codec[T]) Append(dst []byte, v *T) ([]byte, error) {
	return appendValue(dst, reflect.ValueOf(v).Elem(), c.l)
}

// Unmarshal is Unmarshal into v.
func (c Codec[T]) Unmarshal(b []byte, v *T) error {
	return decodeValue(b, reflect.ValueOf(v).Elem(), c.l)
}

func lengthWidth(n int) int {
	switch {
	case n < 1<<8:
		return 1
	case n < 1<<16:
		return 2
	case n < 1<<32:
		return 4
	}
	return 8
}

// maxLen is the longest string or container in v (of layout l): it decides
// the width of every length (size_info.max_size).
func maxLen(v reflect.Value, l *layout) int {
	switch l.class {
	case classVoid:
		return 0
	case classVariant:
		if vv := asVariant(v); vv.Value() != nil && vv.Index() < len(l.alts) {
			return maxLen(reflect.ValueOf(vv.Value()), l.alts[vv.Index()])
		}
		return 0
	case classExpected:
		if v.Field(1).Int() != 0 {
			return 0
		}
		return maxLen(v.Field(0), l.elem)
	}
	if l.trivial {
		return 0
	}
	if l.packer && v.CanAddr() {
		if n, ok := v.Addr().Interface().(Packer).PackMaxLen(); ok {
			return n
		}
	}
	switch v.Kind() {
	case reflect.String:
		return v.Len()
	case reflect.Slice:
		n := v.Len()
		for i := range v.Len() {
			n = max(n, maxLen(v.Index(i), l.elem))
		}
		return n
	case reflect.Map:
		n := v.Len()
		it := v.MapRange()
		for it.Next() {
			n = max(n, maxLen(it.Key(), l.key), maxLen(it.Value(), l.elem))
		}
		return n
	case reflect.Array:
		n := 0
		for i := range v.Len() {
			n = max(n, maxLen(v.Index(i), l.elem))
		}
		return n
	case reflect.Pointer:
		if v.IsNil() {
			return 0
		}
		return maxLen(v.Elem(), l.elem)
	case reflect.Struct:
		n := 0
		for i, fl := range l.fields {
			n = max(n, maxLen(v.Field(i), fl))
		}
		return n
	}
	return 0
}

type encoder struct {
	b     []byte
	width int
}

func (e *encoder) length(n int) { e.b = AppendLength(e.b, e.width, n) }

func (e *encoder) value(v reflect.Value, l *layout) error {
	switch l.class {
	case classVoid:
		return nil
	case classVariant:
		vv := asVariant(v)
		if vv.Value() == nil {
			return errors.New("structpack: a variant holds nothing")
		}
		if vv.Index() >= len(l.alts) {
			return fmt.Errorf("structpack: variant index %d of %d alternatives", vv.Index(), len(l.alts))
		}
		e.b = append(e.b, byte(vv.Index()))
		return e.value(reflect.ValueOf(vv.Value()), l.alts[vv.Index()])
	case classExpected:
		if code := v.Field(1).Int(); code != 0 {
			e.b = append(e.b, 0)
			e.b = binary.LittleEndian.AppendUint32(e.b, uint32(int32(code)))
			return nil
		}
		e.b = append(e.b, 1)
		return e.value(v.Field(0), l.elem)
	}
	if l.trivial {
		start := len(e.b)
		e.b = append(e.b, make([]byte, l.size)...)
		putTrivial(e.b[start:], v, l)
		return nil
	}
	if l.packer && v.CanAddr() {
		var ok bool
		if e.b, ok = v.Addr().Interface().(Packer).AppendPack(e.b, e.width); ok {
			return nil
		}
	}
	switch v.Kind() {
	case reflect.String:
		e.length(v.Len())
		e.b = append(e.b, v.String()...)
	case reflect.Slice:
		e.length(v.Len())
		for i := range v.Len() {
			if err := e.value(v.Index(i), l.elem); err != nil {
				return err
			}
		}
	case reflect.Array:
		for i := range v.Len() {
			if err := e.value(v.Index(i), l.elem); err != nil {
				return err
			}
		}
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return compareKeys(a, b) })
		e.length(len(keys))
		for _, k := range keys {
			if err := e.value(k, l.key); err != nil {
				return err
			}
			if err := e.value(v.MapIndex(k), l.elem); err != nil {
				return err
			}
		}
	case reflect.Pointer:
		if v.IsNil() {
			e.b = append(e.b, 0)
			return nil
		}
		e.b = append(e.b, 1)
		return e.value(v.Elem(), l.elem)
	case reflect.Struct:
		for i, fl := range l.fields {
			if err := e.value(v.Field(i), fl); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("structpack: cannot encode %v", v.Type())
	}
	return nil
}

func compareKeys(a, b reflect.Value) int {
	switch a.Kind() {
	case reflect.String:
		switch {
		case a.String() < b.String():
			return -1
		case a.String() > b.String():
			return 1
		}
		return 0
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return cmpOrdered(a.Int(), b.Int())
	}
	return cmpOrdered(a.Uint(), b.Uint())
}

func cmpOrdered[T int64 | uint64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// putTrivial writes v (of layout l) in its C layout into b (len(b) == its
// size; padding stays zero).
func putTrivial(b []byte, v reflect.Value, l *layout) {
	switch v.Kind() {
	case reflect.Bool:
		if v.Bool() {
			b[0] = 1
		}
	case reflect.Int8, reflect.Uint8:
		b[0] = byte(intBits(v))
	case reflect.Int16, reflect.Uint16:
		binary.LittleEndian.PutUint16(b, uint16(intBits(v)))
	case reflect.Int32, reflect.Uint32:
		binary.LittleEndian.PutUint32(b, uint32(intBits(v)))
	case reflect.Int64, reflect.Uint64:
		binary.LittleEndian.PutUint64(b, intBits(v))
	case reflect.Float32:
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(v.Float())))
	case reflect.Float64:
		binary.LittleEndian.PutUint64(b, math.Float64bits(v.Float()))
	case reflect.Array:
		for i := range v.Len() {
			putTrivial(b[i*l.elem.size:], v.Index(i), l.elem)
		}
	case reflect.Struct:
		off := 0
		for i, fl := range l.fields {
			off = roundUp(off, fl.align)
			putTrivial(b[off:off+fl.size], v.Field(i), fl)
			off += fl.size
		}
	}
}

func intBits(v reflect.Value) uint64 {
	switch v.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return uint64(v.Int())
	}
	return v.Uint()
}

// ErrMismatch is a message whose type hash or literal is not the one the
// Go type stands for: the peer sent another type (another release, or
// another function).
var ErrMismatch = errors.New("structpack: type mismatch")

// Unmarshal decodes b into *v, checking the type hash (and the literal,
// when one is sent) against v's type. Malformed input is an error, never a
// panic; trailing bytes are an error.
func Unmarshal(b []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errors.New("structpack: Unmarshal needs a non-nil pointer")
	}
	l, err := layoutOf(rv.Type().Elem())
	if err != nil {
		return err
	}
	return decodeValue(b, rv.Elem(), l)
}

func decodeValue(b []byte, rv reflect.Value, l *layout) error {
	if len(b) < 4 {
		return fmt.Errorf("structpack: %d bytes, too short for the type hash", len(b))
	}
	head := binary.LittleEndian.Uint32(b)
	if want := l.hash; head&^1 != want {
		return fmt.Errorf("%w: type hash %#08x, %v is %#08x", ErrMismatch, head&^1, rv.Type(), want)
	}
	d := decoder{b: b[4:], width: 1}
	if head&1 != 0 {
		if len(d.b) < 1 {
			return errors.New("structpack: metainfo byte missing")
		}
		meta := d.b[0]
		d.b = d.b[1:]
		if meta&metaCompatible != 0 {
			return errors.New("structpack: compatible fields are not part of this protocol")
		}
		d.width = 1 << ((meta & metaSizeMask) >> metaSizeShift)
		if meta&metaTypeLiteral != 0 {
			n := len(l.literal)
			if len(d.b) < n+1 || string(d.b[:n]) != string(l.literal) || d.b[n] != 0 {
				return fmt.Errorf("%w: the type literal sent is not %v's", ErrMismatch, rv.Type())
			}
			d.b = d.b[n+1:]
		}
	}
	if err := d.value(rv, l); err != nil {
		return err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("structpack: %d trailing bytes after %v", len(d.b), rv.Type())
	}
	return nil
}

type decoder struct {
	b     []byte
	width int
}

var errShort = errors.New("structpack: truncated message")

func (d *decoder) take(n int) ([]byte, error) {
	if n < 0 || n > len(d.b) {
		return nil, errShort
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p, nil
}

func (d *decoder) length() (int, error) {
	p, err := d.take(d.width)
	if err != nil {
		return 0, err
	}
	var n uint64
	switch d.width {
	case 1:
		n = uint64(p[0])
	case 2:
		n = uint64(binary.LittleEndian.Uint16(p))
	case 4:
		n = uint64(binary.LittleEndian.Uint32(p))
	default:
		n = binary.LittleEndian.Uint64(p)
	}
	if n > uint64(len(d.b)) { // every element takes at least a byte
		return 0, fmt.Errorf("structpack: length %d but %d bytes remain", n, len(d.b))
	}
	return int(n), nil
}

func (d *decoder) flag() (bool, error) {
	p, err := d.take(1)
	if err != nil {
		return false, err
	}
	switch p[0] {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("structpack: boolean byte %d", p[0])
}

func (d *decoder) value(v reflect.Value, l *layout) error {
	t := v.Type()
	switch l.class {
	case classVoid:
		return nil
	case classVariant:
		p, err := d.take(1)
		if err != nil {
			return err
		}
		vv := asVariant(v)
		alts := vv.Alternatives()
		if int(p[0]) >= len(alts) {
			return fmt.Errorf("structpack: variant index %d of %d alternatives", p[0], len(alts))
		}
		alt := reflect.New(alts[p[0]]).Elem()
		if err := d.value(alt, l.alts[p[0]]); err != nil {
			return err
		}
		vv.Set(int(p[0]), alt.Interface())
		return nil
	case classExpected:
		ok, err := d.flag()
		if err != nil {
			return err
		}
		if ok {
			return d.value(v.Field(0), l.elem)
		}
		p, err := d.take(4)
		if err != nil {
			return err
		}
		code := int32(binary.LittleEndian.Uint32(p))
		if code == 0 {
			return errors.New("structpack: an expected's error is 0")
		}
		v.Field(1).SetInt(int64(code))
		return nil
	}
	if l.trivial {
		p, err := d.take(l.size)
		if err != nil {
			return err
		}
		return getTrivial(p, v, l)
	}
	switch t.Kind() {
	case reflect.String:
		n, err := d.length()
		if err != nil {
			return err
		}
		p, _ := d.take(n)
		v.SetString(string(p))
	case reflect.Slice:
		n, err := d.length()
		if err != nil {
			return err
		}
		s := reflect.MakeSlice(t, n, n)
		for i := range n {
			if err := d.value(s.Index(i), l.elem); err != nil {
				return err
			}
		}
		v.Set(s)
	case reflect.Array:
		for i := range v.Len() {
			if err := d.value(v.Index(i), l.elem); err != nil {
				return err
			}
		}
	case reflect.Map:
		n, err := d.length()
		if err != nil {
			return err
		}
		m := reflect.MakeMapWithSize(t, n)
		for range n {
			k, e := reflect.New(t.Key()).Elem(), reflect.New(t.Elem()).Elem()
			if err := d.value(k, l.key); err != nil {
				return err
			}
			if err := d.value(e, l.elem); err != nil {
				return err
			}
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Pointer:
		ok, err := d.flag()
		if err != nil || !ok {
			return err
		}
		p := reflect.New(t.Elem())
		if err := d.value(p.Elem(), l.elem); err != nil {
			return err
		}
		v.Set(p)
	case reflect.Struct:
		for i, fl := range l.fields {
			if err := d.value(v.Field(i), fl); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("structpack: cannot decode %v", t)
	}
	return nil
}

func getTrivial(b []byte, v reflect.Value, l *layout) error {
	switch v.Kind() {
	case reflect.Bool:
		if b[0] > 1 {
			return fmt.Errorf("structpack: boolean byte %d", b[0])
		}
		v.SetBool(b[0] == 1)
	case reflect.Int8:
		v.SetInt(int64(int8(b[0])))
	case reflect.Uint8:
		v.SetUint(uint64(b[0]))
	case reflect.Int16:
		v.SetInt(int64(int16(binary.LittleEndian.Uint16(b))))
	case reflect.Uint16:
		v.SetUint(uint64(binary.LittleEndian.Uint16(b)))
	case reflect.Int32:
		v.SetInt(int64(int32(binary.LittleEndian.Uint32(b))))
	case reflect.Uint32:
		v.SetUint(uint64(binary.LittleEndian.Uint32(b)))
	case reflect.Int64:
		v.SetInt(int64(binary.LittleEndian.Uint64(b)))
	case reflect.Uint64:
		v.SetUint(binary.LittleEndian.Uint64(b))
	case reflect.Float32:
		v.SetFloat(float64(math.Float32frombits(binary.LittleEndian.Uint32(b))))
	case reflect.Float64:
		v.SetFloat(math.Float64frombits(binary.LittleEndian.Uint64(b)))
	case reflect.Array:
		for i := range v.Len() {
			if err := getTrivial(b[i*l.elem.size:], v.Index(i), l.elem); err != nil {
				return err
			}
		}
	case reflect.Struct:
		off := 0
		for i, fl := range l.fields {
			off = roundUp(off, fl.align)
			if err := getTrivial(b[off:off+fl.size], v.Field(i), fl); err != nil {
				return err
			}
			off += fl.size
		}
	}
	return nil
}
