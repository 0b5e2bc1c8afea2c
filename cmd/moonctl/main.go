// Command moonctl is the moonraft CLI: data operations, status, members and
// leadership. Every command takes --endpoints and --json; it exits 0 on
// success and 1 with the Mooncake error-code name on stderr otherwise.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/listflag"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/transport"
)

const usage = `usage: moonctl [--endpoints host:port,...] [--json] [--timeout D]
               [--tls-cert F --tls-key F] [--tls-ca F] [--tls-server-name N]
               [--admin-token-file F | --admin-token T] COMMAND [ARGS]

TLS: --tls-ca verifies the masters (turns TLS on); --tls-cert/--tls-key is the
client certificate masters with a CA require. Admin commands (members, leader
transfer, snapshot save/restore, rm --all) need the admin token when the
masters have one.

commands:
  status                                   every node: id, addresses, role, term, applied index and seq, digest
  mount --client C --segment NAME --size N [--base ADDR]
  unmount --client C --segment NAME [--graceful [--grace D]]
                                           --graceful: no new allocations now, unmounted once nothing
                                           on it is leased or written, or after D (0: the server's bound)
  segment status [NAME] [--id]            one segment by name (or id), or every one
  ping --client C
  put KEY --size N [--replicas R] [--client C] [--soft-pin]    PutStart then PutEnd
  upsert KEY --size N [--replicas R] [--client C] [--soft-pin] UpsertStart then UpsertEnd
  put-start KEY --size N [--replicas R] [--client C] [--soft-pin]
  put-end KEY --client C
  put-revoke KEY --client C
  get KEY
  exist KEY
  ls [--regex RE]
  rm KEY... [--force] | rm --regex RE [--force] | rm --all [--force]
                                           several keys: one BatchRemove, a result per key
  members list | members add ID RAFTADDR | members remove ID
  leader transfer [ID]
  snapshot save FILE                       stream a fresh snapshot from the leader into FILE (atomically)
  snapshot inspect FILE                    verify FILE and show its header, counts and digest
  snapshot restore FILE                    install FILE on the live cluster (every node)
  snapshot restore --offline --data-dir DIR --id ID --peers id=raftaddr,... [--replay-etcd
      [--etcd-endpoints URLS] [--allow-gap]] [--cluster-id C] [--force] FILE
                                           seed a fresh data directory for a lost cluster
  oplog tail [--from SEQ] [--follow] [--etcd-endpoints URLS] [--etcd-prefix P] [--cluster-id C]
                                           OpLog entries as stored in etcd
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// cli is one invocation: its output streams and global options.
type cli struct {
	out, errOut io.Writer
	json        bool
	client      *transport.Client
	endpoints   []string
}

func run(args []string, stdout, stderr io.Writer) int {
	g := flag.NewFlagSet("moonctl", flag.ContinueOnError)
	g.SetOutput(stderr)
	g.Usage = func() { fmt.Fprint(stderr, usage) }
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
	if err := g.Parse(args); err != nil {
		return 2
	}
	if g.NArg() == 0 {
		g.Usage()
		return 2
	}
	c := &cli{out: stdout, errOut: stderr, json: *asJSON, endpoints: listflag.Split(*endpoints)}
	ccfg := transport.ClientConfig{Endpoints: c.endpoints, AdminToken: *token}
	if *tokenFile != "" {
		if *token != "" {
			return c.fail(errcode.New(errcode.InvalidParams, "give --admin-token-file or --admin-token, not both"))
		}
		tok, err := transport.ReadTokenFile(*tokenFile)
		if err != nil {
			return c.fail(err)
		}
		ccfg.AdminToken = tok
	}
	if tlsFiles.Enabled() {
		tc, err := tlsFiles.ClientConfig()
		if err != nil {
			return c.fail(err)
		}
		ccfg.TLS = tc
	}
	client, err := transport.Dial(ccfg)
	if err != nil {
		return c.fail(err)
	}
	defer client.Close()
	c.client = client
	if g.Arg(0) == "snapshot" && !flagSet(g, "timeout") {
		*timeout = 30 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := c.dispatch(ctx, g.Arg(0), g.Args()[1:]); err != nil {
		return c.fail(err)
	}
	return 0
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

var errUsage = errors.New("usage")

// fail prints the error code name (and message) and returns the exit status.
func (c *cli) fail(err error) int {
	if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(c.errOut, usage)
		return 2
	}
	var coded *errcode.Error
	if errors.As(err, &coded) {
		fmt.Fprintln(c.errOut, err) // already starts with the code name
	} else {
		fmt.Fprintf(c.errOut, "%s: %v\n", errcode.Of(err), err)
	}
	return 1
}

// flags parses a command's flags; positional arguments may come before or
// after them ("put KEY --size 10" and "put --size 10 KEY" both work).
func flags(name string, args []string, def func(*flag.FlagSet)) ([]string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	def(fs)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%s: %w", name, errcode.New(errcode.InvalidParams, "%v", err))
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func (c *cli) dispatch(ctx context.Context, cmd string, args []string) error {
	switch cmd {
	case "status":
		return c.status(ctx)
	case "mount", "unmount", "ping":
		return c.segment(ctx, cmd, args)
	case "put", "put-start", "upsert":
		return c.put(ctx, cmd, args)
	case "segment":
		if len(args) == 0 || args[0] != "status" {
			return errUsage
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
			return errUsage
		}
		return c.oplogTail(ctx, args[1:])
	case "leader":
		if len(args) == 0 || args[0] != "transfer" || len(args) > 2 {
			return errUsage
		}
		id := ""
		if len(args) == 2 {
			id = args[1]
		}
		if err := c.client.TransferLeadership(ctx, id); err != nil {
			return err
		}
		return c.print(map[string]string{"result": "leadership transferred"}, "leadership transferred\n")
	}
	return errUsage
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

func (c *cli) status(ctx context.Context) error {
	sts, errs := c.client.StatusAll(ctx)
	if c.json {
		return c.print(sts, "")
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
			exported, lag = fmt.Sprint(s.ExportedSeq), fmt.Sprint(s.AppliedSeq-min(s.ExportedSeq, s.AppliedSeq))
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
		if s != nil && s.DiskError != "" {
			fmt.Fprintf(c.out, "%s: disk failing: %s\n", s.Id, s.DiskError)
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
		return errUsage
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
		return c.print(map[string]any{"client_status": status, "ttl_ms": p.TTLMs, "view_version": p.ViewVersion},
			fmt.Sprintf("%s (ttl %d ms, view version %d)\n", status, p.TTLMs, p.ViewVersion))
	}
	if err != nil {
		return err
	}
	return c.print(map[string]string{"result": "OK"}, "OK\n")
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
		return errUsage
	}
	key := pos[0]
	start, end := c.client.PutStart, c.client.PutEnd
	if cmd == "upsert" {
		start, end = c.client.UpsertStart, c.client.UpsertEnd
	}
	descs, err := start(ctx, key, []uint64{size}, transport.ReplicateConfig{ReplicaNum: uint32(replicas), SoftPin: softPin}, client)
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
	return c.print(map[string]any{"key": key, "replicas": descs}, replicasText(key, descs))
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
		return errUsage
	}
	if cmd == "put-end" {
		err = c.client.PutEnd(ctx, pos[0], client)
	} else {
		err = c.client.PutRevoke(ctx, pos[0], client)
	}
	if err != nil {
		return err
	}
	return c.print(map[string]string{"result": "OK"}, "OK\n")
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
		return c.print(objs, b.String())
	case cmd == "get" && len(pos) == 1:
		descs, until, err := c.client.GetReplicaList(ctx, pos[0])
		if err != nil {
			return err
		}
		return c.print(map[string]any{"key": pos[0], "replicas": descs, "lease_until_ms": until}, replicasText(pos[0], descs))
	case cmd == "exist" && len(pos) == 1:
		ok, _, err := c.client.ExistKey(ctx, pos[0])
		if err != nil {
			return err
		}
		return c.print(map[string]bool{"exists": ok}, fmt.Sprintln(ok))
	}
	return errUsage
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
		return errUsage
	}
	if err != nil {
		return err
	}
	return c.print(map[string]uint64{"removed": removed}, fmt.Sprintf("removed %d\n", removed))
}

// batchRemove removes keys in one BatchRemove and reports each; it fails
// (after printing every result) when any key was not removed.
func (c *cli) batchRemove(ctx context.Context, keys []string, force bool) error {
	errs, err := c.client.BatchRemove(ctx, keys, force)
	if err != nil {
		return err
	}
	type result struct {
		Key    string `json:"key"`
		Result string `json:"result"`
	}
	var (
		results []result
		text    strings.Builder
		removed uint64
		first   error
	)
	for i, e := range errs {
		r := result{keys[i], "OK"}
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
	if err := c.print(map[string]any{"removed": removed, "results": results}, text.String()); err != nil {
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
	var sts []transport.SegmentStatus
	switch len(pos) {
	case 0:
		sts, err = c.client.ListSegments(ctx)
	case 1:
		var st transport.SegmentStatus
		st, err = c.client.QuerySegmentStatus(ctx, pos[0], byID)
		sts = []transport.SegmentStatus{st}
	default:
		return errUsage
	}
	if err != nil {
		return err
	}
	if c.json {
		type segJSON struct {
			ID           string `json:"id"`
			Name         string `json:"name"`
			ClientID     string `json:"client_id"`
			State        string `json:"state"`
			Base         uint64 `json:"base"`
			Size         uint64 `json:"size"`
			UsedBytes    uint64 `json:"used_bytes"`
			Objects      uint64 `json:"objects"`
			DrainUntilMs int64  `json:"drain_until_ms,omitempty"`
		}
		out := make([]segJSON, len(sts))
		for i, st := range sts {
			out[i] = segJSON{st.Segment.ID, st.Segment.Name, st.ClientID, st.State, st.Segment.Base, st.Segment.Size, st.UsedBytes, st.Objects, st.DrainUntilMs}
		}
		return c.print(out, "")
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
	switch {
	case len(args) == 1 && args[0] == "list":
		ms, err := c.client.Members(ctx)
		if err != nil {
			return err
		}
		if c.json {
			return c.print(ms, "")
		}
		w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tRAFT ADDR\tGRPC ADDR\tSUFFRAGE\tLEADER")
		for _, m := range ms {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\n", m.Id, m.RaftAddr, m.GrpcAddr, m.Suffrage, m.Leader)
		}
		return w.Flush()
	case len(args) == 3 && args[0] == "add":
		if err := c.client.AddVoter(ctx, args[1], args[2]); err != nil {
			return err
		}
	case len(args) == 2 && args[0] == "remove":
		if err := c.client.RemoveServer(ctx, args[1]); err != nil {
			return err
		}
	default:
		return errUsage
	}
	return c.print(map[string]string{"result": "OK"}, "OK\n")
}
