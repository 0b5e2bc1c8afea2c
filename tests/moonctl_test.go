package tests

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMoonctl drives the CLI binary against a real cluster: exit status 0
// and the expected output on success, 1 and the error-code name on stderr
// on failure, JSON with --json.
func TestMoonctl(t *testing.T) {
	c := StartCluster(t, t.TempDir(), 3)
	moonctl := func(args ...string) (string, string, int) {
		return c.Moonctl(append([]string{"--timeout", "20s"}, args...)...)
	}
	require.Eventually(t, func() bool {
		out, _, _ := moonctl("status")
		return strings.Contains(out, " leader ")
	}, 20*time.Second, 100*time.Millisecond)

	steps := []struct {
		args     []string
		code     int
		contains string // in stdout on success, stderr on failure
	}{
		{[]string{"mount", "--client", "c1", "--segment", "seg1", "--size", "1048576"}, 0, "OK"},
		{[]string{"mount", "--client", "c1", "--segment", "seg2", "--size", "0", "--base", "9999999"}, 1, "INVALID_PARAMS"},
		{[]string{"ping", "--client", "c1"}, 0, "OK"},
		{[]string{"ping", "--client", "nobody"}, 0, "NEED_REMOUNT"},
		{[]string{"put", "a/1", "--size", "4096", "--client", "c1"}, 0, "COMPLETE"},
		{[]string{"put", "a/1", "--size", "4096", "--client", "c1"}, 1, "OBJECT_ALREADY_EXISTS"},
		{[]string{"put-start", "a/2", "--size", "100", "--client", "c1", "--soft-pin"}, 0, "PROCESSING"},
		{[]string{"get", "a/2"}, 1, "REPLICA_IS_NOT_READY"},
		{[]string{"put-end", "a/2", "--client", "c2"}, 1, "ILLEGAL_CLIENT"},
		{[]string{"put-end", "a/2", "--client", "c1"}, 0, "OK"},
		{[]string{"put-start", "a/3", "--size", "100", "--client", "c1"}, 0, "PROCESSING"},
		{[]string{"put-revoke", "a/3", "--client", "c1"}, 0, "OK"},
		{[]string{"get", "a/1"}, 0, "seg1@"},
		{[]string{"exist", "a/3"}, 0, "false"},
		{[]string{"ls", "--regex", "^a/"}, 0, "a/2"},
		{[]string{"rm", "a/1"}, 1, "OBJECT_HAS_LEASE"},
		{[]string{"rm", "a/1", "--force"}, 0, "removed 1"},
		{[]string{"rm", "--regex", "("}, 1, "INVALID_PARAMS"},
		{[]string{"rm", "--all", "--force"}, 0, "removed 1"},
		{[]string{"get", "a/1"}, 1, "OBJECT_NOT_FOUND"},
		{[]string{"upsert", "b/1", "--size", "100", "--client", "c1"}, 0, "COMPLETE"},
		{[]string{"get", "b/1"}, 0, "seg1@"},
		{[]string{"upsert", "b/1", "--size", "200", "--client", "c1"}, 0, "COMPLETE"}, // leased by the get: a fresh copy
		{[]string{"put", "b/2", "--size", "100", "--client", "c1"}, 0, "COMPLETE"},
		{[]string{"rm", "b/2", "nope", "--force"}, 1, "1 of 2 keys not removed"},
		{[]string{"exist", "b/2"}, 0, "false"},
		{[]string{"segment", "status", "seg1"}, 0, "OK"},
		{[]string{"segment", "status", "nope"}, 1, "SEGMENT_NOT_FOUND"},
		{[]string{"unmount", "--client", "c1", "--segment", "seg1", "--graceful", "--grace", "1m"}, 0, "OK"},
		{[]string{"segment", "status"}, 0, "GRACEFULLY_UNMOUNTING"}, // b/1's lease holds it
		{[]string{"ping", "--client", "c1"}, 0, "view version"},
		{[]string{"unmount", "--client", "c1", "--segment", "seg1"}, 0, "OK"},
		{[]string{"members", "list"}, 0, "Voter"},
		{[]string{"leader", "transfer"}, 0, "transferred"},
		{[]string{"status"}, 0, "APPLIED INDEX"},
		{[]string{"no-such-command"}, 2, "usage"},
	}
	for _, s := range steps {
		out, errOut, code := moonctl(s.args...)
		require.Equal(t, s.code, code, "moonctl %v: stdout %q stderr %q", s.args, out, errOut)
		if s.code == 0 {
			assert.Contains(t, out, s.contains, "moonctl %v", s.args)
		} else {
			assert.Contains(t, errOut, s.contains, "moonctl %v", s.args)
		}
	}
	_, _, code := moonctl("mount", "--client", "c1", "--segment", "seg3", "--size", "4096")
	require.Equal(t, 0, code)
	out, _, code := moonctl("segment", "status", "--json") // a global flag after the command
	require.Equal(t, 0, code)
	var segs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &segs), out)
	require.Len(t, segs, 1, "seg1 was unmounted")
	assert.Equal(t, map[string]any{"id": "seg3", "name": "seg3", "client_id": "c1", "state": "OK", "base": 0.0, "size": 4096.0,
		"used_bytes": 0.0, "objects": 0.0, "drain_until_ms": 0.0}, segs[0])
	out, _, code = moonctl("status", "--json")
	require.Equal(t, 0, code)
	var sts []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &sts), out)
	assert.Len(t, sts, 3)
	pinJSONShapes(t, moonctl, filepath.Join(t.TempDir(), "snap"))

	// Asked of any one node, members list names every member's address.
	want := map[string]string{}
	for _, p := range c.Procs {
		want[p.ID] = p.GRPCAddr
	}
	for _, p := range c.Procs {
		require.Eventually(t, func() bool {
			out, _, code := moonctl("members", "list", "--json", "--endpoints", p.GRPCAddr)
			var ms []memberJSON
			if code != 0 || json.Unmarshal([]byte(out), &ms) != nil {
				return false
			}
			got := map[string]string{}
			for _, m := range ms {
				got[m.ID] = m.GRPCAddr
			}
			return assert.ObjectsAreEqual(want, got)
		}, 10*time.Second, 100*time.Millisecond, "members list through %s", p.ID)
	}
}

type memberJSON struct {
	ID       string `json:"id"`
	GRPCAddr string `json:"grpc_addr"`
}

// pinJSONShapes runs every command with --json and checks the names and
// kinds of what it prints, so a renamed or dropped field fails here before
// it breaks a script (docs/CLI.md documents the same shapes).
func pinJSONShapes(t *testing.T, moonctl func(...string) (string, string, int), snap string) {
	object := `{"key":"string","lease_until_ms":"number","replicas":[{"buffers":[{"buffer_address":"number","segment_id":"string","segment_name":"string","size":"number"}],"status":"string"}]}`
	result := `{"result":"string"}`
	node := `{"applied_index":"number","applied_seq":"number","capacity_bytes":"number","commit_index":"number","digest":"string",` +
		`"disk_error":"string","endpoint":"string","error":"null","etcd_error":"string","etcd_export":"bool","export_backlog_ms":"number","export_deferred":"number",` +
		`"export_ring_len":"number","export_take_rate":"number","exported_seq":"number","writes_paced":"number",` +
		`"grpc_addr":"string","http_addr":"string","id":"string","last_contact_ms":"number","last_log_index":"number","leader_grpc_addr":"string","leader_id":"string","now_ms":"number",` +
		`"object_set_digest":"string","objects":"number","promoted":"bool","raft_addr":"string","read_lease_remaining_ms":"number",` +
		`"read_mode":"string","role":"string","segments":"number","sessions":"number","term":"number","used_bytes":"number"}`
	summary := `{"applied_seq":"number","bytes":"number","checksum_ok":"bool","cluster_id":"string","created_unix_ms":"number","digest":"string",` +
		`"file":"string","file_bytes":"number","format_version":"number","node_id":"string","objects":"number","raft_index":"number",` +
		`"raft_term":"number","segments":"number","sessions":"number"}`
	for _, s := range []struct {
		args  []string
		shape string
	}{
		{[]string{"mount", "--client", "c2", "--segment", "seg4", "--size", "1048576"}, result},
		{[]string{"ping", "--client", "c2"}, `{"client_status":"string","ttl_ms":"number","view_version":"number"}`},
		{[]string{"put", "j/1", "--size", "100", "--client", "c2"}, object},
		{[]string{"upsert", "j/2", "--size", "100", "--client", "c2"}, object},
		{[]string{"put-start", "j/3", "--size", "100", "--client", "c2"}, object},
		{[]string{"put-end", "j/3", "--client", "c2"}, result},
		{[]string{"put-start", "j/4", "--size", "100", "--client", "c2"}, object},
		{[]string{"put-revoke", "j/4", "--client", "c2"}, result},
		{[]string{"get", "j/1"}, object},
		{[]string{"exist", "j/1"}, `{"exists":"bool","key":"string"}`},
		{[]string{"ls", "--regex", "^j/"}, "[" + object + "]"},
		{[]string{"rm", "j/1", "--force"}, `{"removed":"number","results":[]}`},
		{[]string{"rm", "j/2", "nope", "--force"}, `{"removed":"number","results":[{"key":"string","result":"string"}]}`},
		{[]string{"rm", "--regex", "^j/", "--force"}, `{"removed":"number","results":[]}`},
		{[]string{"segment", "status", "seg4"}, `[{"base":"number","client_id":"string","drain_until_ms":"number","id":"string","name":"string",` +
			`"objects":"number","size":"number","state":"string","used_bytes":"number"}]`},
		{[]string{"members", "list"}, `[{"grpc_addr":"string","id":"string","leader":"bool","raft_addr":"string","suffrage":"string"}]`},
		{[]string{"status"}, "[" + node + "]"},
		{[]string{"snapshot", "save", snap}, summary},
		{[]string{"snapshot", "inspect", snap}, summary},
		{[]string{"snapshot", "inspect", "--restore", snap}, strings.Replace(summary, `"sessions":"number"}`, `"sessions":"number","state_digest":"string"}`, 1)},
		{[]string{"leader", "transfer"}, result},
		{[]string{"unmount", "--client", "c2", "--segment", "seg4"}, result},
	} {
		out, errOut, code := moonctl(append(s.args, "--json")...)
		if slices.Contains(s.args, "nope") { // one key not removed: exit 1, the results still printed
			require.Equal(t, 1, code, "moonctl %v: %s", s.args, errOut)
		} else {
			require.Equal(t, 0, code, "moonctl %v: %s", s.args, errOut)
		}
		var v any
		require.NoError(t, json.Unmarshal([]byte(out), &v), "moonctl %v: %s", s.args, out)
		got, err := json.Marshal(shapeOf(v))
		require.NoError(t, err)
		assert.JSONEq(t, s.shape, string(got), "moonctl %v --json: %s", s.args, out)
	}
}

// shapeOf replaces every value by its JSON kind, and an array by its first
// element's shape.
func shapeOf(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := map[string]any{}
		for k, e := range x {
			m[k] = shapeOf(e)
		}
		return m
	case []any:
		if len(x) == 0 {
			return []any{}
		}
		return []any{shapeOf(x[0])}
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}
