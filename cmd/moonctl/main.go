// Command moonctl is the moonraft CLI: data operations, status, members,
// leadership, snapshots and the OpLog. Global flags (--endpoints, --json,
// ...) go before or after the command; it exits 0 on success, 1 with the
// Mooncake error code on stderr when the request failed, 2 on bad usage
// (docs/CLI.md).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/listflag"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/transport"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// cli is one invocation: its output streams and global options.
type cli struct {
	out, errOut io.Writer
	json        bool
	client      *moonclient.Client
	endpoints   []string
}

func run(args []string, stdout, stderr io.Writer) int {
	g := flag.NewFlagSet("moonctl", flag.ContinueOnError)
	g.SetOutput(io.Discard)
	endpoints := g.String("endpoints", "127.0.0.1:7100", "comma-separated gRPC addresses of cluster members")
	asJSON := g.Bool("json", false, "print JSON")
	timeout := g.Duration("timeout", 10*time.Second, "give up after this long (snapshot commands: 30m unless given)")
	var tlsFiles transport.TLSFiles
	g.StringVar(&tlsFiles.Cert, "tls-cert", "", "client certificate (PEM)")
	g.StringVar(&tlsFiles.Key, "tls-key", "", "client key (PEM)")
	g.StringVar(&tlsFiles.CA, "tls-ca", "", "CA that signs the masters' certificates (PEM)")
	g.StringVar(&tlsFiles.ServerName, "tls-server-name", "", "name to verify in the masters' certificates instead of the host dialled")
	tokenFile := g.String("admin-token-file", "", "file holding the admin token")
	token := g.String("admin-token", "", "the admin token (visible to other users in ps; prefer --admin-token-file)")
	help := g.Bool("help", false, "print the usage")
	g.BoolVar(help, "h", false, "print the usage")

	global, rest := splitGlobal(g, args)
	c := &cli{out: stdout, errOut: stderr, json: slices.ContainsFunc(global, isJSONFlag)}
	cmd := ""
	if len(rest) > 0 {
		cmd = rest[0]
	}
	if err := g.Parse(global); err != nil {
		return c.fail(cmd, badUsage("%v", err))
	}
	c.json = *asJSON
	switch {
	case *help:
		return c.fail(cmd, flag.ErrHelp)
	case cmd == "":
		return c.fail(cmd, badUsage("no command"))
	case strings.HasPrefix(cmd, "-"):
		return c.fail("", badUsage("flag provided but not defined: %s", cmd))
	case *tokenFile != "" && *token != "":
		return c.fail(cmd, badUsage("give --admin-token-file or --admin-token, not both"))
	}
	c.endpoints = listflag.Split(*endpoints)
	ccfg := moonclient.Config{Endpoints: c.endpoints, AdminToken: *token}
	if *tokenFile != "" {
		tok, err := transport.ReadTokenFile(*tokenFile)
		if err != nil {
			return c.fail(cmd, err)
		}
		ccfg.AdminToken = tok
	}
	if tlsFiles.Enabled() {
		tc, err := tlsFiles.ClientConfig()
		if err != nil {
			return c.fail(cmd, err)
		}
		ccfg.TLS = tc
	}
	client, err := moonclient.Dial(ccfg)
	if err != nil {
		return c.fail(cmd, err)
	}
	defer client.Close()
	c.client = client
	if cmd == "snapshot" && !flagSet(g, "timeout") {
		*timeout = 30 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := c.dispatch(ctx, cmd, rest[1:]); err != nil {
		return c.fail(cmd, err)
	}
	return 0
}

// isJSONFlag tells whether a global flag argument asks for JSON, so that an
// error in the other global flags is reported as JSON too.
func isJSONFlag(a string) bool {
	name, _ := flagName(a)
	return name == "json" && !strings.HasSuffix(a, "=false")
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func (c *cli) dispatch(ctx context.Context, cmd string, args []string) error {
	switch cmd {
	case "status":
		return c.status(ctx, args)
	case "mount", "unmount", "ping":
		return c.segment(ctx, cmd, args)
	case "put", "put-start", "upsert":
		return c.put(ctx, cmd, args)
	case "segment":
		if len(args) == 0 || args[0] != "status" {
			return badUsage("segment takes one subcommand: status")
		}
		return c.segmentStatus(ctx, args[1:])
	case "put-end", "put-revoke":
		return c.putFinish(ctx, cmd, args)
	case "get", "exist", "ls":
		return c.read(ctx, cmd, args)
	case "rm":
		return c.rm(ctx, args)
	case "members":
		return c.members(ctx, args)
	case "snapshot":
		return c.snapshot(ctx, args)
	case "oplog":
		if len(args) == 0 || args[0] != "tail" {
			return badUsage("oplog takes one subcommand: tail")
		}
		return c.oplogTail(ctx, args[1:])
	case "leader":
		return c.leader(ctx, args)
	}
	return badUsage("unknown command %q", cmd)
}

func (c *cli) leader(ctx context.Context, args []string) error {
	pos, err := flags("leader", args, nil)
	if err != nil {
		return err
	}
	if len(pos) == 0 || pos[0] != "transfer" || len(pos) > 2 {
		return errArgs
	}
	id := ""
	if len(pos) == 2 {
		id = pos[1]
	}
	if err := c.client.TransferLeadership(ctx, id); err != nil {
		return err
	}
	return c.print(resultJSON{"leadership transferred"}, "leadership transferred\n")
}

// print writes v as JSON with --json, else text.
func (c *cli) print(v any, text string) error {
	if c.json {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	_, err := io.WriteString(c.out, text)
	return err
}

func (c *cli) status(ctx context.Context, args []string) error {
	pos, err := flags("status", args, nil)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return errArgs
	}
	sts, errs := c.client.StatusAll(ctx)
	if c.json {
		if err := c.print(statusJSON(c.endpoints, sts, errs), ""); err != nil {
			return err
		}
		if allNil(sts) {
			return errReported
		}
		return nil
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tRAFT ADDR\tGRPC ADDR\tROLE\tTERM\tREADS\tAPPLIED INDEX\tAPPLIED SEQ\tEXPORTED SEQ\tEXPORT LAG\tOBJECTS\tDIGEST")
	for _, s := range sts {
		if s == nil {
			continue
		}
		role := s.Role
		if s.Role == "leader" && !s.Promoted {
			role += " (promoting)"
		}
		exported, lag := "-", "-"
		if s.EtcdExport && s.Promoted { // only the leader exports
			exported = fmt.Sprint(s.ExportedSeq)
			lag = fmt.Sprintf("%d (%.1fs)", s.AppliedSeq-min(s.ExportedSeq, s.AppliedSeq), float64(s.ExportBacklogMs)/1000)
		}
		reads := s.ReadMode
		if s.Promoted && s.ReadMode == "lease" { // the leader: how long its lease still holds
			reads = fmt.Sprintf("lease (%d ms)", s.ReadLeaseRemainingMs)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\t%d\t%.16s\n", s.Id, s.RaftAddr, s.GrpcAddr, role, s.Term, reads, s.AppliedIndex, s.AppliedSeq, exported, lag, s.Objects, s.Digest)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, s := range sts {
		if s == nil {
			continue
		}
		if s.DiskError != "" {
			fmt.Fprintf(c.out, "%s: disk failing: %s\n", s.Id, s.DiskError)
		}
		if s.EtcdExport && s.Promoted {
			printExport(c.out, s)
		}
	}
	var firstErr error
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(c.errOut, "%s: %v\n", c.endpoints[i], err)
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if len(sts) == 0 || allNil(sts) {
		return firstErr
	}
	return nil
}

func allNil[T any](xs []*T) bool {
	for _, x := range xs {
		if x != nil {
			return false
		}
	}
	return true
}

func (c *cli) segment(ctx context.Context, cmd string, args []string) error {
	var client, name string
	var size, base uint64
	var graceful bool
	var grace time.Duration
	pos, err := flags(cmd, args, func(fs *flag.FlagSet) {
		fs.StringVar(&client, "client", "", "client id")
		fs.StringVar(&name, "segment", "", "segment name (also its id)")
		fs.Uint64Var(&size, "size", 0, "segment size in bytes")
		fs.Uint64Var(&base, "base", 0, "segment base address")
		if cmd == "unmount" {
			fs.BoolVar(&graceful, "graceful", false, "drain first: unmount once nothing on it is leased or written")
			fs.DurationVar(&grace, "grace", 0, "with --graceful: the longest wait (0: the server's bound)")
		}
	})
	if err != nil {
		return err
	}
	if len(pos) != 0 || client == "" || (cmd != "ping" && name == "") {
		return errArgs
	}
	switch cmd {
	case "mount":
		err = c.client.MountSegment(ctx, client, fsm.SegmentSpec{ID: name, Name: name, Base: base, Size: size})
	case "unmount":
		if graceful {
			err = c.client.GracefulUnmountSegment(ctx, client, name, grace)
		} else {
			err = c.client.UnmountSegment(ctx, client, name)
		}
	case "ping":
		p, perr := c.client.Ping(ctx, client)
		if perr != nil {
			return perr
		}
		status := "OK"
		if p.NeedRemount {
			status = "NEED_REMOUNT"
		}
		return c.print(pingJSON{status, p.TTLMs, p.ViewVersion},
			fmt.Sprintf("%s (ttl %d ms, view version %d)\n", status, p.TTLMs, p.ViewVersion))
	}
	if err != nil {
		return err
	}
	return c.print(resultJSON{"OK"}, "OK\n")
}

func (c *cli) put(ctx context.Context, cmd string, args []string) error {
	var (
		client   string
		size     uint64
		replicas uint
		softPin  bool
	)
	pos, err := flags(cmd, args, func(fs *flag.FlagSet) {
		fs.StringVar(&client, "client", "moonctl", "client id")
		fs.Uint64Var(&size, "size", 0, "object size in bytes")
		fs.UintVar(&replicas, "replicas", 1, "number of replicas (1..8)")
		fs.BoolVar(&softPin, "soft-pin", false, "soft-pin the object")
	})
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errArgs
	}
	key := pos[0]
	start, end := c.client.PutStart, c.client.PutEnd
	if cmd == "upsert" {
		start, end = c.client.UpsertStart, c.client.UpsertEnd
	}
	descs, err := start(ctx, key, []uint64{size}, moonclient.ReplicateConfig{ReplicaNum: uint32(replicas), SoftPin: softPin}, client)
	if err != nil {
		return err
	}
	if cmd != "put-start" {
		if err := end(ctx, key, client); err != nil {
			return err
		}
		for i := range descs {
			descs[i].Status = fsm.Complete.String()
		}
	}
	return c.print(objectJSON{Key: key, Replicas: descs}, replicasText(key, descs))
}

func replicasText(key string, descs []oplog.ReplicaDesc) string {
	var b strings.Builder
	for i, r := range descs {
		fmt.Fprintf(&b, "%s replica %d %s", key, i, r.Status)
		for _, buf := range r.Buffers {
			fmt.Fprintf(&b, " %s@%#x+%d", buf.SegmentName, buf.Address, buf.Size)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func (c *cli) putFinish(ctx context.Context, cmd string, args []string) error {
	var client string
	pos, err := flags(cmd, args, func(fs *flag.FlagSet) { fs.StringVar(&client, "client", "moonctl", "client id") })
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errArgs
	}
	if cmd == "put-end" {
		err = c.client.PutEnd(ctx, pos[0], client)
	} else {
		err = c.client.PutRevoke(ctx, pos[0], client)
	}
	if err != nil {
		return err
	}
	return c.print(resultJSON{"OK"}, "OK\n")
}

func (c *cli) read(ctx context.Context, cmd string, args []string) error {
	var regex string
	pos, err := flags(cmd, args, func(fs *flag.FlagSet) {
		if cmd == "ls" {
			fs.StringVar(&regex, "regex", ".*", "list keys matching this RE2 regex")
		}
	})
	if err != nil {
		return err
	}
	switch {
	case cmd == "ls" && len(pos) == 0:
		objs, err := c.client.GetReplicaListByRegex(ctx, regex)
		if err != nil {
			return err
		}
		var b strings.Builder
		for _, o := range objs {
			fmt.Fprintf(&b, "%s\t%d replica(s)\n", o.Key, len(o.Replicas))
		}
		return c.print(objectsJSON(objs), b.String())
	case cmd == "get" && len(pos) == 1:
		descs, until, err := c.client.GetReplicaList(ctx, pos[0])
		if err != nil {
			return err
		}
		return c.print(objectJSON{pos[0], descs, until}, replicasText(pos[0], descs))
	case cmd == "exist" && len(pos) == 1:
		ok, _, err := c.client.ExistKey(ctx, pos[0])
		if err != nil {
			return err
		}
		return c.print(existJSON{pos[0], ok}, fmt.Sprintln(ok))
	}
	return errArgs
}

func (c *cli) rm(ctx context.Context, args []string) error {
	var (
		regex      string
		all, force bool
	)
	pos, err := flags("rm", args, func(fs *flag.FlagSet) {
		fs.StringVar(&regex, "regex", "", "remove keys matching this RE2 regex")
		fs.BoolVar(&all, "all", false, "remove every object")
		fs.BoolVar(&force, "force", false, "remove even objects with a read lease")
	})
	if err != nil {
		return err
	}
	var removed uint64
	switch {
	case len(pos) > 1 && regex == "" && !all:
		return c.batchRemove(ctx, pos, force)
	case len(pos) == 1 && regex == "" && !all:
		err, removed = c.client.Remove(ctx, pos[0], force), 1
	case len(pos) == 0 && regex != "" && !all:
		removed, err = c.client.RemoveByRegex(ctx, regex, force)
	case len(pos) == 0 && regex == "" && all:
		removed, err = c.client.RemoveAll(ctx, force)
	default:
		return errArgs
	}
	if err != nil {
		return err
	}
	return c.print(removedJSON{Removed: removed, Results: []removeResultJSON{}}, fmt.Sprintf("removed %d\n", removed))
}

// batchRemove removes keys in one BatchRemove and reports each; it fails
// (after printing every result) when any key was not removed.
func (c *cli) batchRemove(ctx context.Context, keys []string, force bool) error {
	errs, err := c.client.BatchRemove(ctx, keys, force)
	if err != nil {
		return err
	}
	var (
		results []removeResultJSON
		text    strings.Builder
		removed uint64
		first   error
	)
	for i, e := range errs {
		r := removeResultJSON{keys[i], "OK"}
		if e != nil {
			r.Result = e.Error()
			first = cmp.Or(first, e)
		} else {
			removed++
		}
		results = append(results, r)
		fmt.Fprintf(&text, "%s\t%s\n", r.Key, r.Result)
	}
	fmt.Fprintf(&text, "removed %d of %d\n", removed, len(keys))
	if err := c.print(removedJSON{removed, results}, text.String()); err != nil {
		return err
	}
	if first != nil {
		return errcode.New(errcode.Of(first), "%d of %d keys not removed", uint64(len(keys))-removed, len(keys))
	}
	return nil
}

// segmentStatus prints one segment (by name, or id with --id) or every one.
func (c *cli) segmentStatus(ctx context.Context, args []string) error {
	var byID bool
	pos, err := flags("segment status", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&byID, "id", false, "NAME is the segment's id")
	})
	if err != nil {
		return err
	}
	var sts []moonclient.SegmentStatus
	switch len(pos) {
	case 0:
		sts, err = c.client.ListSegments(ctx)
	case 1:
		var st moonclient.SegmentStatus
		st, err = c.client.QuerySegmentStatus(ctx, pos[0], byID)
		sts = []moonclient.SegmentStatus{st}
	default:
		return errArgs
	}
	if err != nil {
		return err
	}
	if c.json {
		return c.print(segmentsJSON(sts), "")
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tNAME\tCLIENT\tSTATE\tSIZE\tUSED\tOBJECTS\tDRAIN UNTIL")
	for _, st := range sts {
		until := "-"
		if st.DrainUntilMs != 0 {
			until = time.UnixMilli(st.DrainUntilMs).UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", st.Segment.ID, st.Segment.Name, st.ClientID, st.State,
			st.Segment.Size, st.UsedBytes, st.Objects, until)
	}
	return w.Flush()
}

func (c *cli) members(ctx context.Context, args []string) error {
	args, err := flags("members", args, nil)
	if err != nil {
		return err
	}
	switch {
	case len(args) == 1 && args[0] == "list":
		ms, err := c.client.Members(ctx)
		if err != nil {
			return err
		}
		if c.json {
			return c.print(membersJSON(ms), "")
		}
		w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tRAFT ADDR\tGRPC ADDR\tSUFFRAGE\tLEADER")
		for _, m := range ms {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\n", m.Id, m.RaftAddr, m.GrpcAddr, m.Suffrage, m.Leader)
		}
		return w.Flush()
	case len(args) == 3 && args[0] == "add":
		if err := c.client.AddVoter(ctx, args[1], args[2], ""); err != nil {
			return err
		}
	case len(args) == 2 && args[0] == "remove":
		if err := c.client.RemoveServer(ctx, args[1]); err != nil {
			return err
		}
	default:
		return errArgs
	}
	return c.print(resultJSON{"OK"}, "OK\n")
}

// printExport says how the leader's export to etcd keeps up: the rate etcd
// takes entries at, the writes paced to it, or why etcd takes none.
func printExport(out io.Writer, s *moonraftpb.NodeStatus) {
	rate := "rate not measured yet"
	if s.ExportTakeRate > 0 {
		rate = fmt.Sprintf("~%.0f entries/s", s.ExportTakeRate)
	}
	fmt.Fprintf(out, "%s: export to etcd: %s; %d writes paced now; %d removals deferred\n", s.Id, rate, s.WritesPaced, s.ExportDeferred)
	if s.EtcdError != "" {
		fmt.Fprintf(out, "%s: etcd takes no OpLog entries: %s\n", s.Id, s.EtcdError)
	}
}
