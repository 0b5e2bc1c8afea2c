package oplog_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

func TestPutEndPayloadRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		p    oplog.PutEndPayload
	}{
		{"one replica one slice", oplog.PutEndPayload{Size: 10, Replicas: []oplog.ReplicaDesc{
			{Status: oplog.ReplicaComplete, Buffers: []oplog.BufferDesc{{SegmentID: "s", SegmentName: "n", Address: 1, Size: 10}}},
		}}},
		{"max values and escapes", oplog.PutEndPayload{Size: 18446744073709551615, Replicas: []oplog.ReplicaDesc{
			{Status: oplog.ReplicaProcessing, Buffers: []oplog.BufferDesc{
				{SegmentID: `id"\<&>`, SegmentName: "名字\n\u2028", Address: 18446744073709551615, Size: 18446744073709551615},
				{SegmentID: "", SegmentName: "", Address: 0, Size: 0},
			}},
			{Status: oplog.ReplicaComplete, Buffers: []oplog.BufferDesc{{SegmentID: "x", SegmentName: "y", Address: 2, Size: 3}}},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := oplog.EncodePutEndPayload(tt.p)
			assert.Equal(t, stdJSON(t, tt.p), s, "the struct tags' format")
			got, err := oplog.DecodePutEndPayload(s)
			require.NoError(t, err)
			assert.Equal(t, tt.p, got)
			assert.Equal(t, "x"+s, string(oplog.AppendPutEndPayload([]byte("x"), tt.p)))
		})
	}
	assert.Equal(t, samplePayload, oplog.EncodePutEndPayload(mustPayload(t, samplePayload)))
}

func mustPayload(t testing.TB, s string) oplog.PutEndPayload {
	p, err := oplog.DecodePutEndPayload(s)
	require.NoError(t, err)
	return p
}

// Nil and empty slices encode alike and decode as nil.
func TestPutEndPayloadEmpty(t *testing.T) {
	for _, p := range []oplog.PutEndPayload{
		{Size: 1},
		{Size: 1, Replicas: []oplog.ReplicaDesc{}},
	} {
		assert.Equal(t, `{"size":1,"replicas":[]}`, oplog.EncodePutEndPayload(p))
	}
	assert.Equal(t, `{"size":0,"replicas":[{"status":"COMPLETE","buffers":[]}]}`,
		oplog.EncodePutEndPayload(oplog.PutEndPayload{Replicas: []oplog.ReplicaDesc{{Status: oplog.ReplicaComplete}}}))
	got, err := oplog.DecodePutEndPayload(` { "replicas" : [ { "buffers" : [ ] , "status" : "COMPLETE" } ] , "size" : 0 , "extra" : {"a":[null]} } `)
	require.NoError(t, err)
	assert.Equal(t, oplog.PutEndPayload{Replicas: []oplog.ReplicaDesc{{Status: oplog.ReplicaComplete}}}, got)
}

func TestDecodePutEndPayloadErrors(t *testing.T) {
	buf := `{"segment_id":"a","segment_name":"b","buffer_address":1,"size":2}`
	withBuf := func(b string) string {
		return `{"size":2,"replicas":[{"status":"COMPLETE","buffers":[` + buf + `,` + b + `]}]}`
	}
	tests := []struct{ name, in, msg string }{
		{"empty", "", "put_end payload: invalid JSON: unexpected end of input"},
		{"array", "[]", "put_end payload: expected a JSON object, got an array"},
		{"garbage", "}", "put_end payload: invalid JSON at offset 0: expected a JSON object"},
		{"missing size", `{"replicas":[]}`, `put_end payload: field "size": missing`},
		{"missing replicas", `{"size":1}`, `field "replicas": missing`},
		{"size negative", `{"size":-1,"replicas":[]}`, `field "size": must not be negative`},
		{"size huge", `{"size":18446744073709551616,"replicas":[]}`, `field "size": 18446744073709551616 is out of range`},
		{"size string", `{"size":"1","replicas":[]}`, `field "size": expected an unsigned integer, got a string`},
		{"replicas null", `{"size":1,"replicas":null}`, `field "replicas": expected an array, got null`},
		{"replicas object", `{"size":1,"replicas":{}}`, `field "replicas": expected an array, got an object`},
		{"replica not object", `{"size":1,"replicas":[{"status":"COMPLETE","buffers":[]},7]}`, `field "replicas[1]": expected an object, got a number`},
		{"status unknown", `{"size":1,"replicas":[{"status":"DONE","buffers":[]}]}`, `field "replicas[0].status": unknown value "DONE"`},
		{"status number", `{"size":1,"replicas":[{"status":1,"buffers":[]}]}`, `field "replicas[0].status": expected a string, got a number`},
		{"status missing", `{"size":1,"replicas":[{"buffers":[]}]}`, `field "replicas[0].status": missing`},
		{"buffers missing", `{"size":1,"replicas":[{"status":"COMPLETE"}]}`, `field "replicas[0].buffers": missing`},
		{"buffers string", `{"size":1,"replicas":[{"status":"COMPLETE","buffers":"x"}]}`, `field "replicas[0].buffers": expected an array, got a string`},
		{"buffer not object", withBuf(`[]`), `field "replicas[0].buffers[1]": expected an object, got an array`},
		{"buffer size missing", withBuf(`{"segment_id":"a","segment_name":"b","buffer_address":1}`), `field "replicas[0].buffers[1].size": missing`},
		{"buffer id number", withBuf(`{"segment_id":1,"segment_name":"b","buffer_address":1,"size":2}`), `field "replicas[0].buffers[1].segment_id": expected a string, got a number`},
		{"buffer name null", withBuf(`{"segment_id":"a","segment_name":null,"buffer_address":1,"size":2}`), `field "replicas[0].buffers[1].segment_name": expected a string, got null`},
		{"buffer address float", withBuf(`{"segment_id":"a","segment_name":"b","buffer_address":1.5,"size":2}`), `field "replicas[0].buffers[1].buffer_address": expected an unsigned integer, got 1.5`},
		{"buffer duplicate", withBuf(`{"segment_id":"a","segment_id":"a","segment_name":"b","buffer_address":1,"size":2}`), `field "replicas[0].buffers[1].segment_id": appears twice`},
		{"duplicate size", `{"size":1,"size":1,"replicas":[]}`, `field "size": appears twice`},
		{"trailing", `{"size":1,"replicas":[]}x`, "data after the top-level value"},
		{"truncated", `{"size":1,"replicas":[{"status":"COMPLETE","buffers":[`, "unexpected end of input"},
		{"trailing comma in array", `{"size":1,"replicas":[{"status":"COMPLETE","buffers":[]},]}`, "expected a value"},
		{"invalid UTF-8", withBuf("{\"segment_id\":\"\xfe\"}"), "invalid UTF-8 in string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := oplog.DecodePutEndPayload(tt.in)
			require.Error(t, err)
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", err)
			assert.ErrorContains(t, err, tt.msg)
		})
	}
	for n := range len(samplePayload) {
		_, err := oplog.DecodePutEndPayload(samplePayload[:n])
		require.Error(t, err, "prefix %q", samplePayload[:n])
	}
	_, err := oplog.DecodePutEndPayload(strings.Repeat(" ", 10))
	assert.ErrorContains(t, err, "unexpected end of input")
}
