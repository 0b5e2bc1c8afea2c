package mooncakeapi

import (
	"bufio"
	"encoding/hex"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/moonraft/moonraft/cororpc"
	"github.com/moonraft/moonraft/structpack"
	"github.com/stretchr/testify/require"
)

type goldenFrame struct {
	resp  bool
	id    uint32
	frame []byte
}

func readGolden(t *testing.T) []goldenFrame {
	f, err := os.Open("testdata/golden.txt")
	require.NoError(t, err)
	defer f.Close()
	var out []goldenFrame
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		fields := strings.Fields(line)
		require.Len(t, fields, 3, line)
		id, err := strconv.ParseUint(fields[1], 16, 32)
		require.NoError(t, err)
		b, err := hex.DecodeString(fields[2])
		require.NoError(t, err)
		out = append(out, goldenFrame{resp: fields[0] == "resp", id: uint32(id), frame: b})
	}
	require.NoError(t, sc.Err())
	return out
}

// TestGoldenFrames: every frame the real Mooncake client and master
// exchanged decodes into the Go types, and encodes back to the same bytes.
func TestGoldenFrames(t *testing.T) {
	for _, g := range readGolden(t) {
		fn, ok := Functions[g.id]
		require.True(t, ok, "function id %08x not in the table", g.id)
		name := fn.Name + " request"
		typ, body := fn.Args, []byte(nil)
		if g.resp {
			name, typ = fn.Name+" response", fn.Result
			resp, err := cororpc.ReadResponse(strings.NewReader(string(g.frame)))
			require.NoError(t, err, name)
			require.Equal(t, cororpc.ErrcOK, resp.Header.Errc, name)
			body = resp.Body
		} else {
			req, err := cororpc.ReadRequest(strings.NewReader(string(g.frame)))
			require.NoError(t, err, name)
			require.Equal(t, g.id, req.Header.FunctionID)
			body = req.Body
		}
		t.Run(name, func(t *testing.T) {
			if typ == nil {
				require.Empty(t, body)
				return
			}
			lit, err := structpack.Literal(typ)
			require.NoError(t, err)
			require.GreaterOrEqual(t, len(body), 5+len(lit))
			require.Equal(t, hex.EncodeToString(body[5:5+len(lit)+1]), hex.EncodeToString(append(lit, 0)), "type literal of %v", typ)
			v := reflect.New(typ)
			require.NoError(t, structpack.Unmarshal(body, v.Interface()))
			again, err := structpack.Marshal(v.Elem().Interface())
			require.NoError(t, err)
			if !hasMap(typ) {
				require.Equal(t, hex.EncodeToString(body), hex.EncodeToString(again))
				return
			}
			// An unordered_map goes in the master's hash order, moonraft's
			// maps in key order: the same value, the same length.
			require.Len(t, again, len(body))
			w := reflect.New(typ)
			require.NoError(t, structpack.Unmarshal(again, w.Interface()))
			require.Equal(t, v.Elem().Interface(), w.Elem().Interface())
		})
	}
}

// hasMap says whether a value of typ can hold a map.
func hasMap(typ reflect.Type) bool {
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type) bool
	walk = func(t reflect.Type) bool {
		if seen[t] {
			return false
		}
		seen[t] = true
		switch t.Kind() {
		case reflect.Map:
			return true
		case reflect.Pointer, reflect.Slice, reflect.Array:
			return walk(t.Elem())
		case reflect.Struct:
			for i := range t.NumField() {
				if walk(t.Field(i).Type) {
					return true
				}
			}
		}
		return false
	}
	return walk(typ)
}
