package hugepage

import (
	"cmp"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePage = 2 << 20

// chunk is the size of the blocks advise takes the memory in.
const chunk = 4 << 20

// region is a range of the heap advised for huge pages.
type region struct{ beg, end uintptr }

// regions are the ranges one advise advised.
type regions []region

// advise grows the heap by n bytes in blocks of a chunk, advises the huge
// pages that runs of adjacent blocks span (MADV_HUGEPAGE) and frees the
// blocks with a collection. A fresh block is never touched, so none of it
// is resident yet, and Go's page allocator, lowest address first, hands
// its pages to the next allocations; each of their first touches then
// faults in a 2 MiB page. Go zeroes a block that overlaps memory the heap
// used before, touching it in 4 KiB pages that then stay so: in blocks of
// a chunk, only those that overlap are lost, not all of n.
func advise(n int) (regions, error) {
	blocks := make([][]byte, 0, n/chunk+1)
	for left := n; left > 0; left -= chunk {
		blocks = append(blocks, make([]byte, min(left, chunk)))
	}
	spans := make([]region, len(blocks))
	for i, b := range blocks {
		p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		spans[i] = region{p, p + uintptr(len(b))}
	}
	slices.SortFunc(spans, func(a, b region) int { return cmp.Compare(a.beg, b.beg) })
	var runs regions
	for _, s := range spans {
		if last := len(runs) - 1; last >= 0 && runs[last].end == s.beg {
			runs[last].end = s.end
			continue
		}
		runs = append(runs, s)
	}
	var rs regions
	var err error
	for _, r := range runs {
		r = region{(r.beg + hugePage - 1) &^ (hugePage - 1), r.end &^ (hugePage - 1)}
		if r.beg >= r.end {
			continue
		}
		if err = r.madvise(unix.MADV_HUGEPAGE); err != nil {
			break
		}
		rs = append(rs, r)
	}
	runtime.KeepAlive(blocks) // advised while they are still the blocks'
	runtime.GC()
	if err != nil {
		rs.withdraw()
		return nil, err
	}
	return rs, nil
}

// size returns the bytes advised.
func (rs regions) size() int {
	n := 0
	for _, r := range rs {
		n += int(r.end - r.beg)
	}
	return n
}

// withdraw ends the advice (MADV_NOHUGEPAGE).
func (rs regions) withdraw() {
	for _, r := range rs {
		_ = r.madvise(unix.MADV_NOHUGEPAGE)
	}
}

// madvise takes addresses, not a slice: a slice into a freed block would
// keep it alive.
func (r region) madvise(advice int) error {
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, r.beg, r.end-r.beg, uintptr(advice)); errno != 0 {
		return errno
	}
	return nil
}

// physicalMemory returns the machine's memory in bytes, 0 if unknown.
func physicalMemory() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return uint64(si.Totalram) * uint64(si.Unit)
}

// InUse returns the process's anonymous memory in transparent huge pages
// (AnonHugePages), 0 if it cannot be read.
func InUse() uint64 {
	b, err := os.ReadFile("/proc/self/smaps_rollup")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if n, ok := kB(line, "AnonHugePages:"); ok {
			return n
		}
	}
	return 0
}

// kB reads the bytes of an smaps line "name   123 kB".
func kB(line, name string) (uint64, bool) {
	v, ok := strings.CutPrefix(line, name)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
	return n << 10, err == nil
}
