package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/localcluster"
	dto "github.com/prometheus/client_model/go"
)

// system is what a sweep runs against: moonraft, or the baseline.
type system interface {
	name() string
	client() *client.Client
	// positions reports the leader's progress and each standby's, in the
	// same unit (applied index, or OpLog seq), for replication lag.
	positions(ctx context.Context) (leader uint64, standbys []uint64, err error)
	// exportBacklog is how many OpLog entries the leader has not yet
	// written to etcd (0 for a system that writes before it answers).
	exportBacklog(ctx context.Context) (uint64, error)
	// etcd is this system's etcd load so far (zero when unknown).
	etcd(ctx context.Context) etcdLoad
	// serverProcs are the system's processes, the one serving clients
	// first, when this run started them (none otherwise).
	serverProcs(ctx context.Context) ([]*child.Proc, error)
	close()
}

// etcdLoad is cumulative etcd load: committed proposals (one per write
// transaction or lease grant) and bytes received from clients.
type etcdLoad struct {
	txns, bytes float64
	known       bool
}

// remoteCluster is a running cluster given by --endpoints.
type remoteCluster struct {
	cl        *client.Client
	endpoints []string
}

func (r *remoteCluster) name() string                  { return "moonraft" }
func (r *remoteCluster) client() *client.Client        { return r.cl }
func (r *remoteCluster) etcd(context.Context) etcdLoad { return etcdLoad{} }
func (r *remoteCluster) close()                        { r.cl.Close() }

func (r *remoteCluster) serverProcs(context.Context) ([]*child.Proc, error) { return nil, nil }

func (r *remoteCluster) positions(ctx context.Context) (uint64, []uint64, error) {
	return statusPositions(ctx, r.cl, r.endpoints)
}

func (r *remoteCluster) exportBacklog(ctx context.Context) (uint64, error) {
	return statusBacklog(ctx, r.cl, r.endpoints)
}

// statusBacklog is the promoted leader's applied OpLog seq minus the seq
// it has written to etcd.
func statusBacklog(ctx context.Context, cl *client.Client, endpoints []string) (uint64, error) {
	for _, ep := range endpoints {
		st, err := cl.Progress(ctx, ep)
		if err == nil && st.Role == "leader" && st.Promoted {
			if !st.EtcdExport {
				return 0, nil
			}
			return st.AppliedSeq - min(st.ExportedSeq, st.AppliedSeq), nil
		}
	}
	return 0, errors.New("no promoted leader")
}

// statusPositions reads every node's applied index: the promoted leader's
// and the others'.
func statusPositions(ctx context.Context, cl *client.Client, endpoints []string) (uint64, []uint64, error) {
	var leader uint64
	var standbys []uint64
	found := false
	for _, ep := range endpoints {
		st, err := cl.Progress(ctx, ep)
		if err != nil {
			return 0, nil, err
		}
		if st.Role == "leader" && st.Promoted {
			leader, found = st.AppliedIndex, true
		} else {
			standbys = append(standbys, st.AppliedIndex)
		}
	}
	if !found {
		return 0, nil, errors.New("no promoted leader")
	}
	return leader, standbys, nil
}

// openMoonraft opens the cluster to measure; with --local it starts one
// whose nodes run as v says.
func openMoonraft(ctx context.Context, cfg config, v variant) (system, error) {
	if !cfg.local {
		cl, err := client.Dial(client.Config{Endpoints: cfg.endpoints})
		if err != nil {
			return nil, err
		}
		return &remoteCluster{cl: cl, endpoints: cfg.endpoints}, nil
	}
	return startLocal(ctx, cfg, v)
}

// localCluster is --local: an embedded etcd and three moonraft processes.
type localCluster struct {
	dir   string
	v     variant
	etcdP *etcdProc
	procs []*localcluster.Node
	cl    *client.Client
}

func startLocal(ctx context.Context, cfg config, v variant) (*localCluster, error) {
	if _, err := os.Stat(cfg.moonraftBin); err != nil {
		return nil, fmt.Errorf("--local needs the moonraft binary (%v): run make build, or pass --moonraft-bin", err)
	}
	dir, err := os.MkdirTemp("", "moonbench-")
	if err != nil {
		return nil, err
	}
	lc := &localCluster{dir: dir, v: v}
	progressf("starting embedded etcd and three moonraft nodes (%s) in %s", lc.name(), dir)
	if lc.etcdP, err = startEtcd(ctx, cfg, dir); err != nil {
		lc.close()
		return nil, err
	}
	if lc.procs, err = localcluster.Layout(localcluster.Options{Nodes: 3, Bin: cfg.moonraftBin, Dir: dir, Mooncake: v.mooncake}); err != nil {
		lc.close()
		return nil, err
	}
	for _, p := range lc.procs {
		// The default Raft timeouts and read mode: what users run.
		p.Args = append(p.Args, "--etcd-endpoints", strings.Join(lc.etcdP.endpoints(), ","), "--log-level", "warn")
		if v.readMode != "" {
			p.Args = append(p.Args, "--read-mode", v.readMode)
		}
		if v.logStore != "" {
			p.Args = append(p.Args, "--raft-log-store", v.logStore)
		}
		if cfg.profileDir != "" {
			p.Args = append(p.Args, "--pprof")
		}
		p.Args = append(p.Args, cfg.nodeFlags...)
		if cfg.verbose {
			p.Output = os.Stderr
		}
		if err := p.Start(); err != nil {
			lc.close()
			return nil, err
		}
	}
	if lc.cl, err = client.Dial(client.Config{Endpoints: localcluster.Endpoints(lc.procs), MaxBackoff: 100 * time.Millisecond}); err != nil {
		lc.close()
		return nil, err
	}
	if _, err := lc.leader(ctx); err != nil {
		lc.close()
		return nil, err
	}
	return lc, nil
}

// leader waits for a promoted leader.
func (lc *localCluster) leader(ctx context.Context) (*localcluster.Node, error) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range lc.procs {
			sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			st, err := lc.cl.Progress(sctx, p.GRPCAddr)
			cancel()
			if err == nil && st.Role == "leader" && st.Promoted {
				return p, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil, errors.New("no leader within 30 s")
}

// caughtUp waits until p has applied what the leader had applied when
// asked.
func (lc *localCluster) caughtUp(ctx context.Context, p *localcluster.Node) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	l, err := lc.leader(ctx)
	if err != nil {
		return err
	}
	target, err := lc.cl.Progress(ctx, l.GRPCAddr)
	if err != nil {
		return err
	}
	for {
		if st, err := lc.cl.Progress(ctx, p.GRPCAddr); err == nil && st.AppliedIndex >= target.AppliedIndex {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not catch up with the leader's index %d: %w", p.ID, target.AppliedIndex, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// name is "moonraft", followed by a read mode other than the default and
// a log store asked for.
func (lc *localCluster) name() string {
	n := "moonraft"
	if lc.v.readMode != "" && lc.v.readMode != "lease" {
		n += "-" + lc.v.readMode
	}
	if lc.v.logStore != "" {
		n += "-" + lc.v.logStore
	}
	return n
}

func (lc *localCluster) client() *client.Client { return lc.cl }
func (lc *localCluster) etcd(ctx context.Context) etcdLoad {
	l, _ := lc.etcdP.load(ctx)
	return l
}

func (lc *localCluster) serverProcs(ctx context.Context) ([]*child.Proc, error) {
	l, err := lc.leader(ctx)
	if err != nil {
		return nil, err
	}
	ps := []*child.Proc{&l.Proc}
	for _, p := range lc.procs {
		if p != l {
			ps = append(ps, &p.Proc)
		}
	}
	return ps, nil
}

func (lc *localCluster) positions(ctx context.Context) (uint64, []uint64, error) {
	return statusPositions(ctx, lc.cl, lc.endpoints())
}

func (lc *localCluster) exportBacklog(ctx context.Context) (uint64, error) {
	return statusBacklog(ctx, lc.cl, lc.endpoints())
}

func (lc *localCluster) endpoints() []string { return localcluster.Endpoints(lc.procs) }

func (lc *localCluster) close() {
	if lc.cl != nil {
		lc.cl.Close()
	}
	localcluster.StopAll(lc.procs)
	if lc.etcdP != nil {
		lc.etcdP.close()
	}
	os.RemoveAll(lc.dir)
}

// mountFor gives the benchmark's client room: a few large segments.
func mountFor(ctx context.Context, cl *client.Client, clientID string) ([]fsm.SegmentSpec, error) {
	var segs []fsm.SegmentSpec
	for i := 0; i < 4; i++ {
		s := fsm.SegmentSpec{ID: fmt.Sprintf("%s-s%d", clientID, i), Name: fmt.Sprintf("%s-host%d", clientID, i), Base: uint64(i) << 44, Size: 1 << 42}
		if err := cl.MountSegment(ctx, clientID, s); err != nil {
			return nil, err
		}
		segs = append(segs, s)
	}
	return segs, nil
}

// profileNodes saves a CPU profile of every node for d: the leader's into
// prefix-leader.pprof, the followers' into prefix-follower-ID.pprof, and
// moonbench's own (the clients and the embedded etcd, which share the
// machine's cores with the nodes) into prefix-moonbench.pprof.
func (lc *localCluster) profileNodes(ctx context.Context, d time.Duration, prefix string) error {
	l, err := lc.leader(ctx)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(lc.procs)+1)
	for i, p := range lc.procs {
		path := prefix + "-follower-" + p.ID + ".pprof"
		if p == l {
			path = prefix + "-leader.pprof"
		}
		wg.Go(func() { errs[i] = profileNode(ctx, p, d, path) })
	}
	wg.Go(func() { errs[len(lc.procs)] = profileSelf(ctx, d, prefix+"-moonbench.pprof") })
	wg.Wait()
	return errors.Join(errs...)
}

// profileSelf saves a CPU profile of moonbench for d.
func profileSelf(ctx context.Context, d time.Duration, path string) error {
	return recordSelf(ctx, d, path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// traceSelf saves an execution trace of moonbench for d.
func traceSelf(ctx context.Context, d time.Duration, path string) error {
	return recordSelf(ctx, d, path, trace.Start, trace.Stop)
}

// recordSelf starts a recording into a new file at path and stops it after
// d, or when ctx ends.
func recordSelf(ctx context.Context, d time.Duration, path string, start func(io.Writer) error, stop func()) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := start(f); err != nil {
		f.Close()
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	stop()
	return f.Close()
}

func profileNode(ctx context.Context, p *localcluster.Node, d time.Duration, path string) error {
	return savePprof(ctx, p, fmt.Sprintf("profile?seconds=%d", int(d.Seconds())), path)
}

// savePprof saves p's /debug/pprof/<which> into path.
func savePprof(ctx context.Context, p *localcluster.Node, which, path string) error {
	url := fmt.Sprintf("http://%s/debug/pprof/%s", p.HTTPAddr, which)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile from %s: %s", p.ID, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// slowLogThreshold is the bucket bound of moonraft_raft_log_append_seconds
// above which moonbench counts a log write as slow: at this size it is a
// stalled disk, and with it every standby falls behind (a follower applies
// an entry only after its next log write).
const slowLogThreshold = 0.064

// slowLogWrites is the number of Raft log writes over slowLogThreshold on
// all nodes so far.
func (lc *localCluster) slowLogWrites(ctx context.Context) (int64, error) {
	var n int64
	for _, p := range lc.procs {
		families, err := scrapeMetrics(ctx, http.DefaultClient, "http://"+p.HTTPAddr)
		if err != nil {
			return 0, err
		}
		mf, ok := families["moonraft_raft_log_append_seconds"]
		if !ok || len(mf.GetMetric()) != 1 {
			return 0, fmt.Errorf("%s: no moonraft_raft_log_append_seconds", p.ID)
		}
		h := mf.GetMetric()[0].GetHistogram()
		i := slices.IndexFunc(h.GetBucket(), func(b *dto.Bucket) bool { return math.Abs(b.GetUpperBound()-slowLogThreshold) < 1e-9 })
		if i < 0 {
			return 0, fmt.Errorf("%s: moonraft_raft_log_append_seconds has no bucket %g", p.ID, slowLogThreshold)
		}
		n += int64(h.GetSampleCount() - h.GetBucket()[i].GetCumulativeCount())
	}
	return n, nil
}
