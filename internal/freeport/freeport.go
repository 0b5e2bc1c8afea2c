// Package freeport hands out loopback addresses for servers started a
// moment later: tests, `moonbench --local` and `--dev`.
package freeport

import (
	"net"
	"sync"
)

var (
	mu   sync.Mutex
	seen = map[string]bool{}
)

// Addr returns "127.0.0.1:PORT" with a port that was free a moment ago and
// was never returned before in this process. The kernel may hand a port it
// just released out again; without the check two servers of one cluster
// could be given the same address. Another process may still take the port
// first.
func Addr() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := l.Addr().String()
		_ = l.Close()
		if !seen[addr] {
			seen[addr] = true
			return addr, nil
		}
	}
}
