// Package certgen makes X.509 certificates with Go's crypto library: a CA,
// and node and client certificates signed by it. It backs `make certs`
// (scripts/gencerts) and the TLS tests; production deployments bring their
// own PKI (Vault, cfssl, an enterprise CA) and only give moonraft the files.
package certgen

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that can issue certificates.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// Pair is one issued certificate and its private key, PEM-encoded.
type Pair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// Options describe a certificate to issue.
type Options struct {
	CommonName string
	DNSNames   []string
	IPs        []net.IP
	// Server and Client set the extended key usages. A moonraft node needs
	// both: it serves gRPC and Raft and dials its peers' Raft ports.
	Server, Client bool
	// NotBefore and NotAfter bound validity; zero values mean one hour ago
	// and one year from now. A NotAfter in the past makes an expired
	// certificate (for tests).
	NotBefore, NotAfter time.Time
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// NewCA makes a self-signed CA valid for ten years (ECDSA P-256).
func NewCA(name string) (*CA, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"moonraft"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kp, err := keyPEM(k)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: k, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: kp}, nil
}

// Issue signs a new certificate described by o.
func (ca *CA) Issue(o Options) (*Pair, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.AddDate(1, 0, 0)
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: o.CommonName, Organization: []string{"moonraft"}},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     o.DNSNames,
		IPAddresses:  o.IPs,
	}
	if o.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if o.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &k.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	kp, err := keyPEM(k)
	if err != nil {
		return nil, err
	}
	return &Pair{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: kp}, nil
}

// Node issues a node certificate (server and client usage) for loopback:
// SANs localhost, 127.0.0.1 and ::1, plus extra DNS names or IPs.
func (ca *CA) Node(name string, extra ...string) (*Pair, error) {
	o := Options{CommonName: name, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, Server: true, Client: true}
	for _, e := range extra {
		if ip := net.ParseIP(e); ip != nil {
			o.IPs = append(o.IPs, ip)
		} else {
			o.DNSNames = append(o.DNSNames, e)
		}
	}
	return ca.Issue(o)
}

// Client issues a client-only certificate (moonctl, inference engines).
func (ca *CA) Client(name string) (*Pair, error) {
	return ca.Issue(Options{CommonName: name, Client: true})
}

// WriteCA writes ca.pem (and ca-key.pem when withKey) into dir and returns
// the certificate's path.
func (ca *CA) WriteCA(dir string, withKey bool) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(p, ca.CertPEM, 0o644); err != nil {
		return "", err
	}
	if withKey {
		if err := os.WriteFile(filepath.Join(dir, "ca-key.pem"), ca.KeyPEM, 0o600); err != nil {
			return "", err
		}
	}
	return p, nil
}

// Write writes name.pem and name-key.pem into dir and returns their paths.
func (p *Pair) Write(dir, name string) (cert, key string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	cert, key = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(cert, p.CertPEM, 0o644); err != nil {
		return "", "", fmt.Errorf("write %s: %w", cert, err)
	}
	if err := os.WriteFile(key, p.KeyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write %s: %w", key, err)
	}
	return cert, key, nil
}
