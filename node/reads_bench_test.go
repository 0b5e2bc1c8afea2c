package node

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/mooncakeapi"
	"github.com/moonraft/moonraft/structpack"
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

// BenchmarkMooncakeBatchGet is the leader's answer to master_bench's
// BatchGet without the network: 40,000 objects (its prefill at 4 clients),
// batches of 128 random keys through the event loop's inline call, decode
// to encoded answer. Reported per key; the working set is past the CPU's
// caches, as in the real run.
//
//	go test -run '^$' -bench MooncakeBatchGet -benchmem ./node/
func BenchmarkMooncakeBatchGet(b *testing.B) {
	const objects, batch = 40_000, 128
	c := newCluster(b, 3, 100*time.Millisecond, func(cfg *Config) { cfg.Logger = quiet(cfg.ID) })
	nd := c.nodes[c.leader()]
	mountSegmentsB(b, nd)
	keys := make([]string, objects)
	for i := range keys {
		keys[i] = fmt.Sprintf("140213547710016_%d", i)
	}
	for lo := 0; lo < objects; lo += batch {
		var starts, ends fsm.Batch
		for _, k := range keys[lo:min(lo+batch, objects)] {
			starts.Cmds = append(starts.Cmds, &fsm.PutStart{NowMs: nd.Now(), Key: k, SliceLengths: []uint64{4096}, ReplicaNum: 1, ClientID: "bench"})
			ends.Cmds = append(ends.Cmds, &fsm.PutEnd{NowMs: nd.Now(), Key: k, ClientID: "bench"})
		}
		for _, cmd := range []fsm.Command{&starts, &ends} {
			if _, err := nd.Propose(b.Context(), cmd); err != nil {
				b.Fatal(err)
			}
		}
	}
	front := &mooncakeFront{n: nd, local: mooncakeapi.NewHandler(nd, nd.log, uint64(nd.cfg.Params.LeaseTTLMs))}
	id := mooncakeapi.FunctionID("BatchGetReplicaList")
	rng := rand.New(rand.NewPCG(1, 2))
	bodies := make([][]byte, 256)
	for i := range bodies {
		a := mooncakeapi.KeysArgs{TenantID: "default"}
		for range batch {
			a.Keys = append(a.Keys, keys[rng.IntN(objects)])
		}
		var err error
		if bodies[i], err = structpack.Marshal(a); err != nil {
			b.Fatal(err)
		}
	}
	// The first read confirms the leader's lease (a quorum round, which an
	// inline call does not wait for).
	if _, errc, msg := front.Call(b.Context(), id, bodies[0], nil); errc != 0 {
		b.Fatal(errc, msg)
	}
	b.ReportAllocs()
	var out []byte // reused, as the event loop reuses its buffer
	for i := 0; b.Loop(); i++ {
		res, errc, msg, done := front.CallInline(b.Context(), id, bodies[i%len(bodies)], out[:0])
		if !done || errc != 0 {
			b.Fatal(errc, msg, done)
		}
		out = res
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/key")
}
