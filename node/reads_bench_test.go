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
// mooncakeReads is a leader holding what master_bench's prefill at 4
// clients leaves (40,000 objects, past the CPU's caches as in the real
// run), its Mooncake front and the objects' keys.
func mooncakeReads(b *testing.B) (*mooncakeapi.Front, []string) {
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
	return mooncakeapi.NewFront(nd, nd, nd.log, uint64(nd.cfg.Params.LeaseTTLMs)), keys
}

// inlineCalls makes the calls of bodies in turn through the event loop's
// inline call, from decoded request to encoded answer, and reports per
// key.
func inlineCalls(b *testing.B, front *mooncakeapi.Front, name string, bodies [][]byte, keysPerCall int) {
	id := mooncakeapi.FunctionID(name)
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
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*keysPerCall), "ns/key")
}

// BatchGet without the network, batches of 128 random keys.
//
//	go test -run '^$' -bench MooncakeBatchGet -benchmem ./node/
func BenchmarkMooncakeBatchGet(b *testing.B) {
	const batch = 128
	front, keys := mooncakeReads(b)
	rng := rand.New(rand.NewPCG(1, 2))
	bodies := make([][]byte, 256)
	for i := range bodies {
		a := mooncakeapi.KeysArgs{TenantID: "default"}
		for range batch {
			a.Keys = append(a.Keys, keys[rng.IntN(len(keys))])
		}
		var err error
		if bodies[i], err = structpack.Marshal(a); err != nil {
			b.Fatal(err)
		}
	}
	inlineCalls(b, front, "BatchGetReplicaList", bodies, batch)
}

// Get without the network, one random key a call.
//
//	go test -run '^$' -bench MooncakeGet -benchmem ./node/
func BenchmarkMooncakeGet(b *testing.B) {
	front, keys := mooncakeReads(b)
	rng := rand.New(rand.NewPCG(1, 2))
	bodies := make([][]byte, 4096)
	for i := range bodies {
		var err error
		if bodies[i], err = structpack.Marshal(mooncakeapi.KeyArgs{Key: keys[rng.IntN(len(keys))], TenantID: "default"}); err != nil {
			b.Fatal(err)
		}
	}
	inlineCalls(b, front, "GetReplicaList", bodies, 1)
}
