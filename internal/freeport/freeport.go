// Package freeport hands out loopback addresses for servers started a
// moment later: tests, `moonbench --local` and `--dev`.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

const lowest = 10000 // below: well-known and commonly configured ports

var (
	mu   sync.Mutex
	seen = map[int]bool{}
)

// Addr returns "127.0.0.1:PORT" with a port that was free a moment ago and
// was never returned before in this process. Ports come from below the
// kernel's ephemeral range: a port from that range, released until its
// server binds it, could meanwhile be given by the kernel to any
// "127.0.0.1:0" listener (a test proxy) or to the local end of an outgoing
// connection — two servers of one run on one port. Another process may
// still take the port first.
func Addr() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	hi := ephemeralLow()
	for range 1000 {
		port := lowest + rand.IntN(hi-lowest)
		if seen[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken
		}
		_ = l.Close()
		seen[port] = true
		return l.Addr().String(), nil
	}
	return "", fmt.Errorf("no free loopback port in %d..%d", lowest, hi-1)
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default when it cannot be read).
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > lowest+1000 {
				low = n
			}
		}
	}
	return low
}
