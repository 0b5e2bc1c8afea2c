// Package cororpc speaks the framing of yalantinglibs' coro_rpc as the
// Mooncake master of release 0.3.12.post1 (kvcache-ai/Mooncake 3b5a594,
// alibaba/yalantinglibs 7801bc9) uses it: a 20-byte request header and a
// 16-byte response header, both little-endian, before a struct_pack body
// and an optional attachment. Several requests may be in flight on one
// connection; answers carry the request's sequence number and may come
// back in any order.
package cororpc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Magic starts every header; Version is the only protocol version of this
// release.
const (
	Magic   = 21
	Version = 0

	ReqHeaderLen  = 20
	RespHeaderLen = 16

	// MaxBody bounds a request body or attachment this server reads: a
	// Mooncake request is a few kilobytes (a batch of keys); a length past
	// this is a broken or hostile peer, not a request.
	MaxBody = 64 << 20
)

// Errc is coro_rpc's own error code (coro_rpc::errc), carried in a
// response header; 0 means the body is the function's result.
type Errc uint8

// The codes of this release that a server sends.
const (
	ErrcOK                    Errc = 0
	ErrcIOError               Errc = 1
	ErrcInvalidArguments      Errc = 4
	ErrcRPCThrowException     Errc = 10
	ErrcFunctionNotRegistered Errc = 11
	ErrcProtocolError         Errc = 12
	ErrcUnknownVersion        Errc = 13
	ErrcMessageTooLarge       Errc = 14
)

// ReqHeader is coro_rpc_protocol::req_header.
type ReqHeader struct {
	Magic         uint8
	Version       uint8
	SerializeType uint8 // 0: struct_pack, the only one
	MsgType       uint8
	Seq           uint32
	FunctionID    uint32
	Length        uint32
	AttachLength  uint32
}

// RespHeader is coro_rpc_protocol::resp_header.
type RespHeader struct {
	Magic        uint8
	Version      uint8
	Errc         Errc
	MsgType      uint8
	Seq          uint32
	Length       uint32
	AttachLength uint32
}

// Request is one call: its header, struct_pack body and attachment.
type Request struct {
	Header     ReqHeader
	Body       []byte
	Attachment []byte
}

// Response is one answer.
type Response struct {
	Header     RespHeader
	Body       []byte
	Attachment []byte
}

// ErrProtocol is a header this release would refuse: wrong magic, a newer
// version, or lengths past MaxBody. The connection cannot continue: where
// the next frame starts is unknown.
var ErrProtocol = errors.New("cororpc: protocol error")

// ReadRequest reads one request frame.
func ReadRequest(r io.Reader) (Request, error) {
	var b [ReqHeaderLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return Request{}, err
	}
	h, err := decodeReqHeader(b[:])
	if err != nil {
		return Request{}, err
	}
	body, attachment, err := readBody(r, h.Length, h.AttachLength)
	if err != nil {
		return Request{}, err
	}
	return Request{Header: h, Body: body, Attachment: attachment}, nil
}

// parseRequest takes one request frame from the start of b: it returns
// n == 0 while b holds less than a whole frame. Body and attachment alias
// b.
func parseRequest(b []byte) (req Request, n int, err error) {
	if len(b) < ReqHeaderLen {
		return Request{}, 0, nil
	}
	h, err := decodeReqHeader(b)
	if err != nil {
		return Request{}, 0, err
	}
	end := ReqHeaderLen + int(h.Length) + int(h.AttachLength)
	if len(b) < end {
		return Request{}, 0, nil
	}
	body := b[ReqHeaderLen : ReqHeaderLen+int(h.Length) : ReqHeaderLen+int(h.Length)]
	var attachment []byte
	if h.AttachLength > 0 {
		attachment = b[ReqHeaderLen+int(h.Length) : end : end]
	}
	return Request{Header: h, Body: body, Attachment: attachment}, end, nil
}

// decodeReqHeader decodes and checks the header at the start of b (at
// least ReqHeaderLen bytes).
func decodeReqHeader(b []byte) (ReqHeader, error) {
	h := ReqHeader{
		Magic: b[0], Version: b[1], SerializeType: b[2], MsgType: b[3],
		Seq:          binary.LittleEndian.Uint32(b[4:]),
		FunctionID:   binary.LittleEndian.Uint32(b[8:]),
		Length:       binary.LittleEndian.Uint32(b[12:]),
		AttachLength: binary.LittleEndian.Uint32(b[16:]),
	}
	if h.Magic != Magic || h.Version > Version {
		return h, fmt.Errorf("%w: header magic %d version %d (want magic %d, version ≤ %d)", ErrProtocol, h.Magic, h.Version, Magic, Version)
	}
	if h.Length > MaxBody || h.AttachLength > MaxBody {
		return h, fmt.Errorf("%w: body of %d bytes and attachment of %d (limit %d each)", ErrProtocol, h.Length, h.AttachLength, MaxBody)
	}
	return h, nil
}

// AppendRequest appends req's frame to dst, with lengths from its body and
// attachment.
func AppendRequest(dst []byte, req Request) []byte {
	h := req.Header
	dst = append(dst, Magic, Version, h.SerializeType, h.MsgType)
	dst = binary.LittleEndian.AppendUint32(dst, h.Seq)
	dst = binary.LittleEndian.AppendUint32(dst, h.FunctionID)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(req.Body)))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(req.Attachment)))
	dst = append(dst, req.Body...)
	return append(dst, req.Attachment...)
}

// ReadResponse reads one response frame.
func ReadResponse(r io.Reader) (Response, error) {
	var b [RespHeaderLen]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return Response{}, err
	}
	h := RespHeader{
		Magic: b[0], Version: b[1], Errc: Errc(b[2]), MsgType: b[3],
		Seq:          binary.LittleEndian.Uint32(b[4:]),
		Length:       binary.LittleEndian.Uint32(b[8:]),
		AttachLength: binary.LittleEndian.Uint32(b[12:]),
	}
	if h.Magic != Magic || h.Length > MaxBody || h.AttachLength > MaxBody {
		return Response{}, fmt.Errorf("%w: response magic %d, body %d, attachment %d", ErrProtocol, h.Magic, h.Length, h.AttachLength)
	}
	body, attachment, err := readBody(r, h.Length, h.AttachLength)
	if err != nil {
		return Response{}, err
	}
	return Response{Header: h, Body: body, Attachment: attachment}, nil
}

// AppendResponse appends resp's frame to dst, with lengths from its body
// and attachment.
func AppendResponse(dst []byte, resp Response) []byte {
	dst = append(dst, make([]byte, RespHeaderLen)...)
	putRespHeader(dst[len(dst)-RespHeaderLen:], resp.Header, len(resp.Body), len(resp.Attachment))
	dst = append(dst, resp.Body...)
	return append(dst, resp.Attachment...)
}

// putRespHeader writes h into b (RespHeaderLen bytes) for a body and an
// attachment of the given lengths.
func putRespHeader(b []byte, h RespHeader, body, attachment int) {
	b[0], b[1], b[2], b[3] = Magic, Version, byte(h.Errc), h.MsgType
	binary.LittleEndian.PutUint32(b[4:], h.Seq)
	binary.LittleEndian.PutUint32(b[8:], uint32(body))
	binary.LittleEndian.PutUint32(b[12:], uint32(attachment))
}

// readBody reads the body and attachment a header announced; an EOF
// before their end is ErrUnexpectedEOF. Memory grows with the bytes that
// arrive, not with what a header claims.
func readBody(r io.Reader, n, attach uint32) (body, attachment []byte, err error) {
	if body, err = readN(r, n); err != nil || attach == 0 {
		return body, nil, err
	}
	attachment, err = readN(r, attach)
	return body, attachment, err
}

func readN(r io.Reader, n uint32) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(n)))
	if err != nil {
		return nil, err
	}
	if len(b) < int(n) {
		return nil, io.ErrUnexpectedEOF
	}
	return b, nil
}
