package varint

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestReader(t *testing.T) {
	good := binary.AppendUvarint(nil, 300)
	good = binary.AppendVarint(good, -5)
	good = binary.AppendUvarint(good, 3)
	good = append(good, "abc"...)

	r := NewReader(good)
	assert.EqualValues(t, 300, r.Uvarint("a"))
	assert.EqualValues(t, -5, r.Varint("b"))
	assert.Equal(t, []byte("abc"), r.Bytes("c"))
	r.Done()
	_, _, failed := r.Failure()
	assert.False(t, failed)

	for _, tc := range []struct {
		name string
		in   []byte
		read func(r *Reader)
		at   int
		msg  string
	}{
		{"empty", nil, func(r *Reader) { r.Uvarint("index") }, 0, "truncated or malformed index"},
		{"overflowing varint", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, func(r *Reader) { r.Varint("time") }, 0, "truncated or malformed time"},
		{"length past the end", []byte{1, 9, 'x'}, func(r *Reader) { r.Uvarint("n"); r.Bytes("name") }, 2, "name of 9 bytes but only 1 remain"},
		{"no length", []byte{}, func(r *Reader) { r.Bytes("name") }, 0, "truncated or malformed name length"},
		{"trailing", []byte{1, 2}, func(r *Reader) { r.Uvarint("n"); r.Done() }, 1, "1 unexpected trailing bytes"},
		{"first failure sticks", nil, func(r *Reader) { r.Uvarint("first"); r.Uvarint("second"); r.Done() }, 0, "truncated or malformed first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(tc.in)
			tc.read(&r)
			at, msg, failed := r.Failure()
			assert.True(t, failed)
			assert.Equal(t, tc.at, at)
			assert.Equal(t, tc.msg, msg)
		})
	}
}
