package jepsen

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	moonclient "github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/internal/child"
	"github.com/moonraft/moonraft/internal/freeport"
	"github.com/moonraft/moonraft/internal/localcluster"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"github.com/rs/zerolog"
)

// buildMoonraft builds bin/moonraft (./cmd/node) into dir, with the build
// tags given (failpoints: the fault tests' failpoints, node/failpoint_on.go).
// JEPSEN_RACE builds it with the race detector: the nodes then report a
// data race in their logs, which fails the run, at several times the CPU
// per request.
func buildMoonraft(dir string, tags ...string) (string, error) {
	bins, err := localcluster.Build(dir, tags, os.Getenv("JEPSEN_RACE") != "", map[string]string{"moonraft": "./cmd/node"})
	return bins["moonraft"], err
}

// proc is one OS process of the run: etcd, a moonraft node or the etcd
// follower. Its stdout and stderr are appended to LogPath across restarts.
type proc struct {
	*child.Proc
	id       string
	grpcAddr string // "" for etcd
	raftAddr string // nodes only
	httpAddr string // nodes only: /metrics, for the soak
}

// link is one toxiproxy proxy with the toxics the nemeses put on it.
type link struct {
	name     string
	srv      *toxiproxy.ApiServer
	upstream string
	listen   string // the port stays the same across heals

	mu     sync.Mutex
	proxy  *toxiproxy.Proxy
	toxics []string
}

func newLink(srv *toxiproxy.ApiServer, name, upstream string) (*link, error) {
	px := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := px.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	return &link{name: name, srv: srv, upstream: upstream, listen: px.Listen, proxy: px}, nil
}

func (l *link) addToxic(name, typ, stream string, attrs string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1.0,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := l.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		return fmt.Errorf("%s: toxic %s: %w", l.name, name, err)
	}
	l.toxics = append(l.toxics, name)
	return nil
}

// cut drops every byte both ways without closing connections: a silent
// partition, as a firewall DROP rule makes.
func (l *link) cut() error {
	if err := l.addToxic("cut-up", "timeout", "upstream", `{"timeout":0}`); err != nil {
		return err
	}
	return l.addToxic("cut-down", "timeout", "downstream", `{"timeout":0}`)
}

// heal replaces the proxy with a fresh one on the same port. Stopping the
// old one resets its connections: a timeout toxic drops bytes from the
// middle of a stream, and a stream resumed after that gap would carry
// garbage rather than model a network that lost packets (TCP would have
// retransmitted them or reset the connection). The toxics are not removed
// one by one: toxiproxy v2.5.0's RemoveToxic can wait forever on a link
// whose connection has just closed.
func (l *link) heal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.toxics) == 0 {
		return nil
	}
	l.proxy.Stop()
	var err error
	for i := 0; i < 50; i++ {
		px := toxiproxy.NewProxy(l.srv, l.name, l.listen, l.upstream)
		if err = px.Start(); err == nil {
			l.proxy, l.toxics = px, nil
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s: restart proxy on %s: %w", l.name, l.listen, err)
}

// stop closes the proxy for good.
func (l *link) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.proxy.Stop()
}

// clusterConfig is what the nodes are started with.
type clusterConfig struct {
	nodes     int
	extraArgs []string
	logLevel  string
	diskMB    int // > 0: each node's data dir on a tmpfs of this size (the disk-full nemesis)
	// direct: no proxies, the nodes dial each other and etcd themselves
	// (the overload test: its herd of clients in this process would
	// starve the proxies, which live here too, and fake a network fault).
	direct bool
}

// cluster is the system under test: an etcd process, n moonraft processes
// and an etcd follower process, with every Raft link (one per direction)
// and every node's etcd traffic going through its own toxiproxy proxy.
type cluster struct {
	outDir  string // tests/out/<run>: logs
	dataDir string // raft and etcd data (temporary)
	bin     string

	etcd     *proc
	etcdURL  string // direct, for the checker and the follower
	nodes    []*proc
	follower *proc

	tox       *toxiproxy.ApiServer
	raftLinks map[[2]int]*link // [from, to]: connections from dials to
	etcdLinks []*link          // node i → etcd

	admin   *moonclient.Client
	store   *etcdbridge.Store // direct view of etcd
	log     func(format string, args ...any)
	mounted []string // tmpfs mounts to undo
}

func startCluster(ctx context.Context, bin, outDir, dataDir string, cfg clusterConfig, logf func(string, ...any)) (*cluster, error) {
	c := &cluster{outDir: outDir, dataDir: dataDir, bin: bin, raftLinks: map[[2]int]*link{}, log: logf}
	// Some toxics log through zerolog's global logger, at trace level.
	zerolog.SetGlobalLevel(zerolog.WarnLevel)
	c.tox = toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())

	// etcd runs as its own process (`moonraft etcd`, the embedded etcd of
	// etcdbridge), so it shares nothing with the test process.
	e, err := localcluster.NewEtcd(bin, filepath.Join(dataDir, "etcd"))
	if err != nil {
		return nil, err
	}
	e.LogPath = filepath.Join(outDir, "etcd.log")
	c.etcd, c.etcdURL = &proc{id: "etcd", Proc: &e.Proc}, e.URL
	clientURL := e.URL
	if err := c.etcd.Start(); err != nil {
		return c, err
	}
	if err := c.openStore(ctx); err != nil {
		return c, err
	}
	etcdHost, err := hostOf(clientURL)
	if err != nil {
		return c, err
	}

	nodes, err := localcluster.Layout(localcluster.Options{Nodes: cfg.nodes, Bin: bin, Dir: dataDir, LogDir: outDir})
	if err != nil {
		return c, err
	}
	for _, n := range nodes {
		c.nodes = append(c.nodes, &proc{Proc: &n.Proc, id: n.ID, grpcAddr: n.GRPCAddr, raftAddr: n.RaftAddr, httpAddr: n.HTTPAddr})
	}
	if cfg.diskMB > 0 {
		if err := c.mountDisks(cfg.diskMB); err != nil {
			return c, err
		}
	}
	for i, p := range c.nodes {
		// The node itself is listed too: hashicorp/raft asks the address
		// provider for its own id on every RPC it sends (to name itself as
		// leader or candidate) and logs a warning per call when the
		// provider does not know it.
		dials := []string{p.id + "=" + p.raftAddr}
		etcdVia := etcdHost
		for j, q := range c.nodes {
			if i == j {
				continue
			}
			if cfg.direct {
				dials = append(dials, q.id+"="+q.raftAddr)
				continue
			}
			l, err := newLink(c.tox, fmt.Sprintf("raft-%s-%s", p.id, q.id), q.raftAddr)
			if err != nil {
				return c, err
			}
			c.raftLinks[[2]int{i, j}] = l
			dials = append(dials, q.id+"="+l.listen)
		}
		if !cfg.direct {
			el, err := newLink(c.tox, "etcd-"+p.id, etcdHost)
			if err != nil {
				return c, err
			}
			c.etcdLinks = append(c.etcdLinks, el)
			etcdVia = el.listen
		}
		level := cfg.logLevel
		if level == "" {
			level = "info"
		}
		p.Args = append(p.Args,
			"--raft-dial", strings.Join(dials, ","),
			"--etcd-endpoints", "http://"+etcdVia,
			"--log-level", level)
		p.Args = append(p.Args, cfg.extraArgs...)
	}
	for _, p := range c.nodes {
		if err := p.Start(); err != nil {
			return c, err
		}
	}
	var eps []string
	for _, p := range c.nodes {
		eps = append(eps, p.grpcAddr)
	}
	if c.admin, err = moonclient.Dial(moonclient.Config{Endpoints: eps, MaxBackoff: 200 * time.Millisecond, ConnectTimeout: time.Second}); err != nil {
		return c, err
	}
	if _, err := c.waitLeader(ctx, 60*time.Second); err != nil {
		return c, err
	}

	// The follower watches etcd directly from seq 1 for the whole run.
	fa, err := freeport.Addr()
	if err != nil {
		return c, err
	}
	c.follower = &proc{id: "follower", grpcAddr: fa, Proc: &child.Proc{Bin: bin, LogPath: filepath.Join(outDir, "follower.log"),
		Args: []string{"--follow-etcd", "--id", "follower", "--grpc-addr", fa, "--etcd-endpoints", clientURL, "--log-level", "info"}}}
	if err := c.follower.Start(); err != nil {
		return c, err
	}
	return c, nil
}

func hostOf(u string) (string, error) {
	pu, err := url.Parse(u)
	if err != nil {
		return "", err
	}
	return pu.Host, nil
}

func (c *cluster) openStore(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		s, err := etcdbridge.Open(etcdbridge.Config{Endpoints: []string{c.etcdURL}, DialTimeout: 2 * time.Second})
		if err == nil {
			c.store = s
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("etcd at %s did not come up: %w", c.etcdURL, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// statuses asks every node for its status, each within d.
func (c *cluster) statuses(d time.Duration) []*moonraftpb.NodeStatus {
	out := make([]*moonraftpb.NodeStatus, len(c.nodes))
	var wg sync.WaitGroup
	for i, p := range c.nodes {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			st, err := c.admin.Status(ctx, p.grpcAddr)
			if err == nil {
				out[i] = st
			}
		})
	}
	wg.Wait()
	return out
}

// leader returns the index of the promoted leader with the highest term
// among the nodes that answer, or -1.
func (c *cluster) leader() int {
	best, term := -1, uint64(0)
	for i, st := range c.statuses(500 * time.Millisecond) {
		if st != nil && st.Role == "leader" && st.Promoted && st.Term >= term {
			best, term = i, st.Term
		}
	}
	return best
}

func (c *cluster) waitLeader(ctx context.Context, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for {
		if l := c.leader(); l >= 0 {
			return l, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("no promoted leader within %v", within)
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// restart starts a node that is down, retrying while it exits at once (it
// refuses to start while it cannot reach etcd, for example). A node still
// up after a few seconds counts as started.
func (c *cluster) restart(i int) error {
	p := c.nodes[i]
	var last error
	for attempt := 0; attempt < 20; attempt++ {
		if err := p.Start(); err != nil {
			last = err
			time.Sleep(500 * time.Millisecond)
			continue
		}
		if !p.Wait(3 * time.Second) {
			return nil
		}
		last = fmt.Errorf("exited right after start")
	}
	return fmt.Errorf("%s would not stay up: %v (see %s)", p.id, last, p.LogPath)
}

// healAll undoes every fault: proxies back with no toxics, paused nodes
// continued, dead nodes restarted.
func (c *cluster) healAll() error {
	var errs []string
	if err := c.healDisks(); err != nil {
		errs = append(errs, err.Error())
	}
	for _, l := range c.allLinks() {
		if err := l.heal(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	for i, p := range c.nodes {
		p.Signal(syscall.SIGCONT)
		if !p.Running() {
			if err := c.restart(i); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("heal: %s", strings.Join(errs, "; "))
	}
	return nil
}

func (c *cluster) allLinks() []*link {
	return append(c.raftLinksList(), c.etcdLinks...)
}

// close stops every process and proxy.
func (c *cluster) close() {
	var ps []*child.Proc
	for _, p := range append(append([]*proc{}, c.nodes...), c.follower) {
		if p != nil {
			ps = append(ps, p.Proc)
		}
	}
	child.StopAll(10*time.Second, ps...)
	if c.admin != nil {
		_ = c.admin.Close()
	}
	if c.store != nil {
		_ = c.store.Close()
	}
	if c.etcd != nil {
		c.etcd.Stop(10 * time.Second)
	}
	for _, l := range c.allLinks() {
		l.stop()
	}
	c.unmountDisks()
}
