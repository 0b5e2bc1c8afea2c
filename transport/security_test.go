package transport

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/client"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/raftnet"
	"github.com/moonraft/moonraft/transport/certgen"
	moonraftpb "github.com/moonraft/moonraft/transport/proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// pki is a CA with a server and a client certificate, plus the bad
// certificates a server must refuse: one from another CA and an expired one.
type pki struct {
	dir                          string
	ca                           string
	server, client, other, stale TLSFiles // stale: expired
}

func newPKI(t testing.TB) *pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := certgen.NewCA("moonraft test CA")
	require.NoError(t, err)
	other, err := certgen.NewCA("another CA")
	require.NoError(t, err)
	p := &pki{dir: dir}
	p.ca, err = ca.WriteCA(dir, false)
	require.NoError(t, err)
	otherCA, err := other.WriteCA(t.TempDir(), false)
	require.NoError(t, err)

	write := func(pair *certgen.Pair, err error) func(name, caFile string) TLSFiles {
		require.NoError(t, err)
		return func(name, caFile string) TLSFiles {
			cert, key, err := pair.Write(dir, name)
			require.NoError(t, err)
			return TLSFiles{Cert: cert, Key: key, CA: caFile}
		}
	}
	p.server = write(ca.Node("node"))("node", p.ca)
	p.client = write(ca.Client("client"))("client", p.ca)
	p.other = write(other.Client("intruder"))("other", otherCA)
	p.other.CA = p.ca // it trusts the server; the server must not trust it
	now := time.Now()
	p.stale = write(ca.Issue(certgen.Options{CommonName: "old-client", Client: true,
		NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-24 * time.Hour)}))("stale", p.ca)
	return p
}

// startNodeWith serves a fresh testBackend with cfg and opts.
func startNodeWith(t *testing.T, cfg ServerConfig, opts ...grpc.ServerOption) (*testBackend, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lis := &trackingListener{Listener: l}
	b := &testBackend{lis: lis, f: fsm.New()}
	cfg.Admin = b
	srv := NewServer(b, cfg, opts...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return b, l.Addr().String()
}

func tlsClient(t *testing.T, files TLSFiles, addr string) *client.Client {
	t.Helper()
	tc, err := files.ClientConfig()
	require.NoError(t, err)
	c, err := client.Dial(client.Config{Endpoints: []string{addr}, TLS: tc, MaxBackoff: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestGRPCMutualTLS: with a CA configured, the server serves a client
// holding a certificate of that CA, and refuses one without a certificate,
// one with a certificate of another CA, one with an expired certificate,
// and a plaintext one. None of the refused calls reaches the backend.
func TestGRPCMutualTLS(t *testing.T) {
	p := newPKI(t)
	sc, err := p.server.ServerConfig()
	require.NoError(t, err)
	require.Equal(t, tls.RequireAndVerifyClientCert, sc.ClientAuth)
	b, addr := startNodeWith(t, ServerConfig{}, grpc.Creds(credentials.NewTLS(sc)))

	_, err = tlsClient(t, p.client, addr).Ping(ctxT(t, 5*time.Second), "c1")
	require.NoError(t, err, "a client with a certificate of the CA is served")
	require.EqualValues(t, 1, b.pings.Load())

	refused := map[string]*client.Client{
		"no certificate":      tlsClient(t, TLSFiles{CA: p.ca}, addr),
		"another CA":          tlsClient(t, p.other, addr),
		"expired certificate": tlsClient(t, p.stale, addr),
		"plaintext":           dialT(t, addr),
	}
	for name, c := range refused {
		t.Run(name, func(t *testing.T) {
			_, err := c.Ping(ctxT(t, 1500*time.Millisecond), "c1")
			require.Error(t, err)
			assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(err), "%v", err)
			assert.Contains(t, err.Error(), "cannot reach", "refused before the request was sent: %v", err)
			t.Log(err)
		})
	}
	assert.EqualValues(t, 1, b.pings.Load(), "no refused call reached the backend")

	// The client side checks the server too: a server certificate of a CA
	// the client does not trust is refused.
	_, err = tlsClient(t, TLSFiles{Cert: p.other.Cert, Key: p.other.Key, CA: p.other.Cert}, addr).Ping(ctxT(t, time.Second), "c1")
	require.Error(t, err)
}

// TestTLSFilesErrors: half a key pair, a missing CA or a CA file without a
// certificate are clear configuration errors.
func TestTLSFilesErrors(t *testing.T) {
	p := newPKI(t)
	for name, f := range map[string]TLSFiles{
		"cert without key": {Cert: p.client.Cert},
		"missing CA":       {Cert: p.client.Cert, Key: p.client.Key, CA: p.dir + "/nope.pem"},
		"CA not PEM":       {Cert: p.client.Cert, Key: p.client.Key, CA: p.client.Key},
	} {
		_, err := f.ClientConfig()
		assert.Error(t, err, name)
	}
	_, err := TLSFiles{CA: p.ca}.ServerConfig()
	assert.Error(t, err, "a server needs a certificate")
	sc, err := TLSFiles{Cert: p.server.Cert, Key: p.server.Key}.ServerConfig()
	require.NoError(t, err)
	assert.Equal(t, tls.NoClientCert, sc.ClientAuth, "without a CA the server does not ask for client certificates")
}

// echoLayer serves a TLS stream layer that echoes one byte per connection,
// recording the server side's errors.
func echoLayer(t *testing.T, p *pki) (*raftnet.TLSStreamLayer, *[]error, *sync.Mutex) {
	t.Helper()
	sc, err := p.server.ServerConfig()
	require.NoError(t, err)
	cc, err := p.server.ClientConfig()
	require.NoError(t, err)
	layer, err := raftnet.NewTLSStreamLayer("127.0.0.1:0", sc, cc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = layer.Close() })
	var (
		mu   sync.Mutex
		errs []error
	)
	go func() {
		for {
			conn, err := layer.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 1)
				if _, err := io.ReadFull(conn, buf); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				_, _ = conn.Write(buf)
			}()
		}
	}()
	return layer, &errs, &mu
}

// roundTrip sends one byte over a connection of dialer to layer and reads
// the echo.
func roundTrip(dialer *raftnet.TLSStreamLayer, addr net.Addr) error {
	conn, err := dialer.Dial(raft.ServerAddress(addr.String()), 2*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte{42}); err != nil {
		return err
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(conn, buf); err != nil {
		return err
	}
	if buf[0] != 42 {
		return io.ErrUnexpectedEOF
	}
	return nil
}

// TestRaftStreamLayerMutualTLS: the Raft TLS listener talks to a peer with
// a certificate of the CA and refuses the handshake of one without a
// certificate, with one of another CA, or with an expired one.
func TestRaftStreamLayerMutualTLS(t *testing.T) {
	p := newPKI(t)
	layer, serverErrs, mu := echoLayer(t, p)
	sc, err := p.server.ServerConfig()
	require.NoError(t, err)
	peer := func(files TLSFiles) *raftnet.TLSStreamLayer {
		cc, err := files.ClientConfig()
		require.NoError(t, err)
		l, err := raftnet.NewTLSStreamLayer("127.0.0.1:0", sc, cc)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	require.NoError(t, roundTrip(peer(p.server), layer.Addr()), "a peer with a node certificate of the CA")

	for name, files := range map[string]TLSFiles{
		"no certificate":      {CA: p.ca},
		"another CA":          p.other,
		"expired certificate": p.stale,
	} {
		t.Run(name, func(t *testing.T) {
			err := roundTrip(peer(files), layer.Addr())
			require.Error(t, err)
			assert.Contains(t, err.Error(), "tls", "the handshake is refused: %v", err)
		})
	}
	// Plaintext on the Raft port: no TLS handshake, no Raft.
	conn, err := net.DialTimeout("tcp", layer.Addr().String(), time.Second)
	require.NoError(t, err)
	_, _ = conn.Write([]byte("plaintext raft\n"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(conn)
	conn.Close()
	require.NotErrorIs(t, err, io.EOF)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(*serverErrs) >= 4
	}, 5*time.Second, 10*time.Millisecond, "the server side saw every refused handshake")
	mu.Lock()
	defer mu.Unlock()
	for _, e := range *serverErrs {
		assert.True(t, strings.Contains(e.Error(), "tls") || strings.Contains(e.Error(), "certificate"), "%v", e)
	}
}

func TestRaftStreamLayerNotAdvertisable(t *testing.T) {
	p := newPKI(t)
	sc, err := p.server.ServerConfig()
	require.NoError(t, err)
	_, err = raftnet.NewTLSStreamLayer("0.0.0.0:0", sc, sc)
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
}

// TestAdminToken: with a token configured, admin RPCs without it or with a
// wrong one are refused with PERMISSION_DENIED and never reach the backend;
// with it they are served; data RPCs need no token.
func TestAdminToken(t *testing.T) {
	b, addr := startNodeWith(t, ServerConfig{AdminToken: "s3cret"})
	ctx := ctxT(t, 10*time.Second)
	b.apply(t, &fsm.MountSegment{NowMs: b.Now(), ClientID: "c1", Segment: seg("s1", 0)})

	anon := dialT(t, addr)
	_, err := anon.Members(ctx)
	requireCode(t, errcode.PermissionDenied, err)
	assert.Contains(t, err.Error(), "admin token")
	_, err = anon.RemoveAll(ctx, true)
	requireCode(t, errcode.PermissionDenied, err)
	requireCode(t, errcode.PermissionDenied, anon.TransferLeadership(ctx, ""))
	requireCode(t, errcode.PermissionDenied, anon.AddVoter(ctx, "n9", "127.0.0.1:1", ""))
	requireCode(t, errcode.PermissionDenied, anon.RemoveServer(ctx, "n9"))
	requireCode(t, errcode.PermissionDenied, anon.SnapshotSave(ctx, io.Discard))
	assert.Zero(t, b.proposes.Load(), "no refused admin call reached the backend")

	// Data RPCs need no token.
	_, err = anon.PutStart(ctx, "k", []uint64{10}, client.ReplicateConfig{ReplicaNum: 1}, "c1")
	require.NoError(t, err)
	require.NoError(t, anon.PutEnd(ctx, "k", "c1"))
	_, _, err = anon.GetReplicaList(ctx, "k")
	require.NoError(t, err)
	_, err = anon.Status(ctx, addr)
	require.NoError(t, err, "Status is not an admin RPC")

	wrong, err := client.Dial(client.Config{Endpoints: []string{addr}, AdminToken: "guess"})
	require.NoError(t, err)
	defer wrong.Close()
	_, err = wrong.Members(ctx)
	requireCode(t, errcode.PermissionDenied, err)
	assert.Contains(t, err.Error(), "wrong")

	admin, err := client.Dial(client.Config{Endpoints: []string{addr}, AdminToken: "s3cret"})
	require.NoError(t, err)
	defer admin.Close()
	ms, err := admin.Members(ctx)
	require.NoError(t, err)
	assert.Len(t, ms, 1)
	require.NoError(t, admin.SnapshotSave(ctx, io.Discard))
	n, err := admin.RemoveAll(ctx, true)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)

	// Without a token configured, admin RPCs are open.
	_, open := startNode(t)
	_, err = dialT(t, open).Members(ctx)
	require.NoError(t, err)
}

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := dir + "/" + name
		require.NoError(t, os.WriteFile(p, []byte(s), 0o600))
		return p
	}
	tok, err := ReadTokenFile(write("ok", "  abc\n"))
	require.NoError(t, err)
	assert.Equal(t, "abc", tok)
	_, err = ReadTokenFile(write("empty", " \n"))
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
	_, err = ReadTokenFile(write("two", "a\nb\n"))
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
	_, err = ReadTokenFile(dir + "/missing")
	assert.Equal(t, errcode.FileNotFound, errcode.Of(err))
}

// TestServerMessageLimit: a request over the server's message limit (but
// within the client's) is refused by the server before it is decoded, and
// the client reports INVALID_PARAMS naming the limit, for a write too (it
// was certainly not applied).
func TestServerMessageLimit(t *testing.T) {
	b, addr := startNodeWith(t, ServerConfig{Limits: Limits{MaxMessageBytes: moonraftpb.MinMessageBytes}})
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)
	items := make([]client.PutStartItem, 2500) // about 2.5 MB: over the server's 2 MiB, within the client's 16 MiB
	for i := range items {
		items[i] = client.PutStartItem{Key: fmt.Sprintf("%04d-%s", i, strings.Repeat("k", 1000)), SliceLengths: []uint64{1}, Config: client.ReplicateConfig{ReplicaNum: 1}, ClientID: "c1"}
	}
	_, err := c.BatchPutStart(ctx, items)
	requireCode(t, errcode.InvalidParams, err)
	assert.Contains(t, err.Error(), "message size limit")
	assert.Contains(t, err.Error(), "not applied")
	keys := make([]string, 3000)
	for i := range keys {
		keys[i] = strings.Repeat("x", 1000)
	}
	_, err = c.BatchExistKey(ctx, keys)
	requireCode(t, errcode.InvalidParams, err)
	assert.Zero(t, b.proposes.Load())

	// A client with a smaller cap refuses before sending.
	small, err := client.Dial(client.Config{Endpoints: []string{addr}, MaxMessageBytes: moonraftpb.MinMessageBytes})
	require.NoError(t, err)
	defer small.Close()
	_, err = small.BatchPutStart(ctx, items)
	requireCode(t, errcode.InvalidParams, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("%d-byte message limit", moonraftpb.MinMessageBytes))
	_, err = client.Dial(client.Config{Endpoints: []string{addr}, MaxMessageBytes: 1 << 10})
	requireCode(t, errcode.InvalidParams, err)
}

// TestConfiguredLimits: a batch over the configured maximum and a regex
// over the configured length are INVALID_PARAMS, before the backend.
func TestConfiguredLimits(t *testing.T) {
	b, addr := startNodeWith(t, ServerConfig{Limits: Limits{MaxBatch: 10, MaxRegexLen: 8}})
	c := dialT(t, addr)
	ctx := ctxT(t, 10*time.Second)
	keys := make([]string, 11)
	for i := range keys {
		keys[i] = "k"
	}
	_, err := c.BatchPutEnd(ctx, "c1", keys)
	requireCode(t, errcode.InvalidParams, err)
	assert.Contains(t, err.Error(), "batch of 11 items, the limit is 10")
	_, err = c.BatchGetReplicaList(ctx, keys)
	requireCode(t, errcode.InvalidParams, err)
	_, err = c.BatchExistKey(ctx, keys[:10])
	require.NoError(t, err, "a batch at the limit is served")

	_, err = c.GetReplicaListByRegex(ctx, "^abcdefgh.*")
	requireCode(t, errcode.InvalidParams, err)
	assert.Contains(t, err.Error(), "the limit is 8")
	_, err = c.RemoveByRegex(ctx, "^abcdefgh.*", true)
	requireCode(t, errcode.InvalidParams, err)
	_, err = c.GetReplicaListByRegex(ctx, "^a.*")
	require.NoError(t, err)
	assert.Zero(t, b.proposes.Load())

	for _, bad := range []Limits{{MaxMessageBytes: 100}, {MaxBatch: -1}, {MaxRegexLen: fsm.MaxRegexLen + 1}} {
		assert.Equal(t, errcode.InvalidParams, errcode.Of(bad.Validate()), "%+v", bad)
	}
	require.NoError(t, Limits{}.Validate())
}

// blockingBackend holds every Ping until released.
type blockingBackend struct {
	*testBackend
	entered chan struct{}
	release chan struct{}
}

func (b *blockingBackend) Ping(ctx context.Context, id string) (bool, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.testBackend.Ping(ctx, id)
}

// TestInFlightCap: a client past its in-flight cap gets TOO_MANY_REQUESTS
// (the request is not applied); other clients are not affected, and the
// client is served again once its calls finish.
func TestInFlightCap(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	lis := &trackingListener{Listener: l}
	b := &blockingBackend{testBackend: &testBackend{lis: lis, f: fsm.New()}, entered: make(chan struct{}, 8), release: make(chan struct{})}
	srv := NewServer(b, ServerConfig{Admin: b, Limits: Limits{MaxInFlightPerClient: 2}})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	addr := l.Addr().String()
	c := dialT(t, addr)

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			_, err := c.Ping(ctxT(t, 10*time.Second), "busy")
			assert.NoError(t, err)
		})
	}
	<-b.entered
	<-b.entered
	// The raw answer, without the client's retries.
	raw, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer raw.Close()
	_, err = moonraftpb.NewMasterClient(raw).Ping(ctxT(t, 5*time.Second), &moonraftpb.PingRequest{ClientId: "busy"})
	st := moonraftpb.DetailStatus(err)
	require.NotNil(t, st, "%v", err)
	assert.Equal(t, int32(errcode.TooManyRequests), st.GetCode())
	assert.True(t, st.GetRetryable())
	assert.Contains(t, st.GetMessage(), "client busy has 2 requests in flight on this node, the limit is 2")

	// The Go client retries it with backoff within its deadline.
	_, err = c.Ping(ctxT(t, time.Second), "busy") // long enough for a loaded machine to get a turn
	requireCode(t, errcode.TooManyRequests, err)

	// Another client is not held back.
	done := make(chan error, 1)
	go func() {
		_, err := c.Ping(ctxT(t, 5*time.Second), "other")
		done <- err
	}()
	<-b.entered
	close(b.release)
	require.NoError(t, <-done)
	wg.Wait()
	_, err = c.Ping(ctxT(t, 5*time.Second), "busy")
	require.NoError(t, err, "served again once its calls finished")
}
