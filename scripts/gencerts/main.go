// Command gencerts writes a test PKI for running moonraft with TLS locally
// (`make certs`): a CA, one certificate per node (server and client usage,
// SANs localhost, 127.0.0.1 and ::1 plus any --san), a client certificate
// for moonctl, and optionally an expired client certificate to see a
// refusal. For production use your own CA; see docs/OPERATIONS.md.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moonraft/moonraft/transport/certgen"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "gencerts:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", "run/certs", "output directory")
	nodes := flag.String("nodes", "n0,n1,n2", "node names, comma-separated: one certificate each")
	san := flag.String("san", "", "extra SANs for every node certificate (DNS names or IPs), comma-separated")
	client := flag.String("client", "moonctl", "name of the client certificate (empty: none)")
	expired := flag.Bool("expired", false, "also write expired-client.pem, a client certificate that expired an hour ago")
	token := flag.Bool("token", true, "also write admin-token, a random admin token (mode 0600)")
	flag.Parse()

	ca, err := certgen.NewCA("moonraft test CA")
	if err != nil {
		return err
	}
	if _, err := ca.WriteCA(*dir, true); err != nil {
		return err
	}
	var extra []string
	for _, s := range strings.Split(*san, ",") {
		if s = strings.TrimSpace(s); s != "" {
			extra = append(extra, s)
		}
	}
	var written []string
	for _, n := range strings.Split(*nodes, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		p, err := ca.Node(n, extra...)
		if err != nil {
			return err
		}
		cert, _, err := p.Write(*dir, n)
		if err != nil {
			return err
		}
		written = append(written, cert)
	}
	if *client != "" {
		p, err := ca.Client(*client)
		if err != nil {
			return err
		}
		cert, _, err := p.Write(*dir, *client)
		if err != nil {
			return err
		}
		written = append(written, cert)
	}
	if *expired {
		now := time.Now()
		p, err := ca.Issue(certgen.Options{CommonName: "expired-client", Client: true, NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)})
		if err != nil {
			return err
		}
		cert, _, err := p.Write(*dir, "expired-client")
		if err != nil {
			return err
		}
		written = append(written, cert)
	}
	if *token {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		p := filepath.Join(*dir, "admin-token")
		if err := os.WriteFile(p, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
			return err
		}
		written = append(written, p)
	}
	fmt.Printf("CA %s (key ca-key.pem), certificates: %s\n", filepath.Join(*dir, "ca.pem"), strings.Join(written, " "))
	return nil
}
