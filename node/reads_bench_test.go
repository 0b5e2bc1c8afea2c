package node

import (
	"fmt"

	"github.com/moonraft/moonraft/fsm"
	"testing"
	"time"
)

// BenchmarkReads is one leader's read path without the network: a lease
// read, a quorum read, and a batch of 32 under the lease.
//
//	go test -run '^$' -bench Reads -benchmem ./node/
func BenchmarkReads(b *testing.B) {
	for _, mode := range []ReadMode{ReadLease, ReadQuorum} {
		b.Run(string(mode), func(b *testing.B) {
			c := newCluster(b, 3, 100*time.Millisecond, withReadMode(mode), func(cfg *Config) { cfg.Logger = quiet(cfg.ID) })
			nd := c.nodes[c.leader()]
			mountSegmentsB(b, nd)
			keys := make([]string, 32)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d", i)
				for _, cmd := range []fsm.Command{
					&fsm.PutStart{NowMs: nd.Now(), Key: keys[i], SliceLengths: []uint64{1024}, ReplicaNum: 2, ClientID: "bench"},
					&fsm.PutEnd{NowMs: nd.Now(), Key: keys[i], ClientID: "bench"},
				} {
					if r, err := nd.Propose(b.Context(), cmd); err != nil || r.Err != nil {
						b.Fatal(err, r.Err)
					}
				}
			}
			b.Run("get", func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if _, _, err := nd.GetReplicaList(b.Context(), keys[i%len(keys)]); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("batch-get-32", func(b *testing.B) {
				for b.Loop() {
					if _, err := nd.BatchGetReplicaList(b.Context(), keys); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
