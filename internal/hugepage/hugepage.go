// Package hugepage lets a burst of allocations into fresh memory, a
// snapshot's restore in a new process, fault its pages in 2 MiB at a time.
// The first touch of a page is most of a restore's CPU in a new process
// (its heap grows from nothing): on the 2-core VM of docs/BENCHMARKS.md a
// 4 KiB page costs 13–19 µs, a 2 MiB transparent huge page what 4.5–7.6 µs
// a 4 KiB page would. Go's heap takes huge pages only where the kernel
// gives them unasked (transparent_hugepage "always"); where it gives them
// only to memory advised for them ("madvise", Debian's and Ubuntu's
// default), ForNext advises the memory the next allocations will take.
package hugepage

import (
	"math"
	"os"
	"runtime/metrics"
	"strings"
)

// modeFile holds the kernel's transparent huge page mode, the one in
// brackets: "always [madvise] never".
const modeFile = "/sys/kernel/mm/transparent_hugepage/enabled"

// ForNext readies n bytes of fresh heap for huge pages, for the
// allocations that follow, and returns the bytes it advised and end, which
// withdraws the advice: afterwards the heap is as Go keeps it (khugepaged
// leaves it alone, and what the runtime returns to the kernel is split off
// its huge page). It readies nothing unless the kernel's mode is madvise,
// GODEBUG has no disablethp=1 (Go's own switch to keep huge pages off its
// heap), and the live heap is at most half of n: readying the memory takes
// a collection, which costs in CPU about what a first touch of as much
// memory as the live heap would. A process that has just started and
// restores its snapshot is the case. Free pages the heap already holds go
// to the allocations first (no first touch left to pay for them), then the
// readied ones. n is capped at a quarter of the machine's memory: a caller sizes
// it from a count it has yet to check.
func ForNext(n int) (readied int, end func()) {
	n = capped(n, physicalMemory())
	mode, _ := os.ReadFile(modeFile)
	if !wanted(string(mode), os.Getenv("GODEBUG"), liveHeap(), n) {
		return 0, func() {}
	}
	rs, err := advise(n)
	if err != nil {
		return 0, func() {}
	}
	return rs.size(), rs.withdraw
}

// capped returns n, at most a quarter of a machine of total bytes.
func capped(n int, total uint64) int {
	return min(n, int(min(total/4, math.MaxInt)))
}

// minSize is the least worth readying: a few huge pages.
const minSize = 8 << 20

// wanted says whether to ready n bytes, given the kernel's mode, GODEBUG
// and the live heap's bytes.
func wanted(mode, godebug string, heap uint64, n int) bool {
	if !strings.Contains(mode, "[madvise]") || n < minSize || heap > uint64(n)/2 {
		return false
	}
	off := false
	for _, kv := range strings.Split(godebug, ",") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(kv), "disablethp="); ok {
			off = v == "1" // the last setting wins, as Go reads it
		}
	}
	return !off
}

// liveHeap returns the bytes the last collection found live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
