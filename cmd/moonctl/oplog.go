package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/internal/listflag"
	"github.com/moonraft/moonraft/oplog"
)

// oplogTail prints OpLog entries straight from etcd, from --from on; with
// --follow it keeps printing new ones until interrupted.
func (c *cli) oplogTail(ctx context.Context, args []string) error {
	var (
		from      uint64
		follow    bool
		endpoints string
		cfg       etcdbridge.Config
	)
	pos, err := flags("oplog tail", args, func(fs *flag.FlagSet) {
		fs.Uint64Var(&from, "from", 1, "first sequence id to print")
		fs.BoolVar(&follow, "follow", false, "keep printing new entries")
		fs.StringVar(&endpoints, "etcd-endpoints", "http://127.0.0.1:2379", "etcd client URLs, comma-separated")
		fs.StringVar(&cfg.Prefix, "etcd-prefix", "mooncake-store", "moonraft's key prefix in etcd")
		fs.StringVar(&cfg.ClusterID, "cluster-id", "mooncake_cluster", "cluster id")
	})
	if err != nil {
		return err
	}
	if len(pos) != 0 || from == 0 {
		return errArgs
	}
	cfg.Endpoints = listflag.Split(endpoints)
	store, err := etcdbridge.Open(cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	if !c.json {
		fmt.Fprintln(c.out, "SEQ\tTIMESTAMP\tOP\tKEY\tKEY SEQ\tSOURCE")
	}
	after := from - 1
	var rev int64
	for {
		recs, r, err := store.ReadOpLogSince(ctx, after, 1000)
		if err != nil {
			return err
		}
		rev = r
		for _, rec := range recs {
			if err := c.printEntry(rec); err != nil {
				return err
			}
			after = rec.Seq
		}
		if len(recs) < 1000 {
			break
		}
	}
	if !follow {
		return nil
	}
	for ev := range store.Watch(ctx, rev) {
		if ev.Err != nil {
			return ev.Err
		}
		for _, rec := range ev.Records {
			if err := c.printEntry(rec); err != nil {
				return err
			}
		}
	}
	return nil
}

// printEntry prints one record: the stored JSON with --json, else a line.
// A record that does not decode or verify is reported, not skipped.
func (c *cli) printEntry(rec oplog.Record) error {
	e, err := oplog.Decode(rec.Value)
	if err == nil {
		err = e.Verify()
	}
	if err != nil {
		return errcode.New(errcode.Of(err), "entry %d in etcd: %v", rec.Seq, err)
	}
	if c.json {
		_, err := fmt.Fprintln(c.out, strings.TrimSpace(string(rec.Value)))
		return err
	}
	_, err = fmt.Fprintf(c.out, "%d\t%d\t%s\t%s\t%d\t%s\n", e.SequenceID, e.TimestampMs, e.OpType, e.Key, e.KeySequenceID, e.Source)
	return err
}
