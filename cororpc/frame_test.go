package cororpc

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFrameRoundTrip(t *testing.T) {
	req := Request{Header: ReqHeader{Magic: Magic, Seq: 7, FunctionID: 0x7b81bb56, Length: 3, AttachLength: 2}, Body: []byte("abc"), Attachment: []byte("xy")}
	b := AppendRequest(nil, req)
	require.Len(t, b, ReqHeaderLen+5)
	got, err := ReadRequest(bytes.NewReader(b))
	require.NoError(t, err)
	assert.Equal(t, req, got)

	resp := Response{Header: RespHeader{Magic: Magic, Errc: ErrcFunctionNotRegistered, Seq: 7, Length: 2}, Body: []byte("no")}
	rb := AppendResponse(nil, resp)
	require.Len(t, rb, RespHeaderLen+2)
	gotResp, err := ReadResponse(bytes.NewReader(rb))
	require.NoError(t, err)
	assert.Equal(t, resp, gotResp)
}

func TestReadRequestRefuses(t *testing.T) {
	good := AppendRequest(nil, Request{Header: ReqHeader{Seq: 1, FunctionID: 2}, Body: []byte("body")})
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"bad magic", append([]byte{22}, good[1:]...), ErrProtocol},
		{"newer version", append([]byte{Magic, 1}, good[2:]...), ErrProtocol},
		{"body past the limit", func() []byte {
			b := append([]byte(nil), good...)
			b[12], b[13], b[14], b[15] = 0xff, 0xff, 0xff, 0x7f
			return b
		}(), ErrProtocol},
		{"header cut", good[:10], io.ErrUnexpectedEOF},
		{"body cut", good[:len(good)-1], io.ErrUnexpectedEOF},
		{"nothing", nil, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadRequest(bytes.NewReader(tc.b))
			assert.True(t, errors.Is(err, tc.want), "got %v, want %v", err, tc.want)
		})
	}
}

func FuzzReadRequest(f *testing.F) {
	f.Add(AppendRequest(nil, Request{Header: ReqHeader{Seq: 1, FunctionID: 2}, Body: []byte("body"), Attachment: []byte("a")}))
	f.Add([]byte{Magic, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ReadRequest(bytes.NewReader(b))
		// The event loop's parser agrees with the reader: the same request,
		// the same refusal, or (for a cut frame) a wait for more bytes.
		parsed, n, perr := parseRequest(b)
		switch {
		case errors.Is(err, ErrProtocol):
			require.ErrorIs(t, perr, ErrProtocol)
		case err != nil:
			require.NoError(t, perr)
			require.Zero(t, n, "a cut frame is not taken")
		default:
			require.NoError(t, perr)
			again := AppendRequest(nil, req)
			require.Equal(t, again, b[:len(again)], "re-encoded from the input")
			require.Equal(t, len(again), n)
			require.Equal(t, req.Header, parsed.Header)
			require.Equal(t, string(req.Body), string(parsed.Body))
			require.Equal(t, string(req.Attachment), string(parsed.Attachment))
		}
	})
}
