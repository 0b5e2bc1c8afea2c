package raftnet

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/moonraft/moonraft/errcode"
)

// handshakeTimeout bounds the TLS handshake of an inbound Raft connection,
// so a peer that connects and says nothing cannot hold a goroutine.
const handshakeTimeout = 10 * time.Second

// TLSStreamLayer is a raft.StreamLayer over TLS: it listens with the
// server configuration (mutual TLS when it has a CA) and dials peers with
// the client configuration. Use it with raft.NewNetworkTransportWithConfig.
type TLSStreamLayer struct {
	net.Listener
	client *tls.Config
}

var _ raft.StreamLayer = (*TLSStreamLayer)(nil)

// NewTLSStreamLayer listens on bind (host:port, also the address peers
// are told to dial, so it must not be a wildcard address).
func NewTLSStreamLayer(bind string, server, client *tls.Config) (*TLSStreamLayer, error) {
	l, err := listenAdvertisable(bind)
	if err != nil {
		return nil, err
	}
	return &TLSStreamLayer{Listener: tls.NewListener(l, server), client: client}, nil
}

func listenAdvertisable(bind string) (net.Listener, error) {
	l, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	if a, ok := l.Addr().(*net.TCPAddr); !ok || a.IP == nil || a.IP.IsUnspecified() {
		l.Close()
		return nil, errcode.New(errcode.InvalidParams, "raft address %s cannot be advertised to peers: give a specific IP", bind)
	}
	return l, nil
}

// TCPStreamLayer is a raft.StreamLayer over plain TCP, as raft's own; a
// node wraps it (or the TLS one) to be able to cut its outgoing traffic.
type TCPStreamLayer struct{ net.Listener }

var _ raft.StreamLayer = (*TCPStreamLayer)(nil)

// NewTCPStreamLayer listens on bind, which must not be a wildcard address.
func NewTCPStreamLayer(bind string) (*TCPStreamLayer, error) {
	l, err := listenAdvertisable(bind)
	if err != nil {
		return nil, err
	}
	return &TCPStreamLayer{Listener: l}, nil
}

// Dial connects to a peer within timeout.
func (s *TCPStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(address), timeout)
}

// Accept returns the next inbound connection; its handshake runs on first
// use, within handshakeTimeout.
func (s *TLSStreamLayer) Accept() (net.Conn, error) {
	c, err := s.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &handshakeConn{Conn: c.(*tls.Conn)}, nil
}

// Dial connects to a peer and completes the TLS handshake within timeout.
func (s *TLSStreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: s.client}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, "tcp", string(address))
}

// handshakeConn runs the server handshake once, under a deadline, before
// the first read or write.
type handshakeConn struct {
	*tls.Conn
	once sync.Once
	err  error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		defer cancel()
		c.err = c.Conn.HandshakeContext(ctx)
		if c.err != nil {
			_ = c.Conn.Close()
		}
	})
	return c.err
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
