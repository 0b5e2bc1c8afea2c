package jepsen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The nemeses. Each one starts a fault, holds it for the event's duration
// and heals it; events never overlap, and every event is followed by a
// quiet gap in which the cluster recovers under load.
const (
	KillLeader      = "kill-leader"       // SIGKILL the leader, restart it after the duration
	KillRandom      = "kill-random"       // SIGKILL a node drawn from the seed, restart it
	PauseLeader     = "pause-leader"      // SIGSTOP the leader for 5 s, then SIGCONT
	RestartLeader   = "restart-leader"    // SIGTERM the leader (it hands leadership over, then stops), restart it
	PartitionLeader = "partition-leader"  // the leader cut off from both others, both ways
	PartitionOneWay = "partition-one-way" // one node cannot send to (or cannot be reached by) the others
	Latency         = "latency"           // 100–500 ms on every Raft link (300 ± 200 ms)
	EtcdCut         = "etcd-cut"          // every node cut off from etcd for 10 s
	Bandwidth       = "bandwidth"         // every Raft link limited to a few KB/s
	// The leader cut off from one follower (which campaigns), the other
	// follower SIGKILLed and restarted at once: the restart-vote hazard. A
	// restarted node has forgotten the leader it acknowledged; were it to
	// vote at once, the campaigner could win while the leader still serves
	// reads under a lease that node helped confirm.
	RestartFollower = "restart-follower"
	// The leader's (or a drawn node's) data dir file system filled to the
	// last byte (each node's data dir is a tmpfs of its own).
	DiskFull = "disk-full"
	// Every Raft log write of the leader (or a drawn node) takes 100 ms,
	// 500 ms or 2 s (a failpoint: the run's nodes are built with it).
	SlowDisk = "slow-disk"
)

// AllNemeses is every nemesis, in a fixed order.
var AllNemeses = []string{KillLeader, KillRandom, PauseLeader, RestartLeader, PartitionLeader, PartitionOneWay, Latency, EtcdCut, Bandwidth, RestartFollower,
	DiskFull, SlowDisk}

// event is one fault of the schedule.
type event struct {
	Kind  string        `json:"kind"`
	At    time.Duration `json:"at_ns"`  // from the start of the chaos phase
	Dur   time.Duration `json:"dur_ns"` // how long the fault is held
	Node  int           `json:"node"`   // the node for kill-random and partition-one-way
	Param int           `json:"param"`  // kind-specific: one-way direction, bandwidth rate
}

func (e event) String() string {
	return fmt.Sprintf("%s at %v for %v (node %d, param %d)", e.Kind, e.At.Round(time.Millisecond), e.Dur.Round(time.Millisecond), e.Node, e.Param)
}

// nemesesFrom reads a comma-separated list of nemeses (make jepsen
// NEMESES=...), refusing a name that is none.
func nemesesFrom(list string) ([]string, error) {
	kinds := strings.Split(list, ",")
	for _, k := range kinds {
		if !slices.Contains(AllNemeses, k) {
			return nil, fmt.Errorf("%q is no nemesis (they are %s)", k, strings.Join(AllNemeses, ","))
		}
	}
	return kinds, nil
}

// fixedDur are the durations the issue fixes; others are drawn.
var fixedDur = map[string]time.Duration{PauseLeader: 5 * time.Second, EtcdCut: 10 * time.Second}

// drawSchedule lays out events over total from seed: kinds are taken from
// a bag refilled (shuffled) with every nemesis in kinds whenever it runs
// empty, so a long run sees each of them about equally often; durations
// not fixed are drawn in [minDur, maxDur], gaps in [minGap, maxGap]. The
// same seed gives the same schedule.
func drawSchedule(seed uint64, total time.Duration, kinds []string, shuffle bool, minDur, maxDur, minGap, maxGap time.Duration, nodes int) []event {
	rng := rand.New(rand.NewPCG(seed, 0x6a657073656e)) // "jepsen"
	between := func(a, b time.Duration) time.Duration {
		if b <= a {
			return a
		}
		return a + time.Duration(rng.Int64N(int64(b-a)))
	}
	var (
		out []event
		bag []string
	)
	t := between(minGap, maxGap)
	for {
		if len(bag) == 0 {
			bag = append(bag, kinds...)
			if shuffle {
				rng.Shuffle(len(bag), func(i, j int) { bag[i], bag[j] = bag[j], bag[i] })
			}
		}
		kind := bag[0]
		dur, ok := fixedDur[kind]
		if !ok {
			dur = between(minDur, maxDur)
		}
		e := event{Kind: kind, At: t, Dur: dur, Node: rng.IntN(nodes), Param: rng.IntN(1000)}
		if t+dur > total {
			return out
		}
		bag = bag[1:]
		out = append(out, e)
		t += dur + between(minGap, maxGap)
	}
}

// nemesisRun applies schedule against c, labelling rec with the fault in
// force, until the schedule ends or ctx is done; it always heals.
func nemesisRun(ctx context.Context, c *cluster, rec *recorder, schedule []event, logf func(string, ...any)) error {
	start := time.Now()
	for _, e := range schedule {
		if err := sleepCtx(ctx, time.Until(start.Add(e.At))); err != nil {
			return nil
		}
		rec.setNemesis(e.Kind)
		detail, err := applyFault(ctx, c, e)
		if err != nil {
			logf("nemesis %s: %v", e.Kind, err)
		}
		logf("nemesis start %s: %s", e, detail)
		_ = sleepCtx(ctx, e.Dur)
		herr := c.healAll()
		rec.setNemesis("none")
		logf("nemesis healed %s", e.Kind)
		if herr != nil {
			return herr
		}
		if ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// target is the current leader, or the event's node when no leader is
// found within a few seconds (the fault then still lands somewhere).
func target(ctx context.Context, c *cluster, e event) (int, string) {
	if l, err := c.waitLeader(ctx, 5*time.Second); err == nil {
		return l, "leader " + c.nodes[l].id
	}
	return e.Node % len(c.nodes), "no leader found; " + c.nodes[e.Node%len(c.nodes)].id
}

// applyFault starts e's fault and says what it did.
func applyFault(ctx context.Context, c *cluster, e event) (string, error) {
	n := len(c.nodes)
	switch e.Kind {
	case KillLeader:
		i, who := target(ctx, c, e)
		c.nodes[i].Kill()
		return "SIGKILL " + who, nil
	case KillRandom:
		i := e.Node % n
		c.nodes[i].Kill()
		return "SIGKILL " + c.nodes[i].id, nil
	case PauseLeader:
		i, who := target(ctx, c, e)
		c.nodes[i].Signal(syscall.SIGSTOP)
		return "SIGSTOP " + who, nil
	case RestartLeader:
		// A rolling restart: the node transfers leadership, then closes
		// Raft with writes in flight. Waited for, so the heal restarts it.
		i, who := target(ctx, c, e)
		t0 := time.Now()
		c.nodes[i].Stop(15 * time.Second)
		return fmt.Sprintf("SIGTERM %s (exited after %v)", who, time.Since(t0).Round(time.Millisecond)), nil
	case PartitionLeader:
		i, who := target(ctx, c, e)
		return "isolated " + who, c.isolate(i)
	case PartitionOneWay:
		// Half the time the leader, else the drawn node; half the time it
		// cannot send (its own connections to peers drop everything), else
		// it cannot be reached (connections to it drop everything).
		i, who := e.Node%n, c.nodes[e.Node%n].id
		if e.Param%4 < 2 {
			i, who = target(ctx, c, e)
		}
		outbound := e.Param%2 == 0
		for j := 0; j < n; j++ {
			if j == i {
				continue
			}
			key := [2]int{j, i}
			if outbound {
				key = [2]int{i, j}
			}
			if err := c.raftLinks[key].cut(); err != nil {
				return who, err
			}
		}
		if outbound {
			return who + " cannot send to its peers", nil
		}
		return who + " cannot be reached by its peers", nil
	case RestartFollower:
		i, who := target(ctx, c, e)
		cutOff := (i + 1 + e.Param%2) % n
		for _, key := range [][2]int{{i, cutOff}, {cutOff, i}} {
			if err := c.raftLinks[key].cut(); err != nil {
				return who, err
			}
		}
		restarted := (cutOff + 1) % n
		if restarted == i {
			restarted = (restarted + 1) % n
		}
		c.nodes[restarted].Kill()
		err := c.nodes[restarted].Start()
		return fmt.Sprintf("%s cut off from %s; %s SIGKILLed and restarted", who, c.nodes[cutOff].id, c.nodes[restarted].id), err
	case DiskFull, SlowDisk:
		// Half the time the leader, else the drawn node.
		i, who := e.Node%n, c.nodes[e.Node%n].id
		if e.Param%4 < 2 {
			i, who = target(ctx, c, e)
		}
		if e.Kind == SlowDisk {
			d := []string{"100ms", "500ms", "2s"}[e.Param%3]
			return fmt.Sprintf("each Raft log write of %s takes %s", who, d), c.slowDisk(i, d)
		}
		n, err := c.fillDisk(i)
		return fmt.Sprintf("%s's disk filled (%d MiB taken)", who, n>>20), err
	case Latency:
		for _, l := range c.raftLinksList() {
			if err := l.addToxic("latency", "latency", "upstream", `{"latency":300,"jitter":200}`); err != nil {
				return "", err
			}
		}
		return "300±200 ms on every Raft link", nil
	case EtcdCut:
		for _, l := range c.etcdLinks {
			if err := l.cut(); err != nil {
				return "", err
			}
		}
		return "every node cut off from etcd", nil
	case Bandwidth:
		rate := []int{8, 32, 128}[e.Param%3]
		for _, l := range c.raftLinksList() {
			for _, s := range []string{"upstream", "downstream"} {
				if err := l.addToxic("bw-"+s, "bandwidth", s, fmt.Sprintf(`{"rate":%d}`, rate)); err != nil {
					return "", err
				}
			}
		}
		return fmt.Sprintf("%d KB/s each way on every Raft link", rate), nil
	}
	return "", fmt.Errorf("unknown nemesis %q", e.Kind)
}

// isolate cuts every Raft link to and from node i, both ways.
func (c *cluster) isolate(i int) error {
	for j := range c.nodes {
		if j == i {
			continue
		}
		for _, k := range [][2]int{{i, j}, {j, i}} {
			if err := c.raftLinks[k].cut(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *cluster) raftLinksList() []*link {
	var out []*link
	for i := range c.nodes {
		for j := range c.nodes {
			if l, ok := c.raftLinks[[2]int{i, j}]; ok {
				out = append(out, l)
			}
		}
	}
	return out
}
