package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
	"testing"
	"time"

	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSplitGlobal(t *testing.T) {
	g := flag.NewFlagSet("g", flag.ContinueOnError)
	g.String("endpoints", "", "")
	g.Bool("json", false, "")
	g.Duration("timeout", 0, "")
	for _, tc := range []struct {
		args, global, rest []string
	}{
		{[]string{"status"}, nil, []string{"status"}},
		{[]string{"--json", "status"}, []string{"--json"}, []string{"status"}},
		{[]string{"status", "--json"}, []string{"--json"}, []string{"status"}},
		{[]string{"put", "k", "--endpoints", "a:1", "--size", "4"}, []string{"--endpoints", "a:1"}, []string{"put", "k", "--size", "4"}},
		{[]string{"get", "-timeout=2s", "k", "-json=false"}, []string{"-timeout=2s", "-json=false"}, []string{"get", "k"}},
		{[]string{"rm", "--force", "--", "--json"}, nil, []string{"rm", "--force", "--", "--json"}},
		{[]string{"ls", "--timeout"}, []string{"--timeout"}, []string{"ls"}}, // Parse reports the missing value
	} {
		global, rest := splitGlobal(g, tc.args)
		assert.Equal(t, tc.global, global, "%v", tc.args)
		assert.Equal(t, tc.rest, rest, "%v", tc.args)
	}
}

func TestFlagsKeepsPositionalsAfterDoubleDash(t *testing.T) {
	var force bool
	pos, err := flags("rm", []string{"a", "--force", "--", "--json", "-x"}, func(fs *flag.FlagSet) { fs.BoolVar(&force, "force", false, "") })
	require.NoError(t, err)
	assert.True(t, force)
	assert.Equal(t, []string{"a", "--json", "-x"}, pos)
}

// TestUsage: what a script sees for a command line moonctl cannot run,
// before any node is asked (the endpoint is never dialled).
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args         []string
		code         int
		stdout       string // contained in
		stderr       string // contained in
		stderrAbsent string
	}{
		{args: []string{"status", "--bogus"}, code: 2, stderr: "usage: moonctl [global flags] status"},
		{args: []string{"--bogus", "status"}, code: 2, stderr: "flag provided but not defined: --bogus"},
		{args: []string{"ls", "--bogus"}, code: 2, stderr: "ls: flag provided but not defined: -bogus"},
		{args: []string{"get", "a", "b"}, code: 2, stderr: "usage: moonctl [global flags] get KEY"},
		{args: []string{"members", "list", "--all"}, code: 2, stderr: "members add ID RAFTADDR"},
		{args: []string{"leader", "transfer", "--to", "n1"}, code: 2, stderr: "leader transfer [ID]"},
		{args: []string{"segment", "list"}, code: 2, stderr: "segment takes one subcommand: status"},
		{args: []string{"snapshot", "save"}, code: 2, stderr: "snapshot inspect [--restore] FILE"},
		{args: []string{"oplog", "tail", "extra"}, code: 2, stderr: "oplog tail [--from SEQ]"},
		{args: []string{"frob"}, code: 2, stderr: `unknown command "frob"`},
		{args: nil, code: 2, stderr: "commands:"},
		{args: []string{"--timeout", "soon", "status"}, code: 2, stderr: `invalid value "soon" for flag -timeout`},
		{args: []string{"put", "k", "--admin-token", "a", "--admin-token-file", "f"}, code: 2, stderr: "not both"},
		{args: []string{"--help"}, code: 0, stdout: "global flags, before or after the command", stderrAbsent: "usage"},
		{args: []string{"put", "-h"}, code: 0, stdout: "usage: moonctl [global flags] put KEY --size N"},
		{args: []string{"put", "--size", "4", "--help"}, code: 0, stdout: "PutStart then PutEnd"},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"--endpoints", "127.0.0.1:1"}, tc.args...), &out, &errOut)
		assert.Equal(t, tc.code, code, "moonctl %v: stderr %q", tc.args, errOut.String())
		assert.Contains(t, out.String(), tc.stdout, "moonctl %v", tc.args)
		assert.Contains(t, errOut.String(), tc.stderr, "moonctl %v", tc.args)
		if tc.stderrAbsent != "" {
			assert.NotContains(t, errOut.String(), tc.stderrAbsent, "moonctl %v", tc.args)
		}
	}
}

// TestErrorsAsJSON: with --json, before or after the command, an error is
// one JSON object on stderr, with the same exit status as in text.
func TestErrorsAsJSON(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		code  int
		want  errorJSON
		usage bool
	}{
		{[]string{"--json", "ls", "--bogus"}, 2, errorJSON{Code: -600, Name: "INVALID_PARAMS", Message: "ls: flag provided but not defined: -bogus"}, true},
		{[]string{"frob", "--json"}, 2, errorJSON{Code: -600, Name: "INVALID_PARAMS", Message: `unknown command "frob"`}, true},
		{[]string{"--json", "--timeout", "x", "get", "k"}, 2, errorJSON{Code: -600, Name: "INVALID_PARAMS", Message: `invalid value "x" for flag -timeout: parse error`}, true},
		{[]string{"get", "k", "--json", "--timeout", "300ms"}, 1, errorJSON{Code: -1010, Name: "UNAVAILABLE_IN_CURRENT_STATUS"}, false},
		{[]string{"snapshot", "inspect", "/nonexistent/snap", "--json"}, 1, errorJSON{Code: -1100, Name: "FILE_NOT_FOUND"}, false},
	} {
		var out, errOut bytes.Buffer
		start := time.Now()
		code := run(append([]string{"--endpoints", "127.0.0.1:1"}, tc.args...), &out, &errOut)
		require.Equal(t, tc.code, code, "moonctl %v: stderr %q", tc.args, errOut.String())
		assert.Less(t, time.Since(start), 5*time.Second)
		assert.Empty(t, out.String())
		var got errorJSON
		require.NoError(t, json.Unmarshal(errOut.Bytes(), &got), "moonctl %v: stderr %q", tc.args, errOut.String())
		assert.Equal(t, tc.want.Code, got.Code)
		assert.Equal(t, tc.want.Name, got.Name)
		assert.NotEmpty(t, got.Message)
		if tc.want.Message != "" {
			assert.Equal(t, tc.want.Message, got.Message)
		}
		assert.Equal(t, tc.usage, got.Usage != "", "usage given only for a usage error")
	}
}

// The leader's export line: etcd's rate, the writes paced, and why etcd
// takes nothing when it does not.
func TestPrintExport(t *testing.T) {
	for _, tc := range []struct {
		st   *moonraftpb.NodeStatus
		want string
	}{
		{&moonraftpb.NodeStatus{Id: "n1", ExportTakeRate: 9512.4, WritesPaced: 12},
			"n1: export to etcd: ~9512 entries/s; 12 writes paced now; 0 removals deferred\n"},
		{&moonraftpb.NodeStatus{Id: "n1", ExportDeferred: 5000}, "n1: export to etcd: rate not measured yet; 0 writes paced now; 5000 removals deferred\n"},
		{&moonraftpb.NodeStatus{Id: "n2", ExportTakeRate: 100, EtcdError: "context deadline exceeded"},
			"n2: export to etcd: ~100 entries/s; 0 writes paced now; 0 removals deferred\nn2: etcd takes no OpLog entries: context deadline exceeded\n"},
	} {
		var b strings.Builder
		printExport(&b, tc.st)
		assert.Equal(t, tc.want, b.String())
	}
}
