package transport

import (
	"crypto/tls"
	"crypto/x509"
	"os"

	"github.com/moonraft/moonraft/errcode"
)

// TLSFiles names the PEM files of one end of a TLS link: moonraft's
// --tls-cert, --tls-key, --tls-ca and --tls-server-name. The same files
// serve both directions of a node (its certificate must then carry both
// the server and the client extended key usage).
type TLSFiles struct {
	Cert string // this end's certificate (chain)
	Key  string // its private key
	// CA is the bundle that signs the other end's certificates. On a
	// server it turns on mutual TLS: a client must present a certificate
	// signed by it. On a client it replaces the system roots.
	CA string
	// ServerName, on a client, is the name checked against the server's
	// certificate instead of the host dialled (for proxies, NAT, or one
	// shared name such as "moonraft" on every node).
	ServerName string
}

// Enabled reports whether any file is given, i.e. the link uses TLS.
func (t TLSFiles) Enabled() bool { return t.Cert != "" || t.Key != "" || t.CA != "" }

func (t TLSFiles) pair() ([]tls.Certificate, error) {
	if t.Cert == "" && t.Key == "" {
		return nil, nil
	}
	if t.Cert == "" || t.Key == "" {
		return nil, errcode.New(errcode.InvalidParams, "TLS needs both a certificate and a key (got cert %q, key %q)", t.Cert, t.Key)
	}
	p, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, errcode.New(errcode.InvalidParams, "TLS certificate %s / key %s: %v", t.Cert, t.Key, err)
	}
	return []tls.Certificate{p}, nil
}

func (t TLSFiles) pool() (*x509.CertPool, error) {
	if t.CA == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(t.CA)
	if err != nil {
		return nil, errcode.New(errcode.FileNotFound, "TLS CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errcode.New(errcode.InvalidParams, "TLS CA %s holds no PEM certificate", t.CA)
	}
	return pool, nil
}

// ServerConfig is the TLS configuration of a server: its certificate, and
// with a CA, client certificates required and verified against it.
func (t TLSFiles) ServerConfig() (*tls.Config, error) {
	certs, err := t.pair()
	if err != nil {
		return nil, err
	}
	if certs == nil {
		return nil, errcode.New(errcode.InvalidParams, "a TLS server needs --tls-cert and --tls-key")
	}
	pool, err := t.pool()
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: certs}
	if pool != nil {
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// ClientConfig is the TLS configuration of a client: the CA to verify
// servers with (system roots without one), and its own certificate when
// given (required by servers with a CA).
func (t TLSFiles) ClientConfig() (*tls.Config, error) {
	certs, err := t.pair()
	if err != nil {
		return nil, err
	}
	pool, err := t.pool()
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: certs, RootCAs: pool, ServerName: t.ServerName}, nil
}
