package fsm

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/moonraft/moonraft/lease"
	"github.com/moonraft/moonraft/snapshots"
)

// benchState builds an FSM holding n complete objects of 4 KiB in 16
// segments sized so the objects fill fill/1 of them, through Apply as the
// Raft log would. Keys are benchKey's (14 bytes).
func benchState(b *testing.B, n int, fill float64) *FSM {
	return benchStateOf(b, n, fill, 1, 16)
}

// benchStateOf is benchState with objects spread over clients, each with
// segs segments of its own, the ith object put by client i%clients.
func benchStateOf(b *testing.B, n int, fill float64, clients, segs int) *FSM {
	b.Helper()
	f := New()
	const objSize = 4096
	segSize := uint64(float64(n)/fill/float64(clients*segs)+1) * objSize
	now := int64(1_700_000_000_000)
	client := func(i int) string {
		if clients == 1 {
			return "bench"
		}
		return fmt.Sprintf("5f0c8a51-21f4-4c49-9d5e-%012d", i) // a Mooncake client's UUID
	}
	for i := 0; i < clients*segs; i++ {
		f.Apply(Encode(&MountSegment{NowMs: now, ClientID: client(i / segs), Segment: SegmentSpec{
			ID: fmt.Sprintf("seg-%02d", i), Name: fmt.Sprintf("host-%02d:7000", i), Base: 0x7f0000000000 + uint64(i)*segSize, Size: segSize}}))
	}
	for i := 0; i < n; i++ {
		key, c := benchKey(i), client(i%clients)
		if r := f.Apply(Encode(&PutStart{NowMs: now, Key: key, SliceLengths: []uint64{objSize}, ReplicaNum: 1, ClientID: c})); r.Err != nil {
			b.Fatal(r.Err)
		}
		f.Apply(Encode(&PutEnd{NowMs: now, Key: key, ClientID: c}))
		if f.ring.len() >= 100_000 {
			f.Apply(Encode(&Exported{Seq: f.appliedSeq}))
		}
	}
	f.Apply(Encode(&Exported{Seq: f.appliedSeq}))
	return f
}

// benchKey is the i-th key, "b/" and 12 hex digits: a bijection of i, so
// keys are in hash order, as Mooncake's clients' keys (hashes of token
// blocks) are. Made in key order, objects would lie in memory in key order,
// and every walk of the tree, the collector's included, would look cheaper
// than users see.
func benchKey(i int) string {
	v := uint64(i) * 0x9e3779b97f4a7c15 & (1<<48 - 1)
	return fmt.Sprintf("b/%012x", v^v>>24)
}

// BenchmarkPutPair: one PutStart and its PutEnd, decoded and applied as from
// the Raft log, into a state that grows to b.N objects.
func BenchmarkPutPair(b *testing.B) {
	f := benchState(b, 0, 1)
	f.Apply(Encode(&MountSegment{NowMs: 1, ClientID: "bench", Segment: SegmentSpec{ID: "big", Name: "big", Base: 1 << 50, Size: 1 << 48}}))
	starts, ends := make([][]byte, b.N), make([][]byte, b.N)
	for i := range starts {
		starts[i] = Encode(&PutStart{NowMs: 2, Key: benchKey(i), SliceLengths: []uint64{4096}, ReplicaNum: 1, ClientID: "bench"})
		ends[i] = Encode(&PutEnd{NowMs: 2, Key: benchKey(i), ClientID: "bench"})
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if r := f.Apply(starts[i]); r.Err != nil {
			b.Fatal(r.Err)
		}
		f.Apply(ends[i])
		if i%10_000 == 0 {
			f.Apply(Encode(&Exported{Seq: f.appliedSeq}))
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
}

// BenchmarkGetReplicaList: the state's part of a read, one key at a time in
// random order out of 160,000 objects (master_bench's prefill at 16
// clients), found through the object tree (a follower's state) and through
// the key index (the leader's).
func BenchmarkGetReplicaList(b *testing.B) {
	const n = 160_000
	f := benchState(b, n, 0.5)
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = benchKey(rng.IntN(n))
	}
	for _, indexed := range []bool{false, true} {
		b.Run(map[bool]string{false: "tree", true: "index"}[indexed], func(b *testing.B) {
			f.IndexKeys(indexed)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if r := f.GetReplicaList(keys[i%len(keys)], f.nowMs); !r.Found {
					b.Fatal(r.Err)
				}
			}
		})
	}
}

// BenchmarkIndexKeys1M: building the key index of 1,000,000 objects, which
// a new leader does once promoted, beside its first requests.
func BenchmarkIndexKeys1M(b *testing.B) {
	f := benchState(b, 1_000_000, 0.5)
	for b.Loop() {
		f.IndexKeys(false)
		f.IndexKeys(true)
		if len(f.byKey) != 1_000_000 {
			b.Fatal("the index is not complete")
		}
	}
}

// BenchmarkTickRenewals: a Tick carrying 1,500 read-lease renewals (seed
// 000's peak of 15,000 renewals/s at 10 ticks/s) into 100,000 objects.
func BenchmarkTickRenewals(b *testing.B) {
	const n, renewals = 100_000, 1500
	f := benchState(b, n, 0.5)
	rng := rand.New(rand.NewPCG(1, 2))
	ticks := make([][]byte, 64)
	now := f.nowMs
	for i := range ticks {
		now += 100
		t := &Tick{NowMs: now}
		for j := 0; j < renewals; j++ {
			t.Renewals = append(t.Renewals, lease.Renewal{Key: benchKey(rng.IntN(n)), AtMs: now})
		}
		t.Pings = []lease.Ping{{ClientID: "bench", AtMs: now}}
		ticks[i] = Encode(t)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f.Apply(ticks[i%len(ticks)])
	}
	b.ReportMetric(float64(b.N*renewals)/b.Elapsed().Seconds(), "renewals/s")
}

// BenchmarkEvict: one Tick that evicts 100,000 objects. In "all" the state
// holds exactly those; in "of1M" it holds 1,000,000 over the watermark and
// the tick evicts 10 % of capacity, so the candidate scan is included.
func BenchmarkEvict(b *testing.B) {
	for _, tc := range []struct {
		name  string
		n     int
		ratio uint64
	}{{"all100k", 100_000, ppm}, {"100kOf1M", 1_000_000, 100_000}} {
		b.Run(tc.name, func(b *testing.B) {
			base := benchState(b, tc.n, 1)
			var snap bytes.Buffer
			if err := base.Snapshot().Write(&snap, snapshots.Header{}); err != nil {
				b.Fatal(err)
			}
			var evicted uint64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				f := New()
				if _, err := f.Restore(bytes.NewReader(snap.Bytes())); err != nil {
					b.Fatal(err)
				}
				p := f.params
				p.EvictionRatioPPM = tc.ratio
				f.Apply(Encode(&Promote{NowMs: f.nowMs, LeaderID: "n", Term: 1, Params: p}))
				now := f.nowMs + p.LeaseTTLMs
				tick := Encode(&Tick{NowMs: now, Pings: []lease.Ping{{ClientID: "bench", AtMs: now}}, Evict: true})
				runtime.GC()
				b.StartTimer()
				evicted += f.Apply(tick).Evicted
			}
			b.ReportMetric(float64(evicted)/float64(b.N), "evicted/op")
			b.ReportMetric(float64(evicted)/b.Elapsed().Seconds(), "evictions/s")
		})
	}
}

// BenchmarkSnapshot1M writes and restores a state of 1,000,000 objects,
// and takes its digest.
func BenchmarkSnapshot1M(b *testing.B) {
	f := benchState(b, 1_000_000, 0.5)
	var buf bytes.Buffer
	// Written once here too, so that restore runs alone (-bench Snapshot1M/restore).
	if err := f.Snapshot().Write(&buf, snapshots.Header{}); err != nil {
		b.Fatal(err)
	}
	b.Run("write", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			buf.Reset()
			if err := f.Snapshot().Write(&buf, snapshots.Header{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(buf.Len())/1e6, "MB")
	})
	b.Run("restore", func(b *testing.B) { benchRestore(b, buf.Bytes(), runtime.GOMAXPROCS(0)) })
	b.Run("restore-in-turn", func(b *testing.B) { benchRestore(b, buf.Bytes(), 1) })
	b.Run("digest", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			f.Digest()
		}
	})
	// What a status with digests holds the state's lock for.
	b.Run("capture", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			f.Snapshot()
		}
	})
}

// objectsOf10kClients sizes BenchmarkSnapshot1MOf10kClients's state, so
// that its figure at the scale harness's larger sizes is the same command's.
var objectsOf10kClients = flag.Int("objects-of-10k-clients", 1_000_000, "objects in BenchmarkSnapshot1MOf10kClients's state")

// BenchmarkSnapshot1MOf10kClients writes and restores a million objects
// (-objects-of-10k-clients) of 10,000 clients, a segment each: the scale
// harness's state (moonbench --scale), where each object's owner and
// segment are one of 10,000.
func BenchmarkSnapshot1MOf10kClients(b *testing.B) {
	f := benchStateOf(b, *objectsOf10kClients, 0.5, 10_000, 1)
	var buf bytes.Buffer
	if err := f.Snapshot().Write(&buf, snapshots.Header{}); err != nil {
		b.Fatal(err)
	}
	b.Run("write", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if err := f.Snapshot().Write(io.Discard, snapshots.Header{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) { benchRestore(b, buf.Bytes(), runtime.GOMAXPROCS(0)) })
	b.Run("in-turn", func(b *testing.B) { benchRestore(b, buf.Bytes(), 1) })
}

// benchRestore restores file as a node does (width GOMAXPROCS) or in turn
// (width 1).
func benchRestore(b *testing.B, file []byte, width int) {
	// Without collections, as a node restores (internal/memlimit.Hold).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		g := New()
		if _, err := g.restore(bytes.NewReader(file), width, inGoroutines, objectBatch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(file))/1e6, "MB")
}

// BenchmarkHeapPerObject measures live heap bytes per complete object
// (one replica, one slice), key bytes aside: a follower's state, and the
// leader's with its key index.
func BenchmarkHeapPerObject(b *testing.B) {
	const n = 1_000_000
	for _, leader := range []bool{false, true} {
		b.Run(map[bool]string{false: "follower", true: "leader"}[leader], func(b *testing.B) {
			heapPerObject(b, n, func() *FSM {
				f := benchState(b, n, 0.5)
				f.IndexKeys(leader)
				return f
			})
		})
	}
	// A follower's state restored from a snapshot: its tree built full
	// (btree.Builder), not grown by inserts.
	b.Run("restored", func(b *testing.B) {
		var file bytes.Buffer
		if err := benchState(b, n, 0.5).Snapshot().Write(&file, snapshots.Header{}); err != nil {
			b.Fatal(err)
		}
		heapPerObject(b, n, func() *FSM {
			f := New()
			if _, err := f.Restore(bytes.NewReader(file.Bytes())); err != nil {
				b.Fatal(err)
			}
			return f
		})
	})
}

// heapPerObject reports the live heap of the state build makes, per object
// of its n, key bytes aside.
func heapPerObject(b *testing.B, n int, build func() *FSM) {
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f := build()
		runtime.GC()
		runtime.ReadMemStats(&after)
		keyBytes := n * len(benchKey(0))
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)-int64(keyBytes))/float64(n), "B/object")
		runtime.KeepAlive(f)
	}
}

// BenchmarkBatchPut: what a node does per object of a 32-key batch put on
// the leader: encode the BatchPutStart and BatchPutEnd entries, decode and
// apply them, and trim the ring the way the exporter's acknowledgements do
// (every 640 entries, about 20 ms at 30,000 objects/s).
func BenchmarkBatchPut(b *testing.B) {
	const batch = 32
	f := benchState(b, 0, 1)
	f.Apply(Encode(&MountSegment{NowMs: 1, ClientID: "bench", Segment: SegmentSpec{ID: "big", Name: "big", Base: 1 << 50, Size: 1 << 48}}))
	b.ReportAllocs()
	b.ResetTimer()
	starts, ends := make([]Command, batch), make([]Command, batch)
	for i := 0; i < b.N; i += batch {
		for j := range batch {
			key := benchKey(i + j)
			starts[j] = &PutStart{NowMs: 2, Key: key, SliceLengths: []uint64{4096}, ReplicaNum: 1, ClientID: "bench"}
			ends[j] = &PutEnd{NowMs: 2, Key: key, ClientID: "bench"}
		}
		for _, r := range f.Apply(Encode(&Batch{Cmds: starts})).Batch {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
		f.Apply(Encode(&Batch{Cmds: ends}))
		if i%640 < batch {
			f.Apply(Encode(&Exported{Seq: f.appliedSeq}))
		}
	}
}

// BenchmarkUnmountSegment: unmounting one of a client's many segments in a
// state of 1,000,000 objects (master_bench's clients leave with 128 each):
// the segment holds nothing, so what is measured is finding that out.
func BenchmarkUnmountSegment(b *testing.B) {
	f := benchState(b, 1_000_000, 0.5)
	now := f.nowMs
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		id := fmt.Sprintf("spare-%d", i)
		f.Apply(Encode(&MountSegment{NowMs: now, ClientID: "bench", Segment: SegmentSpec{
			ID: id, Name: id, Base: 0x100000000000 + uint64(i)<<30, Size: 1 << 30}}))
		b.StartTimer()
		if r := f.Apply(Encode(&UnmountSegment{NowMs: now, ClientID: "bench", SegmentID: id})); r.Err != nil {
			b.Fatal(r.Err)
		}
	}
}

// BenchmarkUnmountFullSegment: unmounting a 16 MiB segment full of 4 KiB
// objects (master_bench's with --segment_size=16777216) in a state of
// 1,000,000 objects, the export acknowledged as it goes; per object
// removed.
func BenchmarkUnmountFullSegment(b *testing.B) {
	const perSegment = 4096
	f := benchState(b, 1_000_000, 0.5)
	now := f.nowMs
	f.Apply(Encode(&Exported{Seq: f.appliedSeq}))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		id := fmt.Sprintf("full-%d", i)
		f.Apply(Encode(&MountSegment{NowMs: now, ClientID: "bench", Segment: SegmentSpec{
			ID: id, Name: id, Base: 0x100000000000 + uint64(i)<<30, Size: perSegment * 4096}}))
		for j := 0; j < perSegment; j += 64 {
			starts, ends := make([]Command, 64), make([]Command, 64)
			for k := range starts {
				key := fmt.Sprintf("%s/%d", id, j+k)
				starts[k] = &PutStart{NowMs: now, Key: key, SliceLengths: []uint64{4096}, ReplicaNum: 1, PreferredSegment: id, ClientID: "bench"}
				ends[k] = &PutEnd{NowMs: now, Key: key, ClientID: "bench"}
			}
			f.Apply(Encode(&Batch{Cmds: starts}))
			f.Apply(Encode(&Batch{Cmds: ends}))
		}
		f.Apply(Encode(&Exported{Seq: f.appliedSeq}))
		b.StartTimer()
		r := f.Apply(Encode(&UnmountSegment{NowMs: now, ClientID: "bench", SegmentID: id}))
		if r.Err != nil || r.Removed != perSegment {
			b.Fatalf("removed %d: %v", r.Removed, r.Err)
		}
		b.StopTimer()
		f.Apply(Encode(&ReleaseRemovals{NowMs: now, Max: perSegment, Direct: 1024}))
		f.Apply(Encode(&Exported{Seq: f.appliedSeq}))
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perSegment), "ns/object")
}

// BenchmarkEvictionChurn: batch puts of 128 objects into full segments,
// each made room for by an eviction tick, as a cache under sustained writes
// runs, with the export acknowledged at once or 250,000 entries behind.
// Every evicted key leaves a tombstone kept KeySeqRetainMs (an hour), so
// after b.N objects there are about b.N of them. max-apply-ms is the
// longest single Apply: a pause every node takes at the same entry.
func BenchmarkEvictionChurn(b *testing.B) {
	for _, backlog := range []uint64{0, 250_000} {
		b.Run(fmt.Sprintf("backlog%d", backlog), func(b *testing.B) {
			const batch, objSize, capacity = 128, 4096, 200_000
			f := New()
			f.Apply(Encode(&MountSegment{NowMs: 1, ClientID: "bench", Segment: SegmentSpec{ID: "s", Name: "s", Base: 1 << 40, Size: capacity * objSize}}))
			now := int64(2)
			starts, ends := make([]Command, batch), make([]Command, batch)
			var longest time.Duration
			apply := func(cmd []byte) {
				t0 := time.Now()
				f.Apply(cmd)
				longest = max(longest, time.Since(t0))
			}
			b.ResetTimer()
			for i := 0; i < b.N; i += batch {
				now += 10
				if f.EvictionDue() {
					apply(Encode(&Tick{NowMs: now, Pings: []lease.Ping{{ClientID: "bench", AtMs: now}}, Evict: true}))
				}
				for j := range batch {
					key := benchKey(i + j)
					starts[j] = &PutStart{NowMs: now, Key: key, SliceLengths: []uint64{objSize}, ReplicaNum: 1, ClientID: "bench"}
					ends[j] = &PutEnd{NowMs: now, Key: key, ClientID: "bench"}
				}
				apply(Encode(&Batch{Cmds: starts}))
				apply(Encode(&Batch{Cmds: ends}))
				if f.appliedSeq > backlog {
					apply(Encode(&Exported{Seq: f.appliedSeq - backlog}))
				}
			}
			b.ReportMetric(float64(longest.Microseconds())/1000, "max-apply-ms")
			b.ReportMetric(float64(f.tombstones.Len()), "tombstones")
		})
	}
}

// BenchmarkGCPerObject measures the collector's CPU per object of a full
// collection over a state of 1M complete objects (one replica, one slice):
// what every collection of a large state pays, a follower's and the
// leader's with its key index.
func BenchmarkGCPerObject(b *testing.B) {
	const n = 1_000_000
	for _, leader := range []bool{false, true} {
		b.Run(map[bool]string{false: "follower", true: "leader"}[leader], func(b *testing.B) {
			f := benchState(b, n, 0.5)
			f.IndexKeys(leader)
			runtime.GC()
			sample := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
			metrics.Read(sample)
			before := sample[0].Value.Float64()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				runtime.GC()
			}
			b.StopTimer()
			metrics.Read(sample)
			b.ReportMetric((sample[0].Value.Float64()-before)/float64(b.N)/n*1e9, "gc-ns/object")
			runtime.KeepAlive(f)
		})
	}
}
