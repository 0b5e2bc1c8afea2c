package jepsen

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// nodeArgs are the node flags of every run: sessions that survive any
// fault of the schedule (the checkers would otherwise have to explain
// client expiry), soft pins that outlast the run (register and set objects
// are soft-pinned so eviction takes the lease workload's objects first),
// frequent Raft snapshots so snapshot-driven OpLog cleanup runs, with a
// retain small enough that cleanup deletes entries during the run yet
// large enough that etcd always covers one of the snapshots the harness
// takes (the replay check starts from it) and that the OpLog tap, behind
// after an etcd cut heals, reads every entry before cleanup deletes it
// (the short run's 4,000 did not once --snapshot-log-ratio 0.5 snapshotted
// twice as often: cleanup deleted 5,168 entries, all written, 1,151 of
// them past the tap), and raft-wal segments of 1 MiB
// (instead of 64) so that a node whose disk is filled goes on into the
// next segment within seconds and meets a full disk there (finding 15).
func nodeArgs(retain int) []string {
	return []string{
		"--raft-wal-segment-mb", "1",
		"--client-ttl", "60s",
		"--soft-pin-ttl", "24h",
		"--snapshot-threshold", "2048",
		"--snapshot-interval", "5s",
		"--oplog-retain", fmt.Sprint(retain),
	}
}

var defaultWorkload = workloadConfig{registerClients: 4, setClients: 2, leaseClients: 2, opTimeout: 3 * time.Second}

// soakWorkload keeps the state's size steady (the set at about 2 × 3,000
// objects; the lease workload's objects are evicted), so the nodes' memory
// has no reason to grow, and its register history checkable in the
// machine's memory (paced: about 400 ops/s instead of 2,000).
var soakWorkload = workloadConfig{registerClients: 4, setClients: 2, leaseClients: 2, opTimeout: 3 * time.Second, setKeep: 3000, registerGap: 10 * time.Millisecond}

// TestJepsenShort is the fixed run of `make test`: seed 42, every nemesis
// once in a fixed order, about a minute of faults under load.
func TestJepsenShort(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level fault suite; run without -short")
	}
	const seed = 42
	schedule := drawSchedule(seed, 95*time.Second, AllNemeses, false, 4*time.Second, 4*time.Second, 3*time.Second, 3*time.Second, 3)
	if len(schedule) != len(AllNemeses) {
		t.Fatalf("the short schedule holds %d events, want every nemesis once: %v", len(schedule), schedule)
	}
	last := schedule[len(schedule)-1]
	runJepsen(t, runConfig{
		name:         "short",
		seed:         seed,
		chaos:        last.At + last.Dur + 3*time.Second,
		schedule:     schedule,
		workload:     defaultWorkload,
		snapEvery:    10 * time.Second,
		checkTimeout: 2 * time.Minute,
		nodeArgs:     nodeArgs(8000),
		command:      "go test -run TestJepsenShort -v ./tests/jepsen/",
	})
}

// TestJepsen is `make jepsen`: every nemesis, mixed on a schedule drawn
// from JEPSEN_SEED, for JEPSEN_DURATION.
func TestJepsen(t *testing.T) {
	ds, dur, seed := longRun(t, "JEPSEN_DURATION", "make jepsen DURATION=10m [SEED=n] [NEMESES=a,b]", 30*time.Second)
	kinds, command := AllNemeses, fmt.Sprintf("make jepsen DURATION=%s SEED=%d", ds, seed)
	if ns := os.Getenv("JEPSEN_NEMESES"); ns != "" {
		var err error
		if kinds, err = nemesesFrom(ns); err != nil {
			t.Fatalf("JEPSEN_NEMESES: %v", err)
		}
		command += " NEMESES=" + ns
	}
	schedule := drawSchedule(seed, dur, kinds, true, 5*time.Second, 15*time.Second, 3*time.Second, 8*time.Second, 3)
	runJepsen(t, runConfig{
		name:         "jepsen",
		seed:         seed,
		chaos:        dur,
		schedule:     schedule,
		workload:     defaultWorkload,
		snapEvery:    20 * time.Second,
		checkTimeout: 10 * time.Minute,
		// Two or three snapshot intervals of the suite's ~1,000 OpLog
		// entries a second: with 20,000 a run whose nemeses spoiled one
		// snapshot, or wrote faster, could have no snapshot left that etcd
		// covers (seed 736119009, 2m: 20,000 entries after the last).
		nodeArgs: nodeArgs(60000),
		command:  command,
	})
}

// TestSoak is `make soak`: steady load for SOAK_DURATION with every
// nemesis now and then (a fault every 20–60 s), every node's heap,
// resident memory, goroutines, open files and data dir, etcd's size and
// the OpLog's length sampled every 10 s (soak.csv, soak.svg); it fails,
// besides every check of the fault suite, on any of them growing without
// bound.
func TestSoak(t *testing.T) {
	ds, dur, seed := longRun(t, "SOAK_DURATION", "make soak DURATION=30m [SEED=n]", 2*time.Minute)
	schedule := drawSchedule(seed, dur, AllNemeses, true, 5*time.Second, 15*time.Second, 20*time.Second, 45*time.Second, 3)
	runJepsen(t, runConfig{
		name:         "soak",
		seed:         seed,
		chaos:        dur,
		schedule:     schedule,
		workload:     soakWorkload,
		snapEvery:    30 * time.Second,
		checkTimeout: 20 * time.Minute,
		nodeArgs:     nodeArgs(20000),
		command:      fmt.Sprintf("make soak DURATION=%s SEED=%d", ds, seed),
		sampleEvery:  10 * time.Second,
	})
}

// longRun reads an opt-in run's duration from the environment variable
// durEnv (skipping the test without it) and its seed from JEPSEN_SEED (the
// clock's without it).
func longRun(t *testing.T, durEnv, how string, least time.Duration) (string, time.Duration, uint64) {
	ds := os.Getenv(durEnv)
	if ds == "" {
		t.Skipf("%s is not set: this long run is opt-in (%s)", durEnv, how)
	}
	dur, err := time.ParseDuration(ds)
	if err != nil || dur < least {
		t.Fatalf("%s=%q: want a Go duration of at least %v", durEnv, ds, least)
	}
	seed := uint64(time.Now().UnixNano() % 1_000_000_000)
	if ss := os.Getenv("JEPSEN_SEED"); ss != "" {
		if seed, err = strconv.ParseUint(ss, 10, 64); err != nil {
			t.Fatalf("JEPSEN_SEED=%q: want an unsigned integer", ss)
		}
	}
	return ds, dur, seed
}

// TestJepsenRecheck reruns the history checkers on the output of an
// earlier run (JEPSEN_RECHECK=tests/out/<run>), without a cluster.
func TestJepsenRecheck(t *testing.T) {
	dir := os.Getenv("JEPSEN_RECHECK")
	if dir == "" {
		t.Skip("JEPSEN_RECHECK is not set: give the output directory of a run to check its history again")
	}
	ops, entries, meta, err := readInputs(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := summary{Run: dir}
	analyze(&s, ops, entries, meta, 10*time.Minute, t.TempDir())
	t.Log("\n" + renderReport(s))
	for _, v := range s.Violations {
		t.Errorf("violation %s", v)
	}
	for _, p := range s.Problems {
		t.Errorf("problem: %s", p)
	}
}
