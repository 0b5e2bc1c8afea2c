package structpack

import (
	"encoding/binary"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type pair struct{ A, B uint64 }

func (pair) StructPackTrivial() {}

type padded struct {
	A uint8
	B uint64
	C uint16
}

func (padded) StructPackTrivial() {}

type alt struct {
	i int
	v any
}

func (a *alt) Alternatives() []reflect.Type {
	return []reflect.Type{reflect.TypeFor[string](), reflect.TypeFor[pair]()}
}
func (a *alt) Index() int       { return a.i }
func (a *alt) Value() any       { return a.v }
func (a *alt) Set(i int, v any) { a.i, a.v = i, v }

type message struct {
	ID      pair
	Name    string
	Tags    []string
	Opt     *uint64
	Pad     padded
	Choice  alt
	ByKey   map[string]int32
	Results []Expected[Void]
}

func TestRoundTrip(t *testing.T) {
	seven := uint64(7)
	for _, tc := range []struct {
		name  string
		v     any
		width int
	}{
		{"short lengths", message{ID: pair{1, 2}, Name: "k", Tags: []string{"a", "b"}, Opt: &seven, Pad: padded{1, 2, 3},
			Choice: alt{1, pair{3, 4}}, ByKey: map[string]int32{"z": 1, "a": 2}, Results: []Expected[Void]{{}, Fail[Void](-704)}}, 1},
		{"a string of 300 bytes widens every length", message{Name: strings.Repeat("x", 300), Choice: alt{0, "s"}}, 2},
		{"70,000 elements", message{Tags: make([]string, 70_000), Choice: alt{0, ""}}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Marshal(tc.v)
			require.NoError(t, err)
			assert.Equal(t, map[int]byte{1: 0, 2: 1, 4: 2}[tc.width], (b[4]&metaSizeMask)>>metaSizeShift, "metainfo names the length width")
			var got message
			require.NoError(t, Unmarshal(b, &got))
			again, err := Marshal(got)
			require.NoError(t, err)
			assert.Equal(t, b, again)
		})
	}
}

// TestLiteral pins literals that the golden frames of the Mooncake API
// (mooncakeapi) check against the real master byte for byte.
func TestLiteral(t *testing.T) {
	for _, tc := range []struct {
		typ  reflect.Type
		want []byte
	}{
		{reflect.TypeFor[Expected[string]](), []byte{idExpected, idString, idChar, idInt32}},
		{reflect.TypeFor[pair](), []byte{idStruct, idUint64, idUint64, 0x89, 0x89, idEnd}},
		{reflect.TypeFor[padded](), []byte{idStruct, idUint8, idUint64, idUint16, 0x89, 0x89, idEnd}},
		{reflect.TypeFor[[]Expected[Void]](), []byte{idContainer, idExpected, idMonostate, idInt32}},
	} {
		got, err := Literal(tc.typ)
		require.NoError(t, err)
		assert.Equal(t, tc.want, got, "%v", tc.typ)
	}
	assert.Equal(t, []byte{2, 0x82}, sizeLiteral(128), "base 127, low digit first")
}

func TestPaddedLayout(t *testing.T) {
	b, err := Marshal(padded{A: 1, B: 2, C: 3})
	require.NoError(t, err)
	body := b[4+1+7+1:]
	require.Len(t, body, 24, "C layout: 1 + 7 padding + 8 + 2 + 6 padding")
	assert.Equal(t, uint64(2), binary.LittleEndian.Uint64(body[8:]))
}

func TestUnmarshalRefuses(t *testing.T) {
	good, err := Marshal(message{Name: "k", Choice: alt{0, "s"}})
	require.NoError(t, err)
	var m message
	bad := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"truncated", good[:len(good)-1]},
		{"trailing byte", append(append([]byte(nil), good...), 0)},
		{"other type's hash", bad(func(b []byte) []byte { b[0] ^= 0x10; return b })},
		{"literal changed", bad(func(b []byte) []byte { b[6] ^= 1; return b })},
		{"length past the end", bad(func(b []byte) []byte { b[len(b)-4] = 200; return b })},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Error(t, Unmarshal(tc.b, &m)) })
	}
	_, err = Marshal(message{})
	assert.Error(t, err, "a variant must hold an alternative")
}

func FuzzUnmarshal(f *testing.F) {
	seven := uint64(7)
	for _, v := range []message{
		{ID: pair{1, 2}, Name: "k", Tags: []string{"a"}, Opt: &seven, Choice: alt{1, pair{3, 4}}, ByKey: map[string]int32{"a": 1}, Results: []Expected[Void]{Fail[Void](-1)}},
		{Name: strings.Repeat("x", 300), Choice: alt{0, "s"}},
	} {
		b, err := Marshal(v)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m message
		if Unmarshal(b, &m) != nil {
			return
		}
		if _, err := Marshal(m); err != nil {
			t.Fatalf("decoded %+v but cannot encode it: %v", m, err)
		}
	})
}

// counted encodes itself (the bytes of its twin, countedTwin) and counts
// how often it was asked to.
type counted struct{ Name string }

var packs int

type countedTwin struct{ Name string }

func (c *counted) PackMaxLen() (int, bool) { return len(c.Name), true }

func (c *counted) AppendPack(b []byte, width int) ([]byte, bool) {
	packs++
	return append(AppendLength(b, width, len(c.Name)), c.Name...), true
}

func TestPackerIsUsedWhereverItSits(t *testing.T) {
	c := counted{Name: "key"}
	for _, tc := range []struct {
		name       string
		v, twin    any
		wantPacked int
	}{
		{"by value", c, countedTwin{"key"}, 1},
		{"by pointer", &c, &countedTwin{"key"}, 1},
		{"in an expected passed by value", OK(c), OK(countedTwin{"key"}), 1},
		{"in a struct passed by value", struct{ C counted }{c}, struct{ C countedTwin }{countedTwin{"key"}}, 1},
		{"in a slice", []counted{c, c}, []countedTwin{{"key"}, {"key"}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			packs = 0
			got, err := Marshal(tc.v)
			require.NoError(t, err)
			require.Equal(t, tc.wantPacked, packs)
			want, err := Marshal(tc.twin)
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

// A Codec encodes and decodes as Marshal and Unmarshal do, reaching a
// Packer inside T without a copy of T.
func TestCodecMatchesMarshalAndUnmarshal(t *testing.T) {
	v := OK(struct{ C counted }{counted{Name: "key"}})
	c, err := CodecOf[Expected[struct{ C counted }]]()
	require.NoError(t, err)
	packs = 0
	got, err := c.Append([]byte("head"), &v)
	require.NoError(t, err)
	require.Equal(t, 1, packs)
	want, err := AppendMarshal([]byte("head"), v)
	require.NoError(t, err)
	require.Equal(t, want, got)

	var back Expected[struct{ C counted }]
	require.NoError(t, c.Unmarshal(got[len("head"):], &back))
	require.Equal(t, v, back)
	require.ErrorIs(t, c.Unmarshal(mustMarshal(t, "not it"), &back), ErrMismatch)

	_, err = CodecOf[chan int]()
	require.Error(t, err)
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := Marshal(v)
	require.NoError(t, err)
	return b
}
