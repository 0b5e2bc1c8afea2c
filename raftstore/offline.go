package raftstore

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/oplog"
	"github.com/moonraft/moonraft/snapshots"
)

// OfflineRestore seeds a data directory for a lost cluster from a snapshot
// file, optionally brought forward with the OpLog entries etcd holds after
// the snapshot's seq, so `moonraft` started on it comes up with that state.
type OfflineRestore struct {
	Snapshot  string // MOONSNAP file
	DataDir   string
	ID        string
	Peers     []Peer // the new cluster's members, identical on every node
	ClusterID string
	// LogStore is the Raft log store to create ("": the default).
	LogStore LogStore
	// Force restores a snapshot of another cluster id, and over a data dir
	// that already holds Raft state (which is then deleted).
	Force bool

	ReplayEtcd bool
	Etcd       etcdbridge.Config
	// AllowGap replays up to a gap instead of failing: entries etcd no
	// longer holds are lost.
	AllowGap bool

	// Progress, if set, is told the entries replayed so far.
	Progress func(replayed uint64)
}

// RestoreReport says what an offline restore produced.
type RestoreReport struct {
	SnapshotSeq uint64 // applied seq of the snapshot file
	AppliedSeq  uint64 // after replay
	Replayed    uint64
	ReplayTime  time.Duration
	Gap         bool // replay stopped at a gap (AllowGap)
	// Skipped: PUT_ENDs on segments mounted after the snapshot, which the
	// OpLog does not record; those keys are dropped (cache misses).
	Skipped uint64
	// StaleDropped: replicas the source had freed without an entry (an
	// abandoned put, a replica lost with a segment), dropped for the space.
	StaleDropped    uint64
	Digest          string
	ObjectSetDigest string
	RaftIndex       uint64
	RaftTerm        uint64
}

// Run performs the restore. On any error the data dir is left as it was.
func (o *OfflineRestore) Run(ctx context.Context) (RestoreReport, error) {
	var rep RestoreReport
	if o.ID == "" || o.DataDir == "" || len(o.Peers) == 0 {
		return rep, errcode.New(errcode.InvalidParams, "offline restore needs --id, --data-dir and --peers")
	}
	if err := o.checkDataDir(); err != nil {
		return rep, err
	}
	f, hdr, err := o.load()
	if err != nil {
		return rep, err
	}
	rep.SnapshotSeq = hdr.AppliedSeq
	if o.ReplayEtcd {
		start := time.Now()
		err := o.replay(ctx, f, &rep)
		rep.ReplayTime = time.Since(start)
		if err != nil {
			return rep, err
		}
	}
	rep.RaftIndex, rep.RaftTerm = max(hdr.RaftIndex, 1), max(hdr.RaftTerm, 1)
	if err := o.writeRaftState(f, rep.RaftIndex, rep.RaftTerm); err != nil {
		return rep, err
	}
	d, od := f.Digest(), f.ObjectSetDigest()
	rep.AppliedSeq = f.Stats().AppliedSeq
	rep.Digest, rep.ObjectSetDigest = hex.EncodeToString(d[:]), hex.EncodeToString(od[:])
	return rep, nil
}

// checkDataDir refuses a directory holding Raft state, unless forced.
func (o *OfflineRestore) checkDataDir() error {
	var found []string
	for _, name := range []string{raftDB, walDir, SnapshotsDir} {
		if _, err := os.Stat(filepath.Join(o.DataDir, name)); err == nil {
			found = append(found, name)
		}
	}
	if len(found) == 0 {
		return nil
	}
	if !o.Force {
		return errcode.New(errcode.InvalidParams,
			"data dir %s already holds Raft state (%v): restoring would replace it; use a new directory or --force", o.DataDir, found)
	}
	return nil
}

// load verifies the file and restores it into a fresh state machine.
func (o *OfflineRestore) load() (*fsm.FSM, snapshots.Header, error) {
	file, err := os.Open(o.Snapshot)
	if err != nil {
		return nil, snapshots.Header{}, errcode.New(errcode.FileNotFound, "snapshot %s: %v", o.Snapshot, err)
	}
	defer file.Close()
	f := fsm.New()
	hdr, err := f.Restore(bufio.NewReaderSize(file, 1<<20))
	if err != nil {
		return nil, hdr, err
	}
	if hdr.ClusterID != o.ClusterID && !o.Force {
		return nil, hdr, errcode.New(errcode.InvalidParams,
			"snapshot is of cluster %q, this restore is for %q; use --cluster-id %s, or --force", hdr.ClusterID, o.ClusterID, hdr.ClusterID)
	}
	return f, hdr, nil
}

// replay applies the OpLog entries etcd holds after the state's seq.
func (o *OfflineRestore) replay(ctx context.Context, f *fsm.FSM, rep *RestoreReport) error {
	store, err := etcdbridge.Open(o.Etcd)
	if err != nil {
		return err
	}
	defer store.Close()
	for {
		after := f.Stats().AppliedSeq
		recs, _, err := store.ReadOpLogSince(ctx, after, 1000)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return nil
		}
		if recs[0].Seq != after+1 {
			if o.AllowGap {
				rep.Gap = true
				return nil
			}
			return errcode.New(errcode.OplogEntryNotFound,
				"etcd has no OpLog entries %d..%d (cleaned up after a later snapshot?): replaying would skip them; use a newer snapshot, or --allow-gap to restore without them",
				after+1, recs[0].Seq-1)
		}
		for _, r := range recs {
			e, err := oplog.Decode(r.Value)
			if err != nil {
				return errcode.New(errcode.Of(err), "etcd entry %d: %v", r.Seq, err)
			}
			note, err := f.ReplayEntry(e)
			if err != nil {
				return err
			}
			rep.Replayed++
			rep.StaleDropped += uint64(note.StaleDropped)
			if note.Skipped {
				rep.Skipped++
			}
		}
		if o.Progress != nil {
			o.Progress(rep.Replayed)
		}
	}
}

// writeRaftState makes DataDir a Raft data directory whose only content is
// a snapshot of f at (index, term) with the new configuration, as Raft
// itself would leave it after a snapshot and log compaction.
func (o *OfflineRestore) writeRaftState(f *fsm.FSM, index, term uint64) error {
	tmp, err := os.MkdirTemp(filepath.Dir(filepath.Clean(o.DataDir)), ".restore-")
	if err != nil {
		return errcode.New(errcode.FileWriteFail, "prepare %s: %v", o.DataDir, err)
	}
	defer os.RemoveAll(tmp)
	snaps, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(tmp, SnapshotsDir), 2, hclog.NewNullLogger())
	if err != nil {
		return errcode.New(errcode.FileWriteFail, "snapshot store: %v", err)
	}
	var servers []raft.Server
	for _, p := range o.Peers {
		servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr), Suffrage: raft.Voter})
	}
	// Create encodes the peers with a transport (a legacy field); any will do.
	_, trans := raft.NewInmemTransport("")
	defer trans.Close()
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, term, raft.Configuration{Servers: servers}, index, trans)
	if err != nil {
		return errcode.New(errcode.FileWriteFail, "snapshot store: %v", err)
	}
	hdr := snapshots.Header{RaftIndex: index, RaftTerm: term, ClusterID: o.ClusterID, NodeID: o.ID}
	if err := f.Snapshot().Write(sink, hdr); err != nil {
		_ = sink.Cancel()
		return err
	}
	if err := sink.Close(); err != nil {
		return errcode.New(errcode.FileWriteFail, "snapshot store: %v", err)
	}
	ls := o.LogStore
	if ls == "" {
		ls = DefaultLogStore
	}
	store, err := openLogStore(tmp, ls, hclog.NewNullLogger(), 0)
	if err != nil {
		return err
	}
	// Votes and new entries must not go below the snapshot's term.
	err = store.SetUint64([]byte("CurrentTerm"), term)
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return errcode.New(errcode.FileWriteFail, "raft log: %v", err)
	}
	// Swap in: only now is the old state (if forced) removed.
	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return errcode.New(errcode.FileWriteFail, "data dir: %v", err)
	}
	for _, name := range []string{raftDB, walDir, SnapshotsDir} {
		if err := os.RemoveAll(filepath.Join(o.DataDir, name)); err != nil {
			return errcode.New(errcode.FileWriteFail, "remove old %s: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(tmp, name)); errors.Is(err, os.ErrNotExist) {
			continue // the other log store
		}
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(o.DataDir, name)); err != nil {
			return errcode.New(errcode.FileWriteFail, "move %s into place: %v", name, err)
		}
	}
	return nil
}
