package node

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// saveSnapshot writes the leader's snapshot to a file and returns its path.
func saveSnapshot(t *testing.T, nd *Node) string {
	path := filepath.Join(t.TempDir(), "snap")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, nd.SnapshotSave(ctx(t), f))
	require.NoError(t, f.Close())
	return path
}

func TestOfflineRestore(t *testing.T) {
	e := testEtcd(t)
	c := newCluster(t, 1, time.Hour, withEtcd(e))
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	for i := 0; i < 10; i++ {
		put(t, nd, fmt.Sprintf("k%d", i))
	}
	path := saveSnapshot(t, nd)
	file, err := os.Open(path)
	require.NoError(t, err)
	sum, err := snapshots.Inspect(file)
	require.NoError(t, err)
	file.Close()
	peers := []raftstore.Peer{{ID: "n0", RaftAddr: "127.0.0.1:1"}}

	// Without replay the seeded state is exactly the file's.
	o := raftstore.OfflineRestore{Snapshot: path, DataDir: filepath.Join(t.TempDir(), "d"), ID: "n0", Peers: peers, ClusterID: c.cfgs[0].ClusterID}
	rep, err := o.Run(context.Background())
	require.NoError(t, err)
	fromFile := fsm.New()
	file, err = os.Open(path)
	require.NoError(t, err)
	_, err = fromFile.Restore(bufio.NewReader(file))
	file.Close()
	require.NoError(t, err)
	d := fromFile.Digest()
	assert.Equal(t, hex.EncodeToString(d[:]), rep.Digest)
	assert.Equal(t, sum.Header.AppliedSeq, rep.AppliedSeq)

	// Entries etcd no longer holds: a gap refuses the replay, unless allowed.
	for i := 10; i < 20; i++ {
		put(t, nd, fmt.Sprintf("k%d", i))
	}
	store := etcdbridge.New(nd.etcd.Client(), e)
	want := nd.Status().AppliedSeq
	require.Eventually(t, func() bool { l, _ := store.Latest(context.Background()); return l == want }, 10*time.Second, 10*time.Millisecond)
	_, err = store.CleanupOpLogBefore(context.Background(), sum.Header.AppliedSeq+3)
	require.NoError(t, err)
	o = raftstore.OfflineRestore{Snapshot: path, DataDir: filepath.Join(t.TempDir(), "d"), ID: "n0", Peers: peers, ClusterID: c.cfgs[0].ClusterID,
		ReplayEtcd: true, Etcd: e}
	_, err = o.Run(context.Background())
	assert.Equal(t, errcode.OplogEntryNotFound, errcode.Of(err), "%v", err)
	_, statErr := os.Stat(o.DataDir)
	assert.True(t, os.IsNotExist(statErr), "a refused restore writes nothing")
	o.AllowGap = true
	rep, err = o.Run(context.Background())
	require.NoError(t, err)
	assert.True(t, rep.Gap)
	assert.Equal(t, sum.Header.AppliedSeq, rep.AppliedSeq, "nothing past the gap is replayed")
}
