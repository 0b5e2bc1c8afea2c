package raftstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
)

// Neither log store checks what it reads back: raft-wal verifies only the
// last batch of its tail segment (a torn write) and bbolt only its page
// structure, so a bit flipped inside an entry was applied as it read — a
// follower diverged silently (node/damaged_test.go). Each entry is
// therefore stored with a CRC-32C of its index, term, type and data in
// raft.Log.Extensions, which both stores keep and moonraft does not
// otherwise use. The entries a restart applies, those after its newest
// snapshot, are checked before Raft starts; the ones the snapshot covers
// are checked as they are read, for a follower that needs them. Reading
// those at the start took three quarters of a 1.2 s check at a million
// objects (docs/BENCHMARKS.md, "Production size").

var (
	sumMagic   = []byte("mrc1") // marks our checksum among possible extensions
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	// errDamagedEntry is an entry that fails its checksum.
	errDamagedEntry = errors.New("fails its checksum")
)

func entrySum(l *raft.Log) uint32 {
	var hdr [17]byte
	binary.LittleEndian.PutUint64(hdr[0:], l.Index)
	binary.LittleEndian.PutUint64(hdr[8:], l.Term)
	hdr[16] = byte(l.Type)
	return crc32.Update(crc32.Update(0, castagnoli, hdr[:]), castagnoli, l.Data)
}

// Checked is a log store that stores every entry with its checksum;
// GetLog hands entries back without it (what raft replicates is the entry
// as it was given), from those the check at open kept where it can
// (kept.go).
type Checked struct {
	Store
	kept   kept
	logger hclog.Logger
}

func (s *Checked) stamp(l *raft.Log) *raft.Log {
	c := *l // raft keeps l in its cache and in flight: stamp a copy
	c.Extensions = binary.LittleEndian.AppendUint32(append([]byte(nil), sumMagic...), entrySum(l))
	return &c
}

func (s *Checked) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s *Checked) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return s.Store.StoreLogs(logs)
	}
	s.kept.overwritten(logs[0].Index, logs[len(logs)-1].Index)
	stamped := make([]*raft.Log, len(logs))
	for i, l := range logs {
		stamped[i] = s.stamp(l)
	}
	return s.Store.StoreLogs(stamped)
}

func (s *Checked) DeleteRange(lo, hi uint64) error {
	s.kept.overwritten(lo, hi)
	return s.Store.DeleteRange(lo, hi)
}

// GetLog answers a damaged entry as missing, having logged the damage:
// raft then sends a follower that needs it a snapshot instead of failing
// at every try, and stops where it would apply it (raft panics on any
// entry it cannot read for its state machine).
func (s *Checked) GetLog(index uint64, l *raft.Log) error {
	err := s.get(index, l)
	if errors.Is(err, errDamagedEntry) {
		s.logger.Error("a Raft log entry is damaged: answered as missing, so a follower that needs it is sent a snapshot; the disk may be failing",
			"error", err)
		return raft.ErrLogNotFound
	}
	return err
}

// get reads entry index and checks it.
func (s *Checked) get(index uint64, l *raft.Log) error {
	if s.kept.get(index, l) {
		return nil
	}
	if err := s.Store.GetLog(index, l); err != nil {
		return err
	}
	_, err := verifyEntry(l)
	return err
}

// Forget drops the entries kept at open up to index, which the state
// machine has applied.
func (s *Checked) Forget(index uint64) { s.kept.forget(index) }

// Kept is how many entries are kept.
func (s *Checked) Kept() int { return s.kept.len() }

func (s *Checked) IsMonotonic() bool { return IsMonotonic(s.Store) }

// verifyEntry checks l against its checksum and removes it; checked is
// false for an entry stored without one (before this release).
func verifyEntry(l *raft.Log) (checked bool, err error) {
	ext := l.Extensions
	if len(ext) != len(sumMagic)+4 || !bytes.HasPrefix(ext, sumMagic) {
		return false, nil
	}
	l.Extensions = nil
	if want, got := binary.LittleEndian.Uint32(ext[len(sumMagic):]), entrySum(l); want != got {
		return true, fmt.Errorf("raft log entry %d (term %d) %w (stored %08x, computed %08x)", l.Index, l.Term, errDamagedEntry, want, got)
	}
	return true, nil
}

// verifyLog reads the entries of the store ls in dataDir from keepFrom
// on, and keeps them (0: reads every entry and keeps none); it refuses a
// log with a damaged entry, naming the store's files and the way out.
func verifyLog(s *Checked, dataDir string, ls LogStore, keepFrom uint64) error {
	first, err := s.FirstIndex()
	if err != nil {
		return damagedLog(dataDir, ls, err)
	}
	last, err := s.LastIndex()
	if err != nil {
		return damagedLog(dataDir, ls, err)
	}
	if last == 0 {
		return nil
	}
	for i := max(first, keepFrom); i <= last; i++ {
		var l raft.Log
		if err := s.get(i, &l); err != nil {
			return damagedLog(dataDir, ls, fmt.Errorf("entry %d: %w", i, err))
		}
		if keepFrom > 0 {
			s.kept.add(&l)
		}
	}
	return nil
}

func damagedLog(dataDir string, ls LogStore, err error) error {
	return errcode.New(errcode.FileReadFail,
		"the Raft log in %s is damaged: %v. This node's log cannot be trusted: %s",
		filepath.Join(dataDir, storeName[ls]), err, rejoinAdvice)
}

// rejoinAdvice is the way out for a node whose own files are damaged: its
// peers hold the state; an empty data dir under --bootstrap would forget
// the node's vote (docs/OPERATIONS.md).
const rejoinAdvice = "remove it from the cluster (`moonctl members remove ID`), move its data dir aside, and start it again empty with --join (docs/OPERATIONS.md, \"Damaged files\")"

// verifySnapshots opens every snapshot raft's file store holds, which
// checks each state file against the CRC-64 in its meta.json. raft would
// skip a snapshot whose meta it cannot read and start from the log alone,
// which after log compaction is missing the entries the snapshot held; so
// any damaged snapshot refuses the start. A directory still named .tmp is
// a snapshot a crash interrupted: raft ignores it, and so does this.
func verifySnapshots(store raft.SnapshotStore, dir string) error {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return errcode.New(errcode.FileReadFail, "snapshots in %s: %v", dir, err)
	}
	for _, e := range ents {
		if !e.IsDir() || strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		_, rc, err := store.Open(e.Name())
		if err == nil {
			err = rc.Close()
		}
		if err != nil {
			return errcode.New(errcode.FileReadFail, "the Raft snapshot %s is damaged: %v. This node's snapshots cannot be trusted: %s",
				filepath.Join(dir, e.Name()), err, rejoinAdvice)
		}
	}
	return nil
}
