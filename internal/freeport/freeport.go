// Package freeport hands out loopback addresses for servers started a
// moment later: tests, `moonbench --local` and `--dev`.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

const (
	lowest    = 10000 // below: well-known and commonly configured ports
	blockSize = 16
)

var (
	mu    sync.Mutex
	block []int // the ports of the claimed block not handed out yet
)

// Addr returns "127.0.0.1:PORT" with a port that was free a moment ago and
// that no other caller of Addr, in this process or another, was given.
// Ports come from below the kernel's ephemeral range: a port from that
// range, released until its server binds it, could meanwhile be given by
// the kernel to any "127.0.0.1:0" listener (a test proxy) or to the local
// end of an outgoing connection. Across processes (test packages run in
// parallel) each process claims blocks of 16 ports with a lock file held
// until it exits. A process that does not use Addr may still take a port
// first.
func Addr() (string, error) {
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		if len(block) == 0 {
			if err := claimBlock(); err != nil {
				return "", err
			}
		}
		port := block[0]
		block = block[1:]
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue // taken by someone else
		}
		_ = l.Close()
		return l.Addr().String(), nil
	}
	return "", fmt.Errorf("no free loopback port in %d..%d", lowest, ephemeralLow()-1)
}

// claimBlock locks a block of ports no other process holds and makes it
// the current one. The lock file stays open, so the lock lasts as long as
// the process.
func claimBlock() error {
	dir := filepath.Join(os.TempDir(), "moonraft-freeport")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return fmt.Errorf("freeport: %w", err)
	}
	blocks := (ephemeralLow() - lowest) / blockSize
	for range 1000 {
		b := rand.IntN(blocks)
		if claimed[b] {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(b)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return fmt.Errorf("freeport: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close() // another process holds it
			continue
		}
		claimed[b] = true
		held = append(held, f)
		block = block[:0]
		for p := lowest + b*blockSize; p < lowest+(b+1)*blockSize; p++ {
			block = append(block, p)
		}
		return nil
	}
	return fmt.Errorf("freeport: no unclaimed block of ports in %d..%d", lowest, ephemeralLow()-1)
}

var (
	claimed = map[int]bool{}
	held    []*os.File // open for the process's life: closing would drop the lock
)

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
