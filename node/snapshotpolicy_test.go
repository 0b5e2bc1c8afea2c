package node

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSnapshotDue(t *testing.T) {
	for _, tc := range []struct {
		name                                 string
		entries, threshold, logBytes, snapSz uint64
		ratio                                float64
		want                                 bool
	}{
		{"no snapshot yet", 1, 1, 1, 0, 1, true},
		{"too few entries and bytes", 99, 100, 100*entryBytes - 1, 1 << 10, 0.5, false},
		{"few entries of many bytes", 99, 100, 1 << 30, 1 << 20, 1, true},
		{"few entries of many bytes, short of the ratio", 99, 100, 1 << 19, 1 << 20, 1, false},
		{"ratio 0: bytes do not count", 99, 100, 1 << 30, 1 << 20, 0, false},
		{"a threshold past any log", 99, 1 << 62, 1 << 40, 1 << 20, 0.5, false},
		{"log smaller than the state", 1000, 100, 1 << 19, 1 << 20, 1, false},
		{"log as large as the state", 1000, 100, 1 << 20, 1 << 20, 1, true},
		{"ratio 2 waits for twice", 1000, 100, 3 << 19, 1 << 20, 2, false},
		{"ratio 2 reached", 1000, 100, 2 << 20, 1 << 20, 2, true},
		{"ratio 0: entries alone", 100, 100, 0, 1 << 30, 0, true},
		{"nothing new", 0, 0, 1 << 20, 0, 0, false},
	} {
		assert.Equal(t, tc.want, snapshotDue(tc.entries, tc.threshold, tc.logBytes, tc.snapSz, tc.ratio), tc.name)
	}
}

// TestSnapshotAfterLogAsLargeAsState: with a log ratio of 1, a node that
// has snapshotted its state takes the next snapshot only once the log
// written since is as large as that snapshot, however many entries came
// before.
func TestSnapshotAfterLogAsLargeAsState(t *testing.T) {
	c := newCluster(t, 1, time.Hour, func(cfg *Config) {
		cfg.SnapshotInterval = 20 * time.Millisecond
		cfg.SnapshotThreshold = 1
		cfg.SnapshotLogRatio = 1
	})
	nd := c.nodes[0]
	mountSegments(t, nd)
	for i := range 300 {
		put(t, nd, fmt.Sprintf("state/%d", i))
	}
	d := nd.disk
	require.Eventually(t, func() bool { return d.snapLastIndex.Load() > 0 }, 10*time.Second, 10*time.Millisecond,
		"the first snapshot is due at once")
	time.Sleep(5 * nd.cfg.SnapshotInterval) // any snapshot due is taken
	first, size := d.snapLastIndex.Load(), d.snapSize.Load()
	require.Positive(t, size)

	sinceSnapshot := func() uint64 { return d.logBytes.Load() - d.logBytesMark.Load() }
	require.Less(t, sinceSnapshot(), size, "no snapshot due once settled")
	for i := 0; sinceSnapshot() < size/2; i++ {
		put(t, nd, fmt.Sprintf("log/%d", i))
	}
	time.Sleep(10 * nd.cfg.SnapshotInterval)
	assert.Equal(t, first, d.snapLastIndex.Load(), "no snapshot while the log since is half the last one (%d of %d bytes)", sinceSnapshot(), size)

	for i := 0; sinceSnapshot() < size; i++ {
		put(t, nd, fmt.Sprintf("more/%d", i))
	}
	assert.Eventually(t, func() bool { return d.snapLastIndex.Load() > first }, 10*time.Second, 10*time.Millisecond,
		"a snapshot once the log since is as large as the last one")
}
