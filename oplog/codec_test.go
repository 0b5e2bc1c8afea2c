package oplog_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// mirror is what encoding/json makes of an entry with the OpLog's field
// names (docs/OPLOG.md); Encode must write the same bytes.
type mirror struct {
	SequenceID    uint64 `json:"sequence_id"`
	Timestamp     int64  `json:"timestamp"`
	OpType        string `json:"op_type"`
	Key           string `json:"key"`
	Payload       string `json:"payload"`
	Checksum      uint32 `json:"checksum"`
	PrefixHash    uint32 `json:"prefix_hash"`
	KeySequenceID uint64 `json:"key_sequence_id"`
	Source        string `json:"source"`
}

func mirrorOf(e oplog.Entry) mirror {
	return mirror{e.SequenceID, e.TimestampMs, e.OpType.String(), e.Key, e.Payload,
		e.Checksum, e.PrefixHash, e.KeySequenceID, string(e.Source)}
}

func stdJSON(t testing.TB, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

var samplePayload = oplog.EncodePutEndPayload(oplog.PutEndPayload{
	Size: 3 << 20,
	Replicas: []oplog.ReplicaDesc{
		{Status: oplog.ReplicaComplete, Buffers: []oplog.BufferDesc{
			{SegmentID: "seg-1", SegmentName: "node-a:rdma0", Address: 0x7f0000001000, Size: 1 << 20},
			{SegmentID: "seg-2", SegmentName: "node-b:rdma0", Address: 0x7f0000200000, Size: 2 << 20},
		}},
		{Status: oplog.ReplicaComplete, Buffers: []oplog.BufferDesc{
			{SegmentID: "seg-3", SegmentName: "node-c:rdma0", Address: 4096, Size: 3 << 20},
		}},
	},
})

// keys that exercise every escaping rule.
var roundTripKeys = []string{
	"plain",
	"dir/sub/key-0001",
	`with "quotes"`,
	`back\slash\`,
	"ctl\x00\x01\x07\x08\x09\x0a\x0b\x0c\x0d\x1b\x1f\x7f",
	"html <a href=x>&amp;</a>",
	"unicode 模型/层/块 ü é 🚀",
	"separators \u2028 \u2029 \u0085",
	"max rune \U0010FFFF and U+FFFD \uFFFD",
	"/leading", "trailing/", "/",
	strings.Repeat("long/", 900),
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, key := range roundTripKeys {
		for _, e := range []oplog.Entry{
			oplog.NewEntry(1, 1700000000123, oplog.OpPutEnd, key, samplePayload, 1, oplog.SourceNone),
			oplog.NewEntry(18446744073709551615, -9223372036854775808, oplog.OpRemove, key, "", 18446744073709551615, oplog.SourceRemoveByRegex),
			oplog.NewEntry(77, 0, oplog.OpPutRevoke, key, "", 2, oplog.SourceNone),
			oplog.NewEntry(78, 9223372036854775807, oplog.OpRemove, key, "", 3, oplog.Source(key)),
		} {
			enc := e.Encode()
			require.True(t, json.Valid(enc), "%s", enc)
			got, err := oplog.Decode(enc)
			require.NoError(t, err, "%s", enc)
			require.Equal(t, e, got)
			require.NoError(t, got.Verify())
			// Encode equals what encoding/json writes: the OpLog's format,
			// with encoding/json's escaping (all valid UTF-8, not only ASCII).
			require.Equal(t, stdJSON(t, mirrorOf(e)), string(enc))
			// AppendJSON appends.
			require.Equal(t, "prefix"+string(enc), string(e.AppendJSON([]byte("prefix"))))
		}
	}
}

func TestEncodeGolden(t *testing.T) {
	e := oplog.NewEntry(12345, 1704110400123, oplog.OpRemove, `a/"b"`, "", 5, oplog.SourceEvict)
	assert.Equal(t, `{"sequence_id":12345,"timestamp":1704110400123,"op_type":"REMOVE","key":"a/\"b\"","payload":"",`+
		`"checksum":`+itoa(uint64(e.Checksum))+`,"prefix_hash":`+itoa(uint64(oplog.PrefixHash("a")))+
		`,"key_sequence_id":5,"source":"evict"}`, string(e.Encode()))
}

// Invalid UTF-8 cannot travel in JSON: Encode writes U+FFFD as encoding/json
// does, and the reader's Verify catches the changed key.
func TestEncodeInvalidUTF8(t *testing.T) {
	e := oplog.NewEntry(3, 0, oplog.OpRemove, "bad\xffkey", "", 1, oplog.SourceRemove)
	enc := e.Encode()
	assert.Contains(t, string(enc), `"key":"bad\ufffdkey"`)
	assert.Equal(t, stdJSON(t, mirrorOf(e)), string(enc))
	got, err := oplog.Decode(enc)
	require.NoError(t, err)
	assert.Equal(t, "bad\uFFFDkey", got.Key)
	assert.Equal(t, errcode.ChecksumMismatch, errcode.Of(got.Verify()))
}

func TestDecodeLenient(t *testing.T) {
	want := oplog.Entry{SequenceID: 5, TimestampMs: -3, OpType: oplog.OpRemove, Key: "k/\u00e9\U0001F680/",
		Checksum: 1, PrefixHash: 2, KeySequenceID: 6, Source: "future_reason"}
	tests := []struct{ name, in string }{
		{"reordered, white space, escapes", " \t\n{ \"source\" : \"future_reason\" , \"key\":\"k\\/\\u00E9\\ud83d\\ude80/\",\r\n" +
			`"op_type":"REMOVE","sequence_id":5,"timestamp":-3,"payload":"","checksum":1,"prefix_hash":2,"key_sequence_id":6} `},
		{"escaped field names", `{"\u0073equence_id":5,"timestamp":-3,"op_type":"REMOVE","key":"k/é🚀/","payload":"",` +
			`"checksum":1,"prefix_hash":2,"key_sequence_id":6,"source":"future_reason"}`},
		{"unknown fields of every type", `{"x":{"a":[1,-2.5e+3,true,false,null,"s\n",{}],"b":{}},"sequence_id":5,"y":[],` +
			`"timestamp":-3,"op_type":"REMOVE","key":"k/é🚀/","payload":"","checksum":1,"prefix_hash":2,` +
			`"key_sequence_id":6,"source":"future_reason","SEQUENCE_ID":0,"z":0.5E-7}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := oplog.Decode([]byte(tt.in))
			require.NoError(t, err)
			assert.Equal(t, want, got)
		})
	}

	// The notes' entries (seed 004) have no source.
	got, err := oplog.Decode([]byte(`{"sequence_id":12345,"timestamp":1704110400123,"op_type":"PUT_END","key":"k",` +
		`"payload":"optional_payload","checksum":1234567890,"prefix_hash":987654321,"key_sequence_id":5}`))
	require.NoError(t, err)
	assert.Equal(t, oplog.Entry{SequenceID: 12345, TimestampMs: 1704110400123, OpType: oplog.OpPutEnd, Key: "k",
		Payload: "optional_payload", Checksum: 1234567890, PrefixHash: 987654321, KeySequenceID: 5}, got)
}

// entryJSON is a valid entry's JSON with some fields' raw values replaced
// (or the field dropped when the value is "-").
func entryJSON(set map[string]string) string {
	fields := []struct{ name, value string }{
		{"sequence_id", "7"}, {"timestamp", "1000"}, {"op_type", `"REMOVE"`}, {"key", `"a/b"`},
		{"payload", `""`}, {"checksum", "1"}, {"prefix_hash", "2"}, {"key_sequence_id", "1"}, {"source", `"remove"`},
	}
	var b strings.Builder
	b.WriteByte('{')
	for _, f := range fields {
		v := f.value
		if s, ok := set[f.name]; ok {
			v = s
		}
		if v == "-" {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + f.name + `":` + v)
	}
	b.WriteByte('}')
	return b.String()
}

func TestDecodeErrors(t *testing.T) {
	deep := `{"x":` + strings.Repeat("[", 1100) + strings.Repeat("]", 1100) + `}`
	tests := []struct {
		name, in, msg string
	}{
		{"empty", "", "oplog entry: invalid JSON: unexpected end of input"},
		{"space", " \n", "unexpected end of input"},
		{"string", `"x"`, "oplog entry: expected a JSON object, got a string"},
		{"array", `[]`, "expected a JSON object, got an array"},
		{"null", `null`, "expected a JSON object, got null"},
		{"number", `12`, "expected a JSON object, got a number"},
		{"garbage", `xyz`, "oplog entry: invalid JSON at offset 0: expected a JSON object"},
		{"open brace", `{`, "unexpected end of input"},
		{"empty object", `{}`, `oplog entry: field "sequence_id": missing`},
		{"unknown op", entryJSON(map[string]string{"op_type": `"FOO"`}), `oplog entry: field "op_type": unknown value "FOO"`},
		{"lowercase op", entryJSON(map[string]string{"op_type": `"remove"`}), `field "op_type": unknown value "remove"`},
		{"op as number", entryJSON(map[string]string{"op_type": `3`}), `field "op_type": expected a string, got a number`},
		{"seq 0", entryJSON(map[string]string{"sequence_id": "0"}), `field "sequence_id": must be >= 1`},
		{"key seq 0", entryJSON(map[string]string{"key_sequence_id": "0"}), `field "key_sequence_id": must be >= 1`},
		{"missing key", entryJSON(map[string]string{"key": "-"}), `field "key": missing`},
		{"missing payload", entryJSON(map[string]string{"payload": "-"}), `field "payload": missing`},
		{"missing checksum", entryJSON(map[string]string{"checksum": "-"}), `field "checksum": missing`},
		{"empty key", entryJSON(map[string]string{"key": `""`}), `field "key": empty`},
		{"key null", entryJSON(map[string]string{"key": `null`}), `field "key": expected a string, got null`},
		{"key object", entryJSON(map[string]string{"key": `{}`}), `field "key": expected a string, got an object`},
		{"seq string", entryJSON(map[string]string{"sequence_id": `"7"`}), `field "sequence_id": expected an unsigned integer, got a string`},
		{"seq bool", entryJSON(map[string]string{"sequence_id": `true`}), `field "sequence_id": expected an unsigned integer, got a boolean`},
		{"seq array", entryJSON(map[string]string{"sequence_id": `[7]`}), `got an array`},
		{"seq negative", entryJSON(map[string]string{"sequence_id": "-7"}), `field "sequence_id": must not be negative`},
		{"seq fraction", entryJSON(map[string]string{"sequence_id": "7.0"}), `field "sequence_id": expected an unsigned integer, got 7.0`},
		{"seq exponent", entryJSON(map[string]string{"sequence_id": "7e2"}), `expected an unsigned integer, got 7e2`},
		{"seq huge", entryJSON(map[string]string{"sequence_id": "18446744073709551616"}), `field "sequence_id": 18446744073709551616 is out of range`},
		{"seq very huge", entryJSON(map[string]string{"sequence_id": "99999999999999999999999999"}), `out of range`},
		{"checksum 2^32", entryJSON(map[string]string{"checksum": "4294967296"}), `field "checksum": 4294967296 is out of range (max 4294967295)`},
		{"prefix hash 2^32", entryJSON(map[string]string{"prefix_hash": "4294967296"}), `field "prefix_hash": 4294967296 is out of range`},
		{"timestamp huge", entryJSON(map[string]string{"timestamp": "9223372036854775808"}), `field "timestamp": 9223372036854775808 is out of range`},
		{"timestamp tiny", entryJSON(map[string]string{"timestamp": "-9223372036854775809"}), `field "timestamp": -9223372036854775809 is out of range`},
		{"timestamp float", entryJSON(map[string]string{"timestamp": "1.5"}), `field "timestamp": expected an integer, got 1.5`},
		{"timestamp string", entryJSON(map[string]string{"timestamp": `"1"`}), `field "timestamp": expected an integer, got a string`},
		{"leading zero", entryJSON(map[string]string{"timestamp": "012"}), `expected ',' or '}'`},
		{"plus sign", entryJSON(map[string]string{"sequence_id": "+7"}), `expected a value`},
		{"bare minus", `{"sequence_id":-}`, `invalid number`},
		{"bare minus timestamp", `{"timestamp":-x}`, `invalid number`},
		{"bad fraction", entryJSON(map[string]string{"sequence_id": "1."}), `invalid number`},
		{"bad exponent", entryJSON(map[string]string{"sequence_id": "1e"}), `invalid number`},
		{"source on PUT_REVOKE", entryJSON(map[string]string{"op_type": `"PUT_REVOKE"`}), `field "source": must be empty on a PUT_REVOKE entry, got "remove"`},
		{"payload on REMOVE", entryJSON(map[string]string{"payload": `"x"`}), `field "payload": must be empty on a REMOVE entry`},
		{"no payload on PUT_END", entryJSON(map[string]string{"op_type": `"PUT_END"`, "source": `""`}), `field "payload": empty on a PUT_END entry`},
		{"duplicate", strings.Replace(entryJSON(nil), `"key":"a/b"`, `"key":"a/b","key":"a/c"`, 1), `field "key": appears twice`},
		{"duplicate source", strings.Replace(entryJSON(nil), `}`, `,"source":"remove"}`, 1), `field "source": appears twice`},
		{"trailing data", entryJSON(nil) + " x", "invalid JSON at offset"},
		{"two objects", entryJSON(nil) + entryJSON(nil), "data after the top-level value"},
		{"trailing comma", strings.Replace(entryJSON(nil), `}`, `,}`, 1), "expected a field name"},
		{"missing colon", `{"sequence_id" 1}`, "expected ':'"},
		{"missing value", `{"sequence_id":}`, "expected a value"},
		{"missing comma", `{"sequence_id":1 "x":2}`, "expected ',' or '}'"},
		{"unquoted name", `{sequence_id:1}`, "expected a field name"},
		{"single quotes", `{'sequence_id':1}`, "expected a field name"},
		{"invalid UTF-8 key", entryJSON(map[string]string{"key": "\"a\xffb\""}), "invalid UTF-8 in string"},
		{"invalid UTF-8 unknown", `{"x":"` + "\xc3" + `"}`, "invalid UTF-8 in string"},
		{"lone high surrogate", entryJSON(map[string]string{"key": `"\ud800"`}), "lone UTF-16 surrogate"},
		{"lone low surrogate", entryJSON(map[string]string{"key": `"\udc00"`}), "lone UTF-16 surrogate"},
		{"high then non-low", entryJSON(map[string]string{"key": `"\ud800\u0041"`}), "lone UTF-16 surrogate"},
		{"high then text", entryJSON(map[string]string{"key": `"\ud800xx"`}), "lone UTF-16 surrogate"},
		{"bad escape", entryJSON(map[string]string{"key": `"\x"`}), "invalid escape in string"},
		{"bad hex", entryJSON(map[string]string{"key": `"\u00g0"`}), `invalid \u escape`},
		{"bad hex in low surrogate", entryJSON(map[string]string{"key": `"\ud800\uzzzz"`}), `invalid \u escape`},
		{"raw control char", entryJSON(map[string]string{"key": "\"a\nb\""}), "control character in string"},
		{"raw control char after escape", entryJSON(map[string]string{"key": "\"\\n\tb\""}), "control character in string"},
		{"invalid UTF-8 after escape", entryJSON(map[string]string{"key": "\"\\n\xffb\""}), "invalid UTF-8 in string"},
		{"unterminated string", `{"key":"abc`, "unexpected end of input"},
		{"unterminated escaped string", `{"key":"a\nb`, "unexpected end of input"},
		{"truncated escape", `{"key":"a\`, "unexpected end of input"},
		{"truncated unicode escape", `{"key":"a\u12`, "unexpected end of input"},
		{"bad literal", `{"x":tru}`, "invalid literal"},
		{"bad unknown value", `{"x":@}`, "expected a value"},
		{"bad array", `{"x":[1 2]}`, "expected ',' or ']'"},
		{"unterminated array", `{"x":[1,`, "unexpected end of input"},
		{"too deep", deep, "nesting too deep"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := oplog.Decode([]byte(tt.in))
			require.Error(t, err)
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "%v", err)
			assert.ErrorContains(t, err, tt.msg)
		})
	}
}

func TestDecodeTruncated(t *testing.T) {
	enc := oplog.NewEntry(9, 1, oplog.OpPutEnd, "k\"é", samplePayload, 1, oplog.SourceNone).Encode()
	for n := range len(enc) {
		_, err := oplog.Decode(enc[:n])
		require.Error(t, err, "prefix %q", enc[:n])
		require.Equal(t, errcode.InvalidParams, errcode.Of(err))
	}
}

func TestEntryJSONMarshaler(t *testing.T) {
	type wrapper struct {
		Entries []oplog.Entry `json:"entries"`
		One     *oplog.Entry  `json:"one"`
	}
	in := wrapper{Entries: []oplog.Entry{
		oplog.NewEntry(1, 5, oplog.OpPutEnd, "k<&>", samplePayload, 1, oplog.SourceNone),
		oplog.NewEntry(2, 6, oplog.OpRemove, "k<&>", "", 2, oplog.SourceDiscard),
	}}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	assert.Equal(t, `{"entries":[`+string(in.Entries[0].Encode())+`,`+string(in.Entries[1].Encode())+`],"one":null}`, string(b))

	var out wrapper
	require.NoError(t, json.Unmarshal(b, &out))
	assert.Equal(t, in, out)

	// null leaves an entry as it was.
	e := in.Entries[0]
	require.NoError(t, json.Unmarshal([]byte(" null "), &e))
	assert.Equal(t, in.Entries[0], e)

	err = json.Unmarshal([]byte(`{"entries":[{"sequence_id":0}]}`), &out)
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
	assert.ErrorContains(t, err, `field "sequence_id": must be >= 1`)
}
