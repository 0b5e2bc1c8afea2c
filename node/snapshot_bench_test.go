package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/raftstore"
	"github.com/moonraft/moonraft/snapshots"
)

// fillObjects writes n objects through Raft in batches of 1,000 puts.
func fillObjects(b *testing.B, nd *Node, prefix string, n int) {
	const batch = 1000
	for lo := 0; lo < n; lo += batch {
		cmds := make([]fsm.Command, 0, 2*batch)
		for i := lo; i < min(lo+batch, n); i++ {
			key := fmt.Sprintf("%s%08d", prefix, i)
			cmds = append(cmds, &fsm.PutStart{NowMs: nd.Now(), Key: key, SliceLengths: []uint64{4096}, ReplicaNum: 1, ClientID: "bench"},
				&fsm.PutEnd{NowMs: nd.Now(), Key: key, ClientID: "bench"})
		}
		if _, err := nd.ProposeBatch(context.Background(), cmds); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshotTool1M: save (streamed from the leader over the node
// API), inspect, live restore through Raft and offline restore of a state
// of 1,000,000 objects, and the rate of replaying OpLog entries from etcd.
//
//	go test -run=^$ -bench=SnapshotTool1M -benchtime=1x ./node/
func BenchmarkSnapshotTool1M(b *testing.B) {
	const objects, replay = 1_000_000, 100_000
	for i := 0; i < b.N; i++ {
		e := testEtcd(b)
		c := newCluster(b, 1, time.Hour, withEtcd(e), func(c *Config) {
			c.Logger = quiet(c.ID)
			c.ExportRenewals = false
			c.SnapshotThreshold = 1 << 40 // no automatic snapshot during the fill
		})
		nd := c.nodes[c.leader()]
		mountSegmentsB(b, nd)
		fillObjects(b, nd, "a/", objects)
		waitAllExported(nd)
		dir := b.TempDir()
		path := filepath.Join(dir, "snap")

		start := time.Now()
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := nd.SnapshotSave(context.Background(), f); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "save-s")
		st, _ := os.Stat(path)
		b.ReportMetric(float64(st.Size())/1e6, "file-MB")

		start = time.Now()
		f, _ = os.Open(path)
		if _, err := snapshots.Inspect(f); err != nil {
			b.Fatal(err)
		}
		f.Close()
		b.ReportMetric(time.Since(start).Seconds(), "inspect-s")

		start = time.Now()
		f, _ = os.Open(path)
		if err := nd.SnapshotRestore(context.Background(), f); err != nil {
			b.Fatal(err)
		}
		f.Close()
		b.ReportMetric(time.Since(start).Seconds(), "live-restore-s")

		// OpLog entries after the snapshot, for the replay.
		fillObjects(b, nd, "b/", replay/2) // a PUT_END entry each
		waitAllExported(nd)
		o := raftstore.OfflineRestore{Snapshot: path, DataDir: filepath.Join(dir, "d0"), ID: "n0",
			Peers: []raftstore.Peer{{ID: "n0", RaftAddr: "127.0.0.1:1"}}, ClusterID: c.cfgs[0].ClusterID}
		start = time.Now()
		if _, err := o.Run(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(time.Since(start).Seconds(), "offline-restore-s")
		o.DataDir, o.ReplayEtcd, o.Etcd = filepath.Join(dir, "d1"), true, e
		rep, err := o.Run(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rep.Replayed), "replayed")
		b.ReportMetric(float64(rep.Replayed)/rep.ReplayTime.Seconds(), "replay-entries/s")
	}
}

// waitAllExported waits until etcd holds every entry the leader applied.
func waitAllExported(nd *Node) {
	want := nd.Status().AppliedSeq
	for nd.exportedSeq.Load() < want {
		time.Sleep(10 * time.Millisecond)
	}
}
