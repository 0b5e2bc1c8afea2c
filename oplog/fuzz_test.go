package oplog_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// The seed corpus is in testdata/fuzz/<Name>/.

func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := oplog.Decode(b)
		if err != nil {
			if errcode.Of(err) != errcode.InvalidParams {
				t.Fatalf("error without INVALID_PARAMS: %v", err)
			}
			return
		}
		if !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		enc := e.Encode()
		std, err := json.Marshal(mirrorOf(e))
		if err != nil {
			t.Fatal(err)
		}
		if string(enc) != string(std) {
			t.Fatalf("Encode differs from encoding/json:\n%s\n%s", enc, std)
		}
		again, err := oplog.Decode(enc)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", enc, err)
		}
		if again != e {
			t.Fatalf("round trip changed the entry:\n%+v\n%+v", e, again)
		}
	})
}

func FuzzDecodePutEndPayload(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		p, err := oplog.DecodePutEndPayload(s)
		if err != nil {
			if errcode.Of(err) != errcode.InvalidParams {
				t.Fatalf("error without INVALID_PARAMS: %v", err)
			}
			return
		}
		if !json.Valid([]byte(s)) {
			t.Fatalf("accepted invalid JSON %q", s)
		}
		enc := oplog.EncodePutEndPayload(p)
		again, err := oplog.DecodePutEndPayload(enc)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", enc, err)
		}
		if !reflect.DeepEqual(again, p) {
			t.Fatalf("round trip changed the payload:\n%+v\n%+v", p, again)
		}
	})
}
