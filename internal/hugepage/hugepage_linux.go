package hugepage

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePage = 2 << 20

// region is a range of the heap advised for huge pages.
type region struct{ beg, end uintptr }

// advise grows the heap by a block of n bytes, advises the huge pages it
// spans (MADV_HUGEPAGE) and frees it with a collection. The block is never
// touched, so none of it is resident yet, and Go's page allocator, lowest
// address first, hands its pages to the next allocations; each of their
// first touches then faults in a 2 MiB page.
func advise(n int) (region, error) {
	block := make([]byte, n)
	start := uintptr(unsafe.Pointer(unsafe.SliceData(block)))
	r := region{(start + hugePage - 1) &^ (hugePage - 1), (start + uintptr(n)) &^ (hugePage - 1)}
	err := r.madvise(unix.MADV_HUGEPAGE)
	runtime.KeepAlive(block)
	runtime.GC()
	return r, err
}

// withdraw ends the advice (MADV_NOHUGEPAGE).
func (r region) withdraw() { _ = r.madvise(unix.MADV_NOHUGEPAGE) }

// madvise takes addresses, not a slice: a slice into the freed block
// would keep it alive.
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
