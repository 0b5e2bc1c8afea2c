package raftstore

import (
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// A restarted node reads the log since its last snapshot three times
// before it has applied it: the check at open (verifyLog), hashicorp/raft's
// scan for configurations in NewRaft, and raft's reads for the state
// machine (processLogs), which run in its main loop. raft-wal reads at
// least 64 KiB from its file for every entry, and at a million objects on
// two busy cores the last two reads took 0.25 s and 0.4 s of CPU of a 9 s
// restart (docs/BENCHMARKS.md, "Production size"). So the check keeps the
// entries it read from keepFrom on, up to keptMaxBytes of data, and GetLog
// answers from them until the state machine has applied them (Forget).
// A write or a deletion that overlaps them — a new leader replacing
// entries this node had — drops them from where it starts: the log is the
// truth, the kept entries a copy of it.
const keptMaxBytes = 128 << 20

// kept is a run of checked entries, in index order from from. size
// mirrors len(logs) so that the log's reads and writes, for all of a
// node's life but its start, find it empty without taking the lock.
type kept struct {
	mu    sync.Mutex
	size  atomic.Int64
	limit int // bytes of data that add keeps at most
	added int // bytes of data added
	from  uint64
	logs  []*raft.Log
}

// add keeps l (one past the last kept, else nothing), if the limit allows.
func (k *kept) add(l *raft.Log) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.logs) == 0 {
		k.from = l.Index
	}
	if l.Index != k.from+uint64(len(k.logs)) || k.added+len(l.Data) > k.limit {
		return
	}
	c := *l
	k.logs = append(k.logs, &c)
	k.added += len(l.Data)
	k.size.Store(int64(len(k.logs)))
}

// get copies the kept entry index into l, if there is one.
func (k *kept) get(index uint64, l *raft.Log) bool {
	if k.size.Load() == 0 {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if index < k.from || index-k.from >= uint64(len(k.logs)) {
		return false
	}
	*l = *k.logs[index-k.from]
	return true
}

// overwritten drops the kept entries from lo on if entries lo to hi,
// being written or deleted, overlap them. Those before lo stay: a new
// leader replaces a follower's log from where the two differ, and they
// agree before it (a restarted old leader's last, uncommitted entry
// dropped all 2,287 of the kept ones, and raft read them from disk).
func (k *kept) overwritten(lo, hi uint64) {
	if k.size.Load() == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if lo >= k.from+uint64(len(k.logs)) || hi < k.from {
		return
	}
	n := max(lo, k.from) - k.from
	clear(k.logs[n:])
	k.logs = k.logs[:n]
	if n == 0 {
		k.logs = nil
	}
	k.size.Store(int64(len(k.logs)))
}

// forget drops the kept entries up to index.
func (k *kept) forget(index uint64) {
	if k.size.Load() == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.logs) == 0 || index < k.from {
		return
	}
	n := min(index-k.from+1, uint64(len(k.logs)))
	clear(k.logs[:n]) // the array outlives the slice
	k.logs = k.logs[n:]
	k.from += n
	if len(k.logs) == 0 {
		k.logs = nil
	}
	k.size.Store(int64(len(k.logs)))
}

// len is how many entries are kept.
func (k *kept) len() int { return int(k.size.Load()) }
