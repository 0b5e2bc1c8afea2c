package node

import "context"

// cleanupChunk is the most OpLog entries one delete takes from etcd: a
// delete of millions in one transaction held etcd for more than its 5 s
// call timeout, and every export transaction and watcher with it.
const cleanupChunk = 4096

// oplogCleanup records persisted snapshots in etcd once it holds the OpLog
// they cover, and deletes the entries more than OplogRetain behind the
// newest recorded one, a chunk at a time between export transactions. It
// belongs to one leadership's export loop.
type oplogCleanup struct {
	n       *Node
	pending []snapshotDone // persisted, not recorded yet
	from    uint64         // the first entry etcd may still hold; 0 until read
	before  uint64         // the entries below it go
	deleted int64          // since the last log line
}

func (c *oplogCleanup) add(s snapshotDone) { c.pending = append(c.pending, s) }

// step records the snapshots that latest covers and deletes up to
// cleanupChunk entries. It reports whether entries are left to delete and
// the last call to etcd succeeded: an idle export then steps again at once.
func (c *oplogCleanup) step(ctx context.Context, latest uint64) bool {
	n := c.n
	rest := c.pending[:0]
	for _, s := range c.pending {
		if s.seq > latest {
			rest = append(rest, s)
			continue
		}
		if err := n.etcdCall(ctx, "snapshot_seq", func(ctx context.Context) error {
			return n.etcd.RecordSnapshotSequenceId(ctx, s.id, s.seq)
		}); err != nil {
			n.log.Warn("snapshot sequence id not recorded", "snapshot", s.id, "error", err)
			rest = append(rest, s)
			continue
		}
		if s.seq > n.cfg.OplogRetain {
			c.before = max(c.before, s.seq-n.cfg.OplogRetain)
		}
	}
	c.pending = rest
	if c.before == 0 || (c.from != 0 && c.from >= c.before) {
		return false
	}
	if c.from == 0 {
		var first uint64
		if err := n.etcdCall(ctx, "cleanup", func(ctx context.Context) (err error) {
			first, err = n.etcd.GetMinSequenceId(ctx)
			return err
		}); err != nil {
			n.log.Warn("OpLog cleanup failed", "before", c.before, "error", err)
			return false
		}
		c.from = max(first, 1)
		if first == 0 { // etcd holds no entry
			c.from = c.before
		}
	}
	end := min(c.from+cleanupChunk, c.before)
	var deleted int64
	if err := n.etcdCall(ctx, "cleanup", func(ctx context.Context) (err error) {
		deleted, err = n.etcd.DeleteOpLogRange(ctx, c.from, end)
		return err
	}); err != nil {
		n.log.Warn("OpLog cleanup failed", "from", c.from, "before", end, "error", err)
		return false
	}
	c.from, c.deleted = end, c.deleted+deleted
	if c.from < c.before {
		return true
	}
	n.log.Info("OpLog cleaned up", "before", c.before, "deleted", c.deleted)
	c.deleted = 0
	return false
}
