package raftstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/migrate"
	"github.com/moonraft/moonraft/errcode"
	"go.etcd.io/bbolt"
)

// LogStore names where Raft keeps its log and its stable state (term,
// vote) in the data dir.
type LogStore string

const (
	// LogStoreWAL is hashicorp/raft-wal: segment files in raft-wal/, one
	// fsync per append. The default for new data dirs (docs/BENCHMARKS.md).
	LogStoreWAL LogStore = "wal"
	// LogStoreBoltDB is hashicorp/raft-boltdb/v2 in raft.db: a bbolt
	// commit per append, two fdatasyncs (pages, then meta page).
	LogStoreBoltDB LogStore = "boltdb"

	// DefaultLogStore is what a new data dir gets when none is asked for.
	DefaultLogStore = LogStoreWAL

	walDir      = "raft-wal"
	dataDirLock = "LOCK"
)

// storeName is where each store lives in the data dir.
var storeName = map[LogStore]string{LogStoreBoltDB: raftDB, LogStoreWAL: walDir}

// ParseLogStore checks a --raft-log-store value; "" means "the one the data
// dir holds, or the default for a new one".
func ParseLogStore(s string) (LogStore, error) {
	switch ls := LogStore(s); ls {
	case "", LogStoreWAL, LogStoreBoltDB:
		return ls, nil
	}
	return "", errcode.New(errcode.InvalidParams, "--raft-log-store %q: want wal or boltdb", s)
}

// DetectLogStore says which log store dataDir holds ("" for none).
func DetectLogStore(dataDir string) (LogStore, error) {
	var found []LogStore
	for ls, name := range storeName {
		if _, err := os.Stat(filepath.Join(dataDir, name)); err == nil {
			found = append(found, ls)
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", errcode.New(errcode.FileReadFail, "data dir %s: %v", dataDir, err)
		}
	}
	switch len(found) {
	case 0:
		return "", nil
	case 1:
		return found[0], nil
	}
	return "", errcode.New(errcode.InvalidParams,
		"data dir %s holds both a boltdb Raft log (%s) and a wal one (%s/): a migration was interrupted? Keep the one `moonraft migrate-log-store` reported, remove the other",
		dataDir, raftDB, walDir)
}

// chooseLogStore picks the store for dataDir: the one it holds (a
// mismatching explicit choice is refused: a node keeps the store it was
// created with), else the one asked for, else the default.
func chooseLogStore(dataDir string, want LogStore) (LogStore, error) {
	have, err := DetectLogStore(dataDir)
	if err != nil {
		return "", err
	}
	switch {
	case have == "" && want == "":
		return DefaultLogStore, nil
	case have == "":
		return want, nil
	case want != "" && want != have:
		return "", errcode.New(errcode.InvalidParams,
			"data dir %s holds a %s Raft log, not %s: drop --raft-log-store, or move the node with `moonraft migrate-log-store --data-dir %s --to %s` while it is stopped (docs/OPERATIONS.md)",
			dataDir, have, want, dataDir, want)
	}
	return have, nil
}

// openLogStore opens (or creates) the store ls in dataDir, holding the
// data dir's lock while it is open. Both stores keep fsync on: an entry is
// acknowledged only once it is on disk.
func openLogStore(dataDir string, ls LogStore, logger hclog.Logger, walSegmentBytes int) (Store, error) {
	lock, err := lockDataDir(dataDir)
	if err != nil {
		return nil, err
	}
	s, err := openUnlocked(dataDir, ls, logger, walSegmentBytes)
	if err != nil {
		_ = lock.Close()
		return nil, err
	}
	return &lockedStore{Store: s, lock: lock}, nil
}

// lockDataDir takes an exclusive lock on dataDir/LOCK: both stores would
// otherwise wait forever on a data dir another process has open.
func lockDataDir(dataDir string) (*os.File, error) {
	path := filepath.Join(dataDir, dataDirLock)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, errcode.New(errcode.FileOpenFail, "lock %s: %v", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, errcode.New(errcode.FileLockFail, "data dir %s is in use by another process (a running moonraft?): %v", dataDir, err)
	}
	return f, nil
}

type lockedStore struct {
	Store
	lock *os.File
}

// IsMonotonic passes raft-wal's answer through (raft.MonotonicLogStore): a
// store that refuses gaps needs Raft to clear it after a snapshot install.
func (s *lockedStore) IsMonotonic() bool { return IsMonotonic(s.Store) }

func (s *lockedStore) Close() error {
	err := s.Store.Close()
	if lerr := s.lock.Close(); err == nil {
		err = lerr
	}
	return err
}

// walStore is raft-wal with two repairs:
//   - When a segment rotation fails because the next segment's file cannot
//     be created (a full disk), raft-wal v0.4.2 has already recorded that
//     segment in its meta database and goes on appending to the sealed one,
//     failing every append with ErrSealed until the process restarts;
//     opening the directory again creates the file. StoreLogs does that on
//     ErrSealed and retries, so a node whose disk filled exactly at a
//     rotation catches up by itself once space is back, like any other
//     (docs/RELIABILITY.md, finding 15).
//   - The instances of the directory share one meta database (bbolt locks
//     its file: a second handle in the same process would wait forever),
//     which only walStore closes.
type walStore struct {
	open func() (*wal.WAL, error)
	meta *metadb.BoltMetaDB

	mu sync.RWMutex // read by every call, written to swap w for a reopened WAL
	w  *wal.WAL
}

// openWAL opens raft-wal in dir; segmentBytes sizes new segments (0:
// raft-wal's default, 64 MiB).
func openWAL(dir string, logger hclog.Logger, segmentBytes int) (*walStore, error) {
	meta := &metadb.BoltMetaDB{}
	if segmentBytes == 0 {
		segmentBytes = wal.DefaultSegmentSize
	}
	s := &walStore{meta: meta, open: func() (*wal.WAL, error) {
		return wal.Open(dir, wal.WithLogger(logger), wal.WithMetaStore(sharedMeta{meta}), wal.WithSegmentSize(segmentBytes))
	}}
	w, err := s.open()
	if err != nil {
		_ = meta.Close()
		return nil, errcode.New(errcode.FileOpenFail, "raft log %s: %v", dir, err)
	}
	s.w = w
	return s, nil
}

// sharedMeta is the meta database as one raft-wal instance sees it: its
// Close (WAL.Close calls it) leaves the database open for the others.
type sharedMeta struct{ *metadb.BoltMetaDB }

func (sharedMeta) Close() error { return nil }

func (s *walStore) StoreLogs(logs []*raft.Log) error {
	err := s.storeLogs(logs)
	if !errors.Is(err, wal.ErrSealed) {
		return err
	}
	if rerr := s.reopen(); rerr != nil {
		return fmt.Errorf("%w: the next segment could not be created (disk full?), and creating it again failed: %v", err, rerr)
	}
	return s.storeLogs(logs)
}

func (s *walStore) storeLogs(logs []*raft.Log) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.StoreLogs(logs)
}

// reopen replaces the WAL with a fresh instance of the same directory once
// no call is using the old one; the old one stays if that fails.
func (s *walStore) reopen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, err := s.open()
	if err != nil {
		return err
	}
	old := s.w
	s.w = w
	// Closing only releases the old instance's file handles and stops its
	// rotation goroutine: everything it wrote is on disk, and the new
	// instance read it back.
	_ = old.Close()
	return nil
}

func (s *walStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s *walStore) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.FirstIndex()
}

func (s *walStore) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.LastIndex()
}

func (s *walStore) GetLog(i uint64, l *raft.Log) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.GetLog(i, l)
}

func (s *walStore) DeleteRange(lo, hi uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.DeleteRange(lo, hi)
}

func (s *walStore) Set(k, v []byte) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.Set(k, v)
}

func (s *walStore) Get(k []byte) ([]byte, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.Get(k)
}

func (s *walStore) SetUint64(k []byte, v uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.SetUint64(k, v)
}

func (s *walStore) GetUint64(k []byte) (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.w.GetUint64(k)
}

// IsMonotonic: raft-wal refuses gaps (raft.MonotonicLogStore).
func (s *walStore) IsMonotonic() bool { return true }

func (s *walStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.w.Close()
	if merr := s.meta.Close(); err == nil {
		err = merr
	}
	return err
}

func openUnlocked(dataDir string, ls LogStore, logger hclog.Logger, walSegmentBytes int) (Store, error) {
	switch ls {
	case LogStoreWAL:
		dir := filepath.Join(dataDir, walDir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, errcode.New(errcode.FileWriteFail, "raft log %s: %v", dir, err)
		}
		if err := checkBolt(filepath.Join(dir, metadb.FileName)); err != nil {
			return nil, err
		}
		return openWAL(dir, logger, walSegmentBytes)
	case LogStoreBoltDB:
		path := filepath.Join(dataDir, raftDB)
		if err := checkBolt(path); err != nil {
			return nil, err
		}
		// The freelist is rebuilt at open instead of written with every
		// commit: fewer pages per append, same durability (bbolt's docs).
		s, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType}})
		if err != nil {
			return nil, errcode.New(errcode.FileOpenFail, "raft log %s: %v", path, err)
		}
		return s, nil
	}
	return nil, errcode.New(errcode.InvalidParams, "unknown raft log store %q", ls)
}

// checkBolt refuses a damaged bbolt file before a store opens it: bbolt
// panics on a page it cannot make sense of, so a bit flip in raft.db or in
// raft-wal's meta database would crash the node at every start instead of
// saying which file is bad. bbolt's own consistency check reads every page
// and turns such panics into errors. A missing file is a new store.
func checkBolt(path string) (err error) {
	if _, serr := os.Stat(path); errors.Is(serr, os.ErrNotExist) {
		return nil
	}
	damaged := func(what any) error {
		return errcode.New(errcode.FileReadFail, "%s is damaged (%v). This node's Raft log cannot be trusted: %s", path, what, rejoinAdvice)
	}
	defer func() {
		if r := recover(); r != nil {
			err = damaged(r)
		}
	}()
	if err := boltLongEnough(path); err != nil {
		return damaged(err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return damaged(err)
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		var first error
		for cerr := range tx.Check() { // drained: the check holds the transaction
			if first == nil {
				first = damaged(cerr) // the first problem says enough
			}
		}
		return first
	})
}

// boltLongEnough compares a bbolt file's length with the pages its newest
// valid meta page says it has: bbolt maps the file into memory, and reading
// a page past the end of a truncated file kills the process with SIGBUS,
// which no recover catches. Meta pages it cannot validate are left to
// bbolt.Open, which refuses them with an error.
func boltLongEnough(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	// A page starts with a 16-byte header; the meta follows: magic,
	// version, page size, flags (4 bytes each), the root bucket (16), the
	// freelist page, the page count, the txid and an FNV-64a checksum of
	// what precedes it (8 each).
	const hdr, sumAt = 16, 56
	meta := func(off int64) (pageSize uint32, pages, txid uint64, ok bool) {
		b := make([]byte, hdr+sumAt+8)
		if _, err := f.ReadAt(b, off); err != nil {
			return 0, 0, 0, false
		}
		m := b[hdr:]
		h := fnv.New64a()
		h.Write(m[:sumAt])
		if binary.LittleEndian.Uint32(m) != 0xED0CDAED || h.Sum64() != binary.LittleEndian.Uint64(m[sumAt:]) {
			return 0, 0, 0, false
		}
		return binary.LittleEndian.Uint32(m[8:]), binary.LittleEndian.Uint64(m[40:]), binary.LittleEndian.Uint64(m[48:]), true
	}
	size, pages, txid, ok := meta(0)
	if !ok {
		size = 4096
	}
	if s1, p1, t1, ok1 := meta(int64(size)); ok1 && (!ok || t1 > txid) {
		size, pages, ok = s1, p1, true
	}
	if ok && uint64(st.Size()) < pages*uint64(size) {
		return fmt.Errorf("%d bytes long, but its meta page counts %d pages of %d bytes: the file was cut short", st.Size(), pages, size)
	}
	return nil
}

// MigrateLogStore moves the Raft log and stable state of a stopped node's
// data dir into the store `to`, then removes the old store. The new store
// is built beside the old one and renamed into place, so an interruption
// leaves the old store usable (and at worst a half-built directory to
// remove, which DetectLogStore reports). It returns the entries copied.
func MigrateLogStore(ctx context.Context, dataDir string, to LogStore) (uint64, error) {
	from, err := DetectLogStore(dataDir)
	switch {
	case err != nil:
		return 0, err
	case from == "":
		return 0, errcode.New(errcode.InvalidParams, "data dir %s holds no Raft log", dataDir)
	case from == to:
		return 0, errcode.New(errcode.InvalidParams, "data dir %s already holds a %s Raft log", dataDir, to)
	}
	src, err := openLogStore(dataDir, from, hclog.NewNullLogger(), 0)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	tmp, err := os.MkdirTemp(dataDir, ".migrate-")
	if err != nil {
		return 0, errcode.New(errcode.FileWriteFail, "migrate: %v", err)
	}
	defer os.RemoveAll(tmp)
	dst, err := openLogStore(tmp, to, hclog.NewNullLogger(), 0)
	if err != nil {
		return 0, err
	}
	n, err := copyRaftState(ctx, dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, errcode.New(errcode.FileWriteFail, "migrate %s to %s: %v", from, to, err)
	}
	if err := os.Rename(filepath.Join(tmp, storeName[to]), filepath.Join(dataDir, storeName[to])); err != nil {
		return 0, errcode.New(errcode.FileWriteFail, "migrate: move the new store into place: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(dataDir, storeName[from])); err != nil {
		return 0, errcode.New(errcode.FileWriteFail, "migrate: the %s store is in place; remove the old %s by hand: %v", to, storeName[from], err)
	}
	return n, nil
}

// copyRaftState copies every log entry and the keys hashicorp/raft keeps
// in its stable store. (raft-wal's migrate.CopyStable fails on a key that
// was never written, such as the vote of a node that never voted.)
func copyRaftState(ctx context.Context, dst, src Store) (uint64, error) {
	if err := migrate.CopyLogs(ctx, dst, src, 1<<20, nil); err != nil {
		return 0, err
	}
	for _, k := range []string{"CurrentTerm", "LastVoteTerm"} {
		v, err := src.GetUint64([]byte(k))
		if err != nil && !notFound(err) {
			return 0, fmt.Errorf("read %s: %w", k, err)
		}
		if err == nil {
			if err := dst.SetUint64([]byte(k), v); err != nil {
				return 0, err
			}
		}
	}
	v, err := src.Get([]byte("LastVoteCand"))
	if err != nil && !notFound(err) {
		return 0, fmt.Errorf("read LastVoteCand: %w", err)
	}
	if err == nil && v != nil {
		if err := dst.Set([]byte("LastVoteCand"), v); err != nil {
			return 0, err
		}
	}
	first, err := src.FirstIndex()
	if err != nil {
		return 0, err
	}
	last, err := src.LastIndex()
	if err != nil || last == 0 {
		return 0, err
	}
	return last - first + 1, nil
}

// notFound: raft-boltdb answers a missing stable key with an error whose
// text is "not found", as hashicorp/raft itself tests for (raft-wal answers
// nil).
func notFound(err error) bool { return err != nil && err.Error() == "not found" }
