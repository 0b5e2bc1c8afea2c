package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/moonraft/moonraft/etcdfollower"
	"github.com/moonraft/moonraft/fsm"
)

// lagSampler measures how long after the leader applied a seq another
// party (etcd, a follower) reached it: every 5 ms it notes (leader seq,
// time) and resolves earlier notes the party has caught up with.
type lagSampler struct {
	pending []struct {
		seq uint64
		at  time.Time
	}
	lags []time.Duration
}

func (s *lagSampler) sample(leaderSeq, partySeq uint64, now time.Time) {
	s.pending = append(s.pending, struct {
		seq uint64
		at  time.Time
	}{leaderSeq, now})
	i := 0
	for ; i < len(s.pending) && s.pending[i].seq <= partySeq; i++ {
		s.lags = append(s.lags, now.Sub(s.pending[i].at))
	}
	s.pending = s.pending[i:]
}

func (s *lagSampler) quantile(q float64) time.Duration {
	if len(s.lags) == 0 {
		return 0
	}
	l := slices.Clone(s.lags)
	slices.Sort(l)
	return l[int(q*float64(len(l)-1))]
}

// BenchmarkExportLoad writes objects at a target rate into a three-node
// cluster exporting to an embedded etcd, with an etcd follower attached,
// for a fixed time, and reports etcd entries/s, export lag, follower lag,
// and etcd transactions and bytes per 1,000 object writes.
//
//	go test -run=^$ -bench=ExportLoad -benchtime=1x ./node/
func BenchmarkExportLoad(b *testing.B) {
	for _, rate := range []int{2500, 5000, 10_000, 40_000} { // objects per second (one PUT_END entry each)
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) { exportLoad(b, rate) })
	}
}

func exportLoad(b *testing.B, rate int) {
	const (
		perBatch = 50 // objects per BatchPutStart/BatchPutEnd
		writers  = 16
		duration = 10 * time.Second
	)
	for i := 0; i < b.N; i++ {
		e := testEtcd(b)
		c := newCluster(b, 3, time.Hour, withEtcd(e), func(c *Config) { c.Logger = quiet(c.ID) })
		nd := c.nodes[c.leader()]
		mountSegmentsB(b, nd)
		ef, err := etcdfollower.Start(etcdfollower.Config{ID: "obs", GRPCAddr: freeAddr(b), Etcd: e})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), duration)
		var objects atomic.Int64
		var wg sync.WaitGroup
		interval := time.Duration(float64(time.Second) * perBatch * writers / float64(rate))
		start := time.Now()
		startSeq := nd.Status().AppliedSeq
		base := nd.etcd.Stats()
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk := time.NewTicker(interval)
				defer tk.Stop()
				for n := 0; ctx.Err() == nil; n++ {
					now := time.Now().UnixMilli()
					starts := make([]fsm.Command, perBatch)
					ends := make([]fsm.Command, perBatch)
					for j := range starts {
						key := fmt.Sprintf("w%d/%d/%d", w, n, j)
						starts[j] = &fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{4096}, ReplicaNum: 1, ClientID: "bench"}
						ends[j] = &fsm.PutEnd{NowMs: now, Key: key, ClientID: "bench"}
					}
					if _, err := nd.ProposeBatch(ctx, starts); err == nil {
						if _, err := nd.ProposeBatch(ctx, ends); err == nil {
							objects.Add(perBatch)
						}
					}
					select {
					case <-ctx.Done():
					case <-tk.C:
					}
				}
			}()
		}
		var exportLag, followLag lagSampler
		for ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
			st := nd.Status()
			now := time.Now()
			exportLag.sample(st.AppliedSeq, nd.exportedSeq.Load(), now)
			followLag.sample(st.AppliedSeq, ef.Follower().AppliedSeq(), now)
		}
		wg.Wait()
		elapsed := time.Since(start)
		cancel()
		endSeq := nd.Status().AppliedSeq
		// Let etcd and the follower finish, then read the totals.
		wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
		for nd.exportedSeq.Load() < endSeq && wctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		_ = ef.Follower().WaitFor(wctx, endSeq)
		wcancel()
		st := nd.etcd.Stats()
		n := float64(objects.Load())
		b.ReportMetric(n/elapsed.Seconds(), "objects/s")
		b.ReportMetric(float64(endSeq-startSeq)/elapsed.Seconds(), "etcd-entries/s")
		b.ReportMetric(float64(exportLag.quantile(0.5).Microseconds())/1000, "export-lag-p50-ms")
		b.ReportMetric(float64(exportLag.quantile(0.99).Microseconds())/1000, "export-lag-p99-ms")
		b.ReportMetric(float64(followLag.quantile(0.5).Microseconds())/1000, "follower-lag-p50-ms")
		b.ReportMetric(float64(followLag.quantile(0.99).Microseconds())/1000, "follower-lag-p99-ms")
		b.ReportMetric(float64(st.OplogTxns-base.OplogTxns)/n*1000, "etcd-txns/1k-objects")
		b.ReportMetric(float64(st.OplogBytes-base.OplogBytes)/n*1000, "etcd-bytes/1k-objects")
		_ = ef.Close()
	}
}

// BenchmarkRenewalExport reads 15,000 distinct keys a second (each read
// renews a lease) and reports the etcd transactions the once-a-second
// lease_renewals/ export costs.
//
//	go test -run=^$ -bench=RenewalExport -benchtime=1x ./node/
func BenchmarkRenewalExport(b *testing.B) {
	const (
		keys     = 15_000
		duration = 5 * time.Second
	)
	for i := 0; i < b.N; i++ {
		e := testEtcd(b)
		c := newCluster(b, 3, 100*time.Millisecond, withEtcd(e), func(c *Config) { c.Logger = quiet(c.ID) })
		nd := c.nodes[c.leader()]
		mountSegmentsB(b, nd)
		ctx := context.Background()
		for lo := 0; lo < keys; lo += 500 {
			var cmds []fsm.Command
			for j := lo; j < lo+500; j++ {
				key := fmt.Sprintf("r/%d", j)
				cmds = append(cmds, &fsm.PutStart{NowMs: nd.Now(), Key: key, SliceLengths: []uint64{64}, ReplicaNum: 1, ClientID: "bench"},
					&fsm.PutEnd{NowMs: nd.Now(), Key: key, ClientID: "bench"})
			}
			if _, err := nd.ProposeBatch(ctx, cmds); err != nil {
				b.Fatal(err)
			}
		}
		base := nd.etcd.Stats()
		start := time.Now()
		var reads atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < 64; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Each second, every key is read once: 15,000 renewals/s.
				for sec := 0; time.Since(start) < duration; sec++ {
					for k := w; k < keys; k += 64 {
						if _, _, err := nd.ExistKey(ctx, fmt.Sprintf("r/%d", k)); err == nil {
							reads.Add(1)
						}
					}
					time.Sleep(time.Until(start.Add(time.Duration(sec+1) * time.Second)))
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		time.Sleep(1100 * time.Millisecond) // the last flush
		st := nd.etcd.Stats()
		b.ReportMetric(float64(reads.Load())/elapsed.Seconds(), "renewals/s")
		b.ReportMetric(float64(st.RenewalTxns-base.RenewalTxns)/elapsed.Seconds(), "etcd-txns/s")
		b.ReportMetric(float64(st.RenewalBytes-base.RenewalBytes)/elapsed.Seconds()/1e6, "etcd-MB/s")
	}
}

func quiet(id string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: id, Level: hclog.Error})
}

// mountSegmentsB mounts room for a benchmark's objects.
func mountSegmentsB(b *testing.B, nd *Node) {
	for i := 0; i < 4; i++ {
		_, err := nd.Propose(context.Background(), &fsm.MountSegment{NowMs: nd.Now(), ClientID: "bench",
			Segment: fsm.SegmentSpec{ID: fmt.Sprintf("s%d", i), Name: fmt.Sprintf("host%d", i), Base: uint64(i) << 44, Size: 1 << 40}})
		if err != nil {
			b.Fatal(err)
		}
	}
}
