package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/moonraft/moonraft/errcode"
)

// command is one line of the usage: the words that select it, its flags and
// arguments, and what it does.
type command struct {
	name, args, help string
}

var commands = []command{
	{"status", "", "every node: id, addresses, role, term, applied index and seq, digest"},
	{"mount", "--client C --segment NAME --size N [--base ADDR]", "mount a segment for client C"},
	{"unmount", "--client C --segment NAME [--graceful [--grace D]]",
		"--graceful: no new allocations now, unmounted once nothing on it is leased or written, or after D (0: the server's bound)"},
	{"segment status", "[NAME] [--id]", "one segment by name (or id), or every one"},
	{"ping", "--client C", "the client's session: OK or NEED_REMOUNT, its TTL and the view version"},
	{"put", "KEY --size N [--replicas R] [--client C] [--soft-pin]", "PutStart then PutEnd"},
	{"upsert", "KEY --size N [--replicas R] [--client C] [--soft-pin]", "UpsertStart then UpsertEnd"},
	{"put-start", "KEY --size N [--replicas R] [--client C] [--soft-pin]", "PutStart only: the object stays PROCESSING"},
	{"put-end", "KEY [--client C]", "PutEnd of a put-start"},
	{"put-revoke", "KEY [--client C]", "PutRevoke of a put-start"},
	{"get", "KEY", "the object's replicas (grants a read lease)"},
	{"exist", "KEY", "whether the object exists and is complete"},
	{"ls", "[--regex RE]", "every object (or those matching RE) and its replica count"},
	{"rm", "KEY... [--force] | rm --regex RE [--force] | rm --all [--force]",
		"several keys: one BatchRemove, a result per key; --force removes leased objects too"},
	{"members list", "", "the Raft configuration: every member's id, addresses, suffrage, leader"},
	{"members add", "ID RAFTADDR", "add a voter (leader only)"},
	{"members remove", "ID", "remove a member (leader only)"},
	{"leader transfer", "[ID]", "hand leadership to ID, or to the most up-to-date follower"},
	{"snapshot save", "FILE", "stream a fresh snapshot from the leader into FILE (atomically)"},
	{"snapshot inspect", "[--restore] FILE", "verify FILE and show its header, counts and digest (--restore: also restore it in memory and show the state's digest)"},
	{"snapshot restore", "FILE", "install FILE on the live cluster (every node)"},
	{"snapshot restore", "--offline --data-dir DIR --id ID --peers id=raftaddr,... [--replay-etcd [--etcd-endpoints URLS] [--allow-gap]] [--cluster-id C] [--raft-log-store S] [--force] FILE",
		"seed a fresh data directory for a lost cluster"},
	{"oplog tail", "[--from SEQ] [--follow] [--etcd-endpoints URLS] [--etcd-prefix P] [--cluster-id C]",
		"OpLog entries as stored in etcd"},
}

const globalUsage = `usage: moonctl [global flags] COMMAND [ARGS]

global flags, before or after the command:
  --endpoints host:port,...   gRPC addresses of cluster members (default 127.0.0.1:7100)
  --json                      JSON output, and errors as JSON on stderr
  --timeout D                 give up after D (default 10s; snapshot commands 30m)
  --tls-ca F                  verify the masters with this CA (turns TLS on)
  --tls-cert F --tls-key F    client certificate, for masters that require one
  --tls-server-name N         name to verify in the masters' certificates
  --admin-token-file F        the admin token (members, leader transfer, snapshot save/restore, rm --all)
  --admin-token T             the same, on the command line (visible in ps)

exit status: 0 success, 1 the cluster refused or failed (the Mooncake error
code on stderr), 2 bad usage. docs/CLI.md describes every command's output.
`

// usage returns the usage of the commands whose first word is cmd, or of
// every command when cmd is none of them.
func usage(cmd string) string {
	var b strings.Builder
	for _, c := range commands {
		if strings.Fields(c.name)[0] == cmd {
			writeCommand(&b, c)
		}
	}
	if b.Len() > 0 {
		return "usage: moonctl [global flags] " + strings.TrimPrefix(b.String(), "  ") + "\nmoonctl --help lists the global flags.\n"
	}
	b.WriteString(globalUsage + "\ncommands:\n")
	for _, c := range commands {
		writeCommand(&b, c)
	}
	return b.String()
}

func writeCommand(b *strings.Builder, c command) {
	fmt.Fprintf(b, "  %s", c.name)
	if c.args != "" {
		fmt.Fprintf(b, " %s", c.args)
	}
	fmt.Fprintf(b, "\n      %s\n", c.help)
}

// usageError is a command line moonctl cannot run: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func badUsage(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// errReported fails a command whose output already says what went wrong.
var errReported = errors.New("reported in the output")

// errArgs is the usual usageError: the arguments do not fit the command.
var errArgs = badUsage("wrong arguments")

// splitGlobal takes the global flags out of args wherever they stand (as
// etcdctl and kubectl accept them), leaving the command and its own flags
// in order. Everything after "--" is left alone.
func splitGlobal(g *flag.FlagSet, args []string) (global, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return global, append(rest, args[i:]...)
		}
		name, hasValue := flagName(a)
		f := g.Lookup(name)
		if f == nil {
			rest = append(rest, a)
			continue
		}
		global = append(global, a)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) && i+1 < len(args) {
			i++
			global = append(global, args[i])
		}
	}
	return global, rest
}

// flagName returns the name of a -flag or --flag argument ("" if a is not
// one) and whether it carries its value (--flag=value).
func flagName(a string) (string, bool) {
	if len(a) < 2 || a[0] != '-' {
		return "", false
	}
	name := strings.TrimPrefix(a[1:], "-")
	name, _, hasValue := strings.Cut(name, "=")
	return name, hasValue
}

// flags parses a command's flags; positional arguments may come before or
// after them ("put KEY --size 10" and "put --size 10 KEY" both work). An
// unknown or malformed flag is a usageError; def may be nil for a command
// without flags.
func flags(name string, args []string, def func(*flag.FlagSet)) ([]string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if def != nil {
		def(fs)
	}
	var literal []string // after "--": positional, whatever they look like
	if i := slices.Index(args, "--"); i >= 0 {
		args, literal = args[:i], args[i+1:]
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, badUsage("%s: %v", name, err)
		}
		if fs.NArg() == 0 {
			return append(pos, literal...), nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// errorJSON is how an error is written with --json.
type errorJSON struct {
	Code    int32  `json:"code"`
	Name    string `json:"name"`
	Message string `json:"message"`
	Usage   string `json:"usage,omitempty"`
}

func toErrorJSON(err error) errorJSON {
	code := errcode.Of(err)
	// The name has its own field; a coded error's text starts with it.
	msg := strings.TrimPrefix(err.Error(), code.String()+": ")
	return errorJSON{Code: int32(code), Name: code.String(), Message: msg}
}

// fail reports err on stderr (as JSON with --json) and returns the exit
// status: 2 for a usage error (with the command's usage), 0 for --help
// (the usage on stdout), else 1.
func (c *cli) fail(cmd string, err error) int {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(c.out, usage(cmd))
		return 0
	}
	if errors.Is(err, errReported) {
		return 1
	}
	var ue *usageError
	if errors.As(err, &ue) {
		if c.json {
			c.writeErrorJSON(errorJSON{Code: int32(errcode.InvalidParams), Name: errcode.InvalidParams.String(), Message: ue.msg, Usage: usage(cmd)})
		} else {
			fmt.Fprintf(c.errOut, "moonctl: %s\n%s", ue.msg, usage(cmd))
		}
		return 2
	}
	if c.json {
		c.writeErrorJSON(toErrorJSON(err))
		return 1
	}
	var coded *errcode.Error
	if errors.As(err, &coded) {
		fmt.Fprintln(c.errOut, err) // already starts with the code name
	} else {
		fmt.Fprintf(c.errOut, "%s: %v\n", errcode.Of(err), err)
	}
	return 1
}

func (c *cli) writeErrorJSON(e errorJSON) {
	b, _ := json.Marshal(e) // a struct of strings and an int always encodes
	fmt.Fprintf(c.errOut, "%s\n", b)
}
