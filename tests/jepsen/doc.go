// Package jepsen is moonraft's Jepsen-style fault suite: three real
// moonraft processes, an etcd process and an etcd follower, every Raft link
// (one per direction) and every node's etcd traffic behind its own
// toxiproxy proxy; nemeses that kill, pause, restart, partition, slow down
// and starve them on a schedule drawn from a seed; register, set and lease
// workloads through the Go client whose histories are checked afterwards —
// the register by porcupine — and end-of-run checks of digests, snapshots,
// the OpLog in etcd, its replay and the follower. docs/RELIABILITY.md
// describes what each check proves and reports a 10-minute run.
//
// TestJepsenShort (part of `make test`) runs a fixed one-minute schedule;
// TestJepsen (`make jepsen DURATION=10m SEED=n`) runs JEPSEN_DURATION of
// faults; TestJepsenRecheck reruns the checkers on a saved run.
package jepsen
