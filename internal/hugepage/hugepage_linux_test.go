package hugepage

import (
	"math"
	"os"
	"os/exec"
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
// MiB, as a restore does, until 48 MiB of them lie in the advised memory:
// it is advised for huge pages and, where the kernel gives them (its mode
// madvise or always), at least 32 MiB of it comes in them; withdraw ends
// the advice. (In a new process the objects take the advised memory
// first; a run before this one in the process has freed memory below it.)
func TestAdviseFaultsInHugePages(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // as a restore runs (memlimit.Hold)
	mode, _ := os.ReadFile(modeFile)
	t.Logf("transparent huge pages: %q", strings.TrimSpace(string(mode)))
	debug.FreeOSMemory() // a run before this one in the process leaves its memory resident
	rs, err := advise(64 << 20)
	require.NoError(t, err)
	require.NotEmpty(t, rs)
	for _, r := range rs {
		assert.Contains(t, area(t, r.beg).flags, " hg ", "the blocks advised for huge pages")
	}
	var objects [][]byte
	for in := 0; in < 48<<20 && len(objects) < 256<<10; {
		b := make([]byte, 1000)
		p := uintptr(unsafe.Pointer(&b[0]))
		for _, r := range rs {
			if r.beg <= p && p < r.end {
				in += len(b)
			}
		}
		objects = append(objects, b)
	}
	var huge uint64
	for _, r := range rs {
		huge += area(t, r.beg).huge
	}
	inUse := InUse()
	rs.withdraw()
	runtime.KeepAlive(objects)

	if !strings.Contains(string(mode), "[never]") {
		assert.GreaterOrEqual(t, huge, uint64(32<<20), "the advised memory came in huge pages")
		assert.GreaterOrEqual(t, inUse, huge, "the process's memory in huge pages")
	}
	for _, r := range rs {
		assert.NotContains(t, area(t, r.beg).flags, " hg ", "the advice withdrawn")
	}
}

// inChild names the test a child process runs (the test binary again).
const inChild = "HUGEPAGE_TEST_CHILD"

// TestAdviseAfterMemoryUsedBefore readies 64 MiB in a new process whose
// heap used 16 MiB and freed it, as a restarted node's did opening its
// log: the readying touches none of the fresh memory. Go zeroes a block
// that overlaps memory its heap used before, all of the block, which one
// block of 64 MiB placed over the freed memory would have it resident, in
// 4 KiB pages, before the advice.
func TestAdviseAfterMemoryUsedBefore(t *testing.T) {
	if os.Getenv(inChild) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAdviseAfterMemoryUsedBefore$", "-test.count=1")
		cmd.Env = append(os.Environ(), inChild+"=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "the child process:\n%s", out)
		return
	}
	debug.SetGCPercent(-1)
	used := make([]byte, 16<<20)
	for i := range used {
		used[i] = 1
	}
	runtime.KeepAlive(used)
	runtime.GC()
	rs, err := advise(64 << 20)
	require.NoError(t, err)
	var rss uint64
	for _, r := range rs {
		rss += area(t, r.beg).rss // an advised region is an area of its own
	}
	assert.LessOrEqual(t, rss, uint64(20<<20), "the advised memory resident: the 16 MiB used before at most")
	assert.GreaterOrEqual(t, rs.size(), 40<<20, "the bytes advised")
}

// memArea is what smaps says of one of the process's memory areas.
type memArea struct {
	rss, huge uint64 // bytes resident, and of them in huge pages
	flags     string // VmFlags, space-delimited
}

// area returns the process's memory area holding addr.
func area(t *testing.T, addr uintptr) memArea {
	b, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	var a memArea
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if lo, hi, ok := bounds(line); ok {
			in = lo <= addr && addr < hi
		}
		if !in {
			continue
		}
		if n, ok := kB(line, "Rss:"); ok {
			a.rss = n
		}
		if n, ok := kB(line, "AnonHugePages:"); ok {
			a.huge = n
		}
		if v, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			a.flags = v + " "
		}
	}
	return a
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
