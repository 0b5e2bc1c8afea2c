// Package raftstore is a node's state on disk: the Raft log stores
// (raft-wal, raft-boltdb) with a checksum on every entry, checked at
// every read and, for the entries a restart applies after its snapshot,
// before Raft starts (which keeps them for raft's own reads), the snapshot
// store's check, moving a data dir from one log store to the other, and
// the offline restore that seeds a data dir from a snapshot file and the
// OpLog in etcd.
package raftstore

import (
	"io"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
)

const (
	raftDB = "raft.db"
	// SnapshotsDir holds raft's file snapshot store in a data dir.
	SnapshotsDir = "snapshots"
)

// Store is one Raft log and stable store.
type Store interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// Open opens (or creates) the log store of dataDir — the one it holds, or
// want, or the default — and checks the entries from keepFrom on (0:
// every entry), those a restart applies after its snapshot, against their
// checksums before handing it over; entries stored from then on carry
// their checksums. A damaged log is refused with the way out. The entries
// checked from keepFrom stay in memory until Forget (kept.go).
func Open(dataDir string, want LogStore, logger hclog.Logger, walSegmentBytes int, keepFrom uint64) (*Checked, LogStore, error) {
	ls, err := chooseLogStore(dataDir, want)
	if err != nil {
		return nil, "", err
	}
	s, err := openLogStore(dataDir, ls, logger, walSegmentBytes)
	if err != nil {
		return nil, "", err
	}
	checked := &Checked{Store: s, kept: kept{limit: keptMaxBytes}, logger: logger}
	if err := verifyLog(checked, dataDir, ls, keepFrom); err != nil {
		_ = s.Close()
		return nil, "", err
	}
	return checked, ls, nil
}

// OpenSnapshots opens dataDir's snapshot store, keeping retain snapshots,
// after checking every snapshot it holds.
func OpenSnapshots(dataDir string, retain int, logger hclog.Logger) (*raft.FileSnapshotStore, error) {
	files, err := raft.NewFileSnapshotStoreWithLogger(filepath.Join(dataDir, SnapshotsDir), retain, logger)
	if err != nil {
		return nil, errcode.New(errcode.FileWriteFail, "snapshot store: %v", err)
	}
	// raft's file store keeps its snapshots in a directory of its own name.
	if err := verifySnapshots(files, filepath.Join(dataDir, SnapshotsDir, "snapshots")); err != nil {
		return nil, err
	}
	return files, nil
}

// SnapshotStateFile is the state file of snapshot id while the store of
// dataDir writes it: hashicorp/raft's FileSnapshotStore writes it to
// snapshots/<id>.tmp/state.bin (file_snapshot.go) and renames the directory
// when the sink closes.
func SnapshotStateFile(dataDir, id string) string {
	return filepath.Join(dataDir, SnapshotsDir, "snapshots", id+".tmp", "state.bin")
}

// IsMonotonic reports whether s requires gap-free appends
// (raft.MonotonicLogStore): raft-wal does, and every wrapper must say so.
func IsMonotonic(s raft.LogStore) bool {
	m, ok := s.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}
