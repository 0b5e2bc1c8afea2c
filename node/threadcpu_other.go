//go:build !linux

package node

import "time"

// threadCPU is Linux's (threadcpu_linux.go); elsewhere a snapshot's
// writer CPU is not measured.
func threadCPU() (time.Duration, bool) { return 0, false }
