package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/listflag"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress reports bytes moved on stderr: a progress bar when stderr is a
// terminal, else a plain line when done. total < 0 means unknown.
type progress struct {
	bar   *progressbar.ProgressBar
	out   io.Writer
	what  string
	start time.Time
	n     int64
}

func (c *cli) newProgress(what string, total int64) *progress {
	p := &progress{out: c.errOut, what: what, start: time.Now()}
	if f, ok := c.errOut.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.DefaultBytes(total, what)
	}
	return p
}

func (p *progress) Write(b []byte) (int, error) {
	p.n += int64(len(b))
	if p.bar != nil {
		_ = p.bar.Add(len(b))
	}
	return len(b), nil
}

// count reports items (replayed entries) rather than bytes.
func (p *progress) count(n uint64) {
	if p.bar != nil {
		_ = p.bar.Set64(int64(n))
		return
	}
	fmt.Fprintf(p.out, "%s: %d\n", p.what, n)
}

func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Finish()
		fmt.Fprintln(p.out)
		return
	}
	fmt.Fprintf(p.out, "%s: %d bytes in %v\n", p.what, p.n, time.Since(p.start).Round(time.Millisecond))
}

func (c *cli) snapshot(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errArgs
	}
	switch args[0] {
	case "save":
		return c.snapshotSave(ctx, args[1:])
	case "inspect":
		return c.snapshotInspect(args[1:])
	case "restore":
		return c.snapshotRestore(ctx, args[1:])
	}
	return errArgs
}

// snapshotSave streams a fresh snapshot from the leader into FILE, via a
// temporary file renamed into place, so FILE is either whole or untouched.
func (c *cli) snapshotSave(ctx context.Context, args []string) error {
	pos, err := flags("snapshot save", args, nil)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errArgs
	}
	path := pos[0]
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return errcode.New(errcode.FileWriteFail, "create %s: %v", path, err)
	}
	defer os.Remove(tmp.Name())
	p := c.newProgress("saving", -1)
	err = c.client.SnapshotSave(ctx, io.MultiWriter(tmp, p))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errcode.New(errcode.Of(err), "save snapshot: %v", err)
	}
	p.done()
	sum, err := inspectFile(tmp.Name())
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return errcode.New(errcode.FileWriteFail, "rename into %s: %v", path, err)
	}
	return c.printSummary(path, sum, nil)
}

func inspectFile(path string) (snapshots.Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return snapshots.Summary{}, errcode.New(errcode.FileNotFound, "%v", err)
	}
	defer f.Close()
	return snapshots.Inspect(f)
}

// printSummary prints a file's summary, and its restored state's digest
// when there is one.
func (c *cli) printSummary(path string, s snapshots.Summary, state *[32]byte) error {
	h := s.Header
	j := summaryJSON{File: path, FormatVersion: s.Version, ClusterID: h.ClusterID, NodeID: h.NodeID, CreatedUnixMs: h.CreatedUnixMs,
		RaftIndex: h.RaftIndex, RaftTerm: h.RaftTerm, AppliedSeq: h.AppliedSeq, Segments: h.Segments, Sessions: h.Sessions,
		Objects: h.Objects, Bytes: h.Bytes, FileBytes: s.FileBytes, Digest: hex.EncodeToString(s.Digest[:]), ChecksumOK: true}
	stateLine := ""
	if state != nil {
		j.StateDigest = hex.EncodeToString(state[:])
		stateLine = "state digest    " + j.StateDigest + "\n"
	}
	text := fmt.Sprintf(`file            %s
format version  %d
cluster         %s
taken by        %s at %s
raft index      %d (term %d)
applied seq     %d
segments        %d
sessions        %d
objects         %d (%d bytes allocated)
file size       %d bytes
digest          %s
checksum        ok
%s`, path, j.FormatVersion, j.ClusterID, j.NodeID, time.UnixMilli(j.CreatedUnixMs).UTC().Format(time.RFC3339), j.RaftIndex, j.RaftTerm,
		j.AppliedSeq, j.Segments, j.Sessions, j.Objects, j.Bytes, j.FileBytes, j.Digest, stateLine)
	return c.print(j, text)
}

// snapshotInspect verifies FILE and prints its header, counts and digest;
// a damaged file is reported with what is wrong. With --restore it also
// restores the state in memory, every check of a node's restore included,
// and prints the state's digest, the one moonctl status shows.
func (c *cli) snapshotInspect(args []string) error {
	var restore bool
	pos, err := flags("snapshot inspect", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&restore, "restore", false, "also restore the state in memory (as much as a node holds it in) and print its digest, as moonctl status shows it")
	})
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errArgs
	}
	sum, err := inspectFile(pos[0])
	if err != nil {
		return err
	}
	if !restore {
		return c.printSummary(pos[0], sum, nil)
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return errcode.New(errcode.FileNotFound, "%v", err)
	}
	defer f.Close()
	st := fsm.New()
	if _, err := st.Restore(bufio.NewReader(f)); err != nil {
		return err
	}
	d := st.Digest()
	return c.printSummary(pos[0], sum, &d)
}

func (c *cli) snapshotRestore(ctx context.Context, args []string) error {
	var (
		o         raftstore.OfflineRestore
		offline   bool
		peers     string
		endpoints string
		logStore  string
	)
	pos, err := flags("snapshot restore", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&offline, "offline", false, "seed a fresh data directory for a lost cluster instead of restoring a live one")
		fs.StringVar(&o.DataDir, "data-dir", "", "with --offline: the data directory to seed")
		fs.StringVar(&o.ID, "id", "", "with --offline: this node's id")
		fs.StringVar(&peers, "peers", "", "with --offline: the new cluster's members id=raftaddr,...")
		fs.StringVar(&o.ClusterID, "cluster-id", "mooncake_cluster", "with --offline: the cluster the snapshot must belong to")
		fs.StringVar(&logStore, "raft-log-store", "", "with --offline: the Raft log store to create, wal or boltdb (empty: moonraft's default)")
		fs.BoolVar(&o.Force, "force", false, "with --offline: restore over existing Raft state, or a snapshot of another cluster id")
		fs.BoolVar(&o.ReplayEtcd, "replay-etcd", false, "with --offline: also apply the OpLog entries etcd holds after the snapshot")
		fs.StringVar(&endpoints, "etcd-endpoints", "http://127.0.0.1:2379", "with --replay-etcd: etcd client URLs")
		fs.StringVar(&o.Etcd.Prefix, "etcd-prefix", "mooncake-store", "with --replay-etcd: moonraft's key prefix in etcd")
		fs.BoolVar(&o.AllowGap, "allow-gap", false, "with --replay-etcd: replay up to a gap instead of failing")
	})
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errArgs
	}
	path := pos[0]
	if !offline {
		f, err := os.Open(path)
		if err != nil {
			return errcode.New(errcode.FileNotFound, "%v", err)
		}
		defer f.Close()
		if _, err := snapshots.Inspect(f); err != nil { // refuse a bad file before sending it
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return errcode.New(errcode.FileReadFail, "%v", err)
		}
		st, _ := f.Stat()
		p := c.newProgress("restoring", st.Size())
		if err := c.client.SnapshotRestore(ctx, &teeSeeker{f, p}); err != nil {
			return err
		}
		p.done()
		return c.print(resultJSON{"restored"}, "restored: every node now holds the snapshot's state\n")
	}
	if o.Peers, err = raftstore.ParsePeers(peers); err != nil {
		return err
	}
	if o.LogStore, err = raftstore.ParseLogStore(logStore); err != nil {
		return err
	}
	o.Etcd.Endpoints = listflag.Split(endpoints)
	o.Etcd.ClusterID = o.ClusterID
	o.Snapshot = path
	p := c.newProgress("replayed entries", -1)
	o.Progress = p.count
	rep, err := o.Run(ctx)
	if err != nil {
		return err
	}
	text := fmt.Sprintf("seeded %s for node %s: snapshot seq %d, replayed %d OpLog entries from etcd in %v, applied seq %d\ndigest %s\n",
		o.DataDir, o.ID, rep.SnapshotSeq, rep.Replayed, rep.ReplayTime.Round(time.Millisecond), rep.AppliedSeq, rep.Digest)
	if rep.Skipped > 0 {
		text += fmt.Sprintf("note: %d entries were on segments mounted after the snapshot; those objects are not restored (their clients remount)\n", rep.Skipped)
	}
	if rep.StaleDropped > 0 {
		text += fmt.Sprintf("note: %d stale replicas in the snapshot, freed by the old cluster without an OpLog entry, were dropped\n", rep.StaleDropped)
	}
	if rep.Gap {
		text += fmt.Sprintf("WARNING: etcd lacks the entries after seq %d; they are not restored (--allow-gap)\n", rep.AppliedSeq)
	}
	return c.print(restoreJSON{DataDir: o.DataDir, ID: o.ID, SnapshotSeq: rep.SnapshotSeq, AppliedSeq: rep.AppliedSeq, Replayed: rep.Replayed,
		ReplayMs: rep.ReplayTime.Milliseconds(), Gap: rep.Gap, Skipped: rep.Skipped, StaleDropped: rep.StaleDropped, Digest: rep.Digest,
		ObjectSetDigest: rep.ObjectSetDigest, RaftIndex: rep.RaftIndex, RaftTerm: rep.RaftTerm}, text)
}

// teeSeeker reports what is read to a progress meter and stays seekable
// (the client rewinds it to resend to the leader after a redirect).
type teeSeeker struct {
	f *os.File
	p *progress
}

func (t *teeSeeker) Read(b []byte) (int, error) {
	n, err := t.f.Read(b)
	_, _ = t.p.Write(b[:n])
	return n, err
}

func (t *teeSeeker) Seek(off int64, whence int) (int64, error) { return t.f.Seek(off, whence) }
