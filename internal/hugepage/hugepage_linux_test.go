package hugepage

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWanted(t *testing.T) {
	const n = 64 << 20
	for _, tc := range []struct {
		name, mode, godebug string
		heap                uint64
		n                   int
		want                bool
	}{
		{"madvise", "always [madvise] never\n", "", 0, n, true},
		{"always: the heap has them unasked", "[always] madvise never\n", "", 0, n, false},
		{"never", "always madvise [never]\n", "", 0, n, false},
		{"no such file: not Linux, or no THP", "", "", 0, n, false},
		{"Go's switch off", "always [madvise] never", "gctrace=1,disablethp=1", 0, n, false},
		{"Go's switch set and reset: the last wins", "always [madvise] never", "disablethp=1,disablethp=0", 0, n, true},
		{"another setting", "always [madvise] never", "madvdontneed=1", 0, n, true},
		{"a live heap of half", "always [madvise] never", "", n / 2, n, true},
		{"a larger one: its collection costs", "always [madvise] never", "", n/2 + 1, n, false},
		{"too little to ready", "always [madvise] never", "", 0, minSize - 1, false},
	} {
		assert.Equal(t, tc.want, wanted(tc.mode, tc.godebug, tc.heap, tc.n), tc.name)
	}
}

// TestCapped readies at most a quarter of the machine's memory, whatever
// a snapshot's header claims: a block past what the machine has would be
// refused and end the process.
func TestCapped(t *testing.T) {
	const gib = 1 << 30
	assert.Equal(t, 3*gib, capped(3*gib, 24*gib), "a restore's")
	assert.Equal(t, 6*gib, capped(math.MaxInt, 24*gib), "a header's claim")
	assert.Equal(t, 0, capped(gib, 0), "the memory unknown")
	assert.NotZero(t, physicalMemory())
}

// TestAdviseFaultsInHugePages allocates small objects after readying 64
// MiB, as a restore does, until 48 MiB of them lie in the advised block:
// the block is advised for huge pages and, where the kernel gives them
// (its mode madvise or always), at least 32 MiB of it comes in them;
// withdraw ends the advice. (In a new process the objects take the block
// first; a run before this one in the process has freed memory below it.)
func TestAdviseFaultsInHugePages(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // as a restore runs (memlimit.Hold)
	mode, _ := os.ReadFile(modeFile)
	t.Logf("transparent huge pages: %q", strings.TrimSpace(string(mode)))

	debug.FreeOSMemory() // a run before this one in the process leaves its memory resident
	r, err := advise(64 << 20)
	require.NoError(t, err)
	_, flags := area(t, r.beg)
	assert.Contains(t, flags, " hg ", "the block advised for huge pages")
	var objects [][]byte
	for in := 0; in < 48<<20 && len(objects) < 256<<10; {
		b := make([]byte, 1000)
		if p := uintptr(unsafe.Pointer(&b[0])); r.beg <= p && p < r.end {
			in += len(b)
		}
		objects = append(objects, b)
	}
	huge, _ := area(t, r.beg)
	inUse := InUse()
	r.withdraw()
	_, flags = area(t, r.beg)
	runtime.KeepAlive(objects)

	if !strings.Contains(string(mode), "[never]") {
		assert.GreaterOrEqual(t, huge, uint64(32<<20), "the block's pages came in huge pages")
		assert.GreaterOrEqual(t, inUse, huge, "the process's memory in huge pages")
	}
	assert.NotContains(t, flags, " hg ", "the advice withdrawn")
}

// area returns the memory in huge pages and the VmFlags, space-delimited,
// of the process's memory area holding addr.
func area(t *testing.T, addr uintptr) (huge uint64, flags string) {
	b, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if lo, hi, ok := bounds(line); ok {
			in = lo <= addr && addr < hi
		}
		if !in {
			continue
		}
		if n, ok := kB(line, "AnonHugePages:"); ok {
			huge = n
		}
		if v, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			flags = v + " "
		}
	}
	return huge, flags
}

// bounds parses an area's first line in smaps: "lo-hi perms ...".
func bounds(line string) (lo, hi uintptr, ok bool) {
	span, _, _ := strings.Cut(line, " ")
	l, h, found := strings.Cut(span, "-")
	a, err1 := strconv.ParseUint(l, 16, 64)
	b, err2 := strconv.ParseUint(h, 16, 64)
	if !found || err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uintptr(a), uintptr(b), true
}
