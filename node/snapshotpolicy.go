package node

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/hashicorp/raft"
)

// The snapshot rule. hashicorp/raft snapshots once SnapshotThreshold log
// entries have followed the last snapshot: under steady writes a snapshot
// every half minute or so whatever the state's size, so the cost of
// snapshotting grew as the state times the write rate (issue 41: 176 MB
// at three million objects). A node with a SnapshotLogRatio instead waits
// until the log written since the last snapshot is also that many times
// the last snapshot's size, as etcd and CockroachDB truncate their logs
// against the state: snapshots then cost in proportion to the write rate
// alone, and a restart replays at most about ratio snapshots' worth of
// log. Raft's own rule is turned off (startRaft) and snapshotLoop checks
// this one every SnapshotInterval.

// snapshotDue says whether a snapshot is due: at least threshold entries
// or threshold × entryBytes bytes of log (one entry, at the least), and
// ratio × snapSize bytes of log, since the last one.
func snapshotDue(entries, threshold, logBytes, snapSize uint64, ratio float64) bool {
	enough := entries >= threshold || (ratio > 0 && logBytes/entryBytes >= threshold)
	return entries > 0 && enough && float64(logBytes) >= ratio*float64(snapSize)
}

// entryBytes is about a put's log entry. The threshold keeps a small
// state from being snapshotted at every check, and stands for that many
// puts' bytes as well as their entries. The ticks of 10,000 idle clients'
// pings are 17 KB each, 23 a second: counted in entries alone they reached
// the threshold after 12 minutes, with seven times the state's size in log
// to replay at a restart (docs/BENCHMARKS.md, "Production size").
const entryBytes = 256

// snapshotLoop takes a snapshot whenever snapshotDue says so, until ctx
// ends. It looks after a random wait between one and two
// SnapshotIntervals, as hashicorp/raft does: nodes started together
// would otherwise all snapshot at the same moment (they did, under
// master_bench's load).
func (n *Node) snapshotLoop(ctx context.Context) {
	wait := func() time.Duration { return n.cfg.SnapshotInterval + rand.N(n.cfg.SnapshotInterval) }
	t := time.NewTimer(wait())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(wait())
		d := n.disk
		// Entries the state machine has applied since: Raft's own (no-ops,
		// barriers, configurations) are in no snapshot, and a snapshot
		// asked for with nothing new fails.
		applied := n.sm.appliedIndex.Load()
		entries := applied - min(d.snapLastIndex.Load(), applied)
		logBytes := d.logBytes.Load() - d.logBytesMark.Load()
		if !snapshotDue(entries, n.cfg.SnapshotThreshold, logBytes, d.snapSize.Load(), n.cfg.SnapshotLogRatio) {
			continue
		}
		n.log.Info("taking a snapshot", "entries_since_last", entries, "log_bytes_since_last", logBytes, "last_snapshot_bytes", d.snapSize.Load())
		if err := n.raft.Snapshot().Error(); err != nil && !errors.Is(err, raft.ErrNothingNewToSnapshot) {
			n.log.Warn("snapshot failed", "error", err)
		}
	}
}
