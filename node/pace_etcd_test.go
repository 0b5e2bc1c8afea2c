package node

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/fsm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWritesPacedToSlowEtcd: etcd slowed by a toxiproxy latency toxic
// (every call 100 ms slower) while writers put batches faster than it
// takes their OpLog entries. No write fails; the backlog stays within the
// soft bound plus the puts in flight; the admitted rate follows etcd's.
func TestWritesPacedToSlowEtcd(t *testing.T) {
	const (
		soft    = 1500
		writers = 4
		batch   = 32
		run     = 8 * time.Second
	)
	e := testEtcd(t)
	proxy := etcdProxy(t, e.Endpoints[0])
	viaProxy := e
	viaProxy.Endpoints = []string{"http://" + proxy.Listen}
	c := newCluster(t, 3, 50*time.Millisecond, withEtcd(viaProxy), func(c *Config) {
		c.ExportRenewals = false
		c.ExportSoftEntries = soft
	})
	nd := c.nodes[c.leader()]
	direct, err := etcdbridge.Open(e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })
	mountSegments(t, nd)

	_, err = proxy.Toxics.AddToxicJson(strings.NewReader(
		`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":100}}`))
	require.NoError(t, err)

	var (
		failures   atomic.Int64
		firstErr   atomic.Value
		puts       atomic.Int64
		maxBacklog atomic.Uint64
		wg         sync.WaitGroup
	)
	stopAt := time.Now().Add(run)
	fail := func(err error) {
		failures.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stopAt); i++ {
				var starts, ends []fsm.Command
				for j := range batch {
					k := fmt.Sprintf("w%d-%d-%d", w, i, j)
					now := time.Now().UnixMilli()
					starts = append(starts, &fsm.PutStart{NowMs: now, Key: k, SliceLengths: []uint64{1024}, ReplicaNum: 1, ClientID: "c1"})
					ends = append(ends, &fsm.PutEnd{NowMs: now, Key: k, ClientID: "c1"})
				}
				for _, cmds := range [][]fsm.Command{starts, ends} {
					wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					rs, err := nd.ProposeBatch(wctx, cmds)
					cancel()
					if err != nil {
						fail(err)
						continue
					}
					for _, r := range rs {
						if r.Err != nil {
							fail(r.Err)
						}
					}
				}
				puts.Add(batch)
			}
		}()
	}
	// The admitted rate against etcd's over the second half of the run,
	// when the backlog has long been at the soft bound.
	var appliedMid, exportedMid uint64
	midAt := time.Now().Add(run / 2)
	sampling := time.NewTicker(10 * time.Millisecond)
	for time.Now().Before(stopAt) {
		<-sampling.C
		if b := nd.backlog(); b > maxBacklog.Load() {
			maxBacklog.Store(b)
		}
		if appliedMid == 0 && time.Now().After(midAt) {
			appliedMid, exportedMid = nd.sm.appliedSeq.Load(), nd.exportedSeq.Load()
		}
	}
	sampling.Stop()
	half := time.Since(midAt).Seconds()
	applied, exported := nd.sm.appliedSeq.Load(), nd.exportedSeq.Load()
	wg.Wait()

	ps := nd.pacer.stats()
	admittedRate, etcdRate := float64(applied-appliedMid)/half, float64(exported-exportedMid)/half
	t.Logf("%d puts in %v; %d writes paced; backlog max %d (soft bound %d); second half: admitted %.0f/s, etcd took %.0f/s (measured %.0f/s)",
		puts.Load(), run, ps.Paced, maxBacklog.Load(), soft, admittedRate, etcdRate, ps.TakeRate)
	require.Zero(t, failures.Load(), "failed writes; the first: %v", firstErr.Load())
	assert.Positive(t, ps.Paced, "writes outpaced etcd: some must have waited")
	assert.LessOrEqual(t, maxBacklog.Load(), uint64(soft+2*writers*batch), "the backlog past the soft bound and the puts in flight")
	assert.InEpsilon(t, etcdRate, admittedRate, 0.3, "the admitted rate follows etcd's")

	m := scrape(t, nd)
	for _, name := range []string{"moonraft_export_backlog_entries ", "moonraft_export_take_rate ", "moonraft_writes_paced ",
		"moonraft_writes_paced_total ", "moonraft_writes_pace_refused_total ", "moonraft_export_etcd_down 0"} {
		assert.Contains(t, m, name)
	}
	st := nd.Status()
	assert.Positive(t, st.ExportTakeRate, "moonctl status shows etcd's rate")
	assert.Empty(t, st.EtcdError)

	require.NoError(t, proxy.Toxics.RemoveToxic(context.Background(), "slow"))
	checkOpLog(t, direct, waitExported(t, nd, direct, 30*time.Second))
}

// TestOutageRefusalNamesEtcd: at the hard bound with etcd cut off, a write
// is refused with ETCD_OPERATION_ERROR saying etcd has not taken entries,
// for how long and why; once etcd is back, writes go again.
func TestOutageRefusalNamesEtcd(t *testing.T) {
	const ringCap = 20
	e := testEtcd(t)
	proxy := etcdProxy(t, e.Endpoints[0])
	viaProxy := e
	viaProxy.Endpoints = []string{"http://" + proxy.Listen}
	viaProxy.DialTimeout = time.Second
	c := newCluster(t, 3, 50*time.Millisecond, withEtcd(viaProxy), func(c *Config) {
		c.ExportRenewals = false
		c.Params.ExportRingCap = ringCap
		c.ExportSoftEntries = ringCap / 2
	})
	nd := c.nodes[c.leader()]
	mountSegments(t, nd)
	put(t, nd, "before")
	direct, err := etcdbridge.Open(e)
	require.NoError(t, err)
	t.Cleanup(func() { _ = direct.Close() })
	waitExported(t, nd, direct, 10*time.Second)

	proxy.Stop()
	var refusal error
	for i := 0; i < 2*ringCap && refusal == nil; i++ {
		key := fmt.Sprintf("k%d", i)
		now := time.Now().UnixMilli()
		_, refusal = nd.Propose(ctx(t), &fsm.PutStart{NowMs: now, Key: key, SliceLengths: []uint64{1024}, ReplicaNum: 2, ClientID: "c1"})
		if refusal == nil {
			mustPropose(t, nd, &fsm.PutEnd{NowMs: now, Key: key, ClientID: "c1"})
		}
	}
	require.Error(t, refusal)
	assert.Equal(t, errcode.EtcdOperationError, errcode.Of(refusal))
	assert.Contains(t, refusal.Error(), "etcd has not taken OpLog entries for")
	assert.Contains(t, refusal.Error(), "--export-ring")
	assert.True(t, nd.pacer.stats().EtcdDown)
	assert.NotEmpty(t, nd.Status().EtcdError, "moonctl status says why etcd takes nothing")
	assert.Contains(t, scrape(t, nd), "moonraft_export_etcd_down 1")

	require.NoError(t, proxy.Start())
	waitExported(t, nd, direct, 30*time.Second)
	put(t, nd, "after")
	assert.False(t, nd.pacer.stats().EtcdDown)
}
