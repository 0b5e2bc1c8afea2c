package node

import (
	"context"
	"errors"
	"io"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/fsm"
	"github.com/moonraft/moonraft/internal/hugepage"
	"github.com/moonraft/moonraft/internal/memlimit"
	"github.com/moonraft/moonraft/snapshots"
)

// stateMachine adapts fsm.FSM to raft.FSM. Raft calls Apply, Snapshot and
// Restore from one goroutine; client reads run concurrently under the read
// lock.
type stateMachine struct {
	mu        sync.RWMutex
	f         *fsm.FSM
	clusterID string
	nodeID    string
	now       func() int64
	// onApply and onSnapshot tell the node's exporter there is work;
	// onPromote wakes requests waiting for a leader; onRestore says the
	// state is about to be replaced wholesale, onRestored that it was.
	onApply    func()
	onPromote  func()
	onSnapshot func(snapshotDone)
	onRestore  func()
	onRestored func(restored)
	// onHalt says this node stopped applying (see halt); it must not block.
	onHalt func(error)
	// halt is why this node stopped applying: a log entry it cannot decode,
	// most likely a command of a newer release. Applying around it would
	// leave this node's state different from the others', so it applies
	// nothing more and takes no snapshot; its owner stops the process.
	halt error
	// indexKeys: the leader's state keeps its key index (fsm.IndexKeys),
	// across a Restore too.
	indexKeys bool
	// sessions holds the clients with a live session, as of the last
	// applied entry, for pings to read without the lock (fsm/sessionlog.go);
	// a Restore replaces it whole.
	sessions atomic.Pointer[sync.Map]

	appliedIndex atomic.Uint64
	appliedSeq   atomic.Uint64 // the state's AppliedSeq, read without the lock
	appliedTerm  atomic.Uint64
	evicted      atomic.Uint64 // objects evicted by applied Ticks (metrics)
	lastRestore  atomic.Pointer[restored]
}

// restored is what a Restore read and what it took: its time, and the CPU
// its thread used (Linux; 0 elsewhere), the rest of the time it waited for
// a CPU.
type restored struct {
	hdr       snapshots.Header
	took, cpu time.Duration
	readied   int    // bytes readied for huge pages (hugepage.ForNext)
	huge      uint64 // the process's memory in huge pages after it
}

func newStateMachine(clusterID, nodeID string, now func() int64) *stateMachine {
	s := &stateMachine{f: fsm.New(), clusterID: clusterID, nodeID: nodeID, now: now}
	s.f.TrackSessions(true)
	s.sessions.Store(new(sync.Map))
	return s
}

// hasSession reports whether clientID has a live session, without the lock.
func (s *stateMachine) hasSession(clientID string) bool {
	_, ok := s.sessions.Load().Load(clientID)
	return ok
}

// trackSessions brings the session set up to date with the state.
func (s *stateMachine) trackSessions() {
	if changes := s.f.TakeSessionChanges(); len(changes) > 0 {
		record(s.sessions.Load(), changes)
	}
}

// record applies session changes to a session set.
func record(set *sync.Map, changes []fsm.SessionChange) {
	for _, c := range changes {
		if c.Live {
			set.Store(c.ClientID, struct{}{})
		} else {
			set.Delete(c.ClientID)
		}
	}
}

// Apply applies one committed entry; the fsm.Result is the future's response.
func (s *stateMachine) Apply(l *raft.Log) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halt != nil {
		return fsm.Result{Err: s.halt}
	}
	var r fsm.Result
	if l.Type == raft.LogCommand {
		c, err := fsm.Decode(l.Data)
		if err != nil {
			why := err.Error()
			var ee *errcode.Error
			if errors.As(err, &ee) {
				why = ee.Msg
			}
			s.halt = errcode.New(errcode.InvalidVersion,
				"raft log entry %d (term %d) cannot be applied by this build (%s); "+
					"this node stopped applying so it cannot differ from the others: "+
					"run the release the leader runs and restart it", l.Index, l.Term, why)
			if s.onHalt != nil {
				s.onHalt(s.halt)
			}
			return fsm.Result{Err: s.halt}
		}
		if c != nil {
			r = s.f.ApplyCommand(c)
			s.trackSessions()
		}
		if r.Evicted > 0 {
			s.evicted.Add(r.Evicted)
		}
	}
	s.appliedIndex.Store(l.Index)
	s.appliedTerm.Store(l.Term)
	s.appliedSeq.Store(s.f.AppliedSeq())
	if s.onApply != nil {
		s.onApply()
	}
	if s.onPromote != nil && l.Type == raft.LogCommand && len(l.Data) > 0 && fsm.CmdType(l.Data[0]) == fsm.CmdPromote {
		s.onPromote()
	}
	return r
}

// Snapshot captures the state (cheap: copy-on-write); Persist writes it
// while Apply goes on.
func (s *stateMachine) Snapshot() (raft.FSMSnapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.halt != nil {
		return nil, s.halt
	}
	snap := s.f.Snapshot()
	return &fsmSnapshot{
		done: s.onSnapshot,
		snap: snap,
		hdr: snapshots.Header{
			AppliedSeq:    snap.AppliedSeq(),
			RaftIndex:     s.appliedIndex.Load(),
			RaftTerm:      s.appliedTerm.Load(),
			ClusterID:     s.clusterID,
			NodeID:        s.nodeID,
			CreatedUnixMs: s.now(),
		},
	}, nil
}

// Restore replaces the state with a snapshot; on a bad snapshot the old
// state stays and the error goes back to Raft.
func (s *stateMachine) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if s.onRestore != nil {
		s.onRestore()
	}
	defer memlimit.Hold()()
	next, done, err := restore(rc)
	if err != nil {
		return err
	}
	// One collection, with nothing else to run, before the collector is
	// back on: its last count of the live heap is of the state before, so it
	// would start at once anyway, its assists slowing the log's replay, and
	// the heap limit set from that count would have it collect back to back
	// until a collection ends.
	defer runtime.GC()
	s.lastRestore.Store(done)
	if s.onRestored != nil {
		s.onRestored(*done)
	}
	next.TrackSessions(true)
	set := new(sync.Map)
	record(set, next.TakeSessionChanges())
	s.mu.Lock()
	defer s.mu.Unlock()
	next.IndexKeys(s.indexKeys)
	s.f = next
	s.sessions.Store(set)
	s.appliedIndex.Store(done.hdr.RaftIndex)
	s.appliedTerm.Store(done.hdr.RaftTerm)
	s.appliedSeq.Store(next.AppliedSeq())
	return nil
}

// restoreBytesPerObject is about what a restore allocates an object: 291 B
// at a million objects of 10,000 clients (go test ./fsm -bench
// Snapshot1MOf10kClients/parallel -benchmem).
const restoreBytesPerObject = 320

// restore builds a state from the snapshot r on every core.
func restore(r io.Reader) (*fsm.FSM, *restored, error) {
	// Kept on one OS thread, as Persist, to tell its CPU from its waits;
	// so is each of its tasks.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := time.Now()
	cpu0, ok0 := threadCPU()
	sr, err := snapshots.NewReader(r)
	if err != nil {
		return nil, nil, err
	}
	// In a process just started, most of a restore's CPU is the first
	// touch of its memory, which costs a half to a third as much in huge
	// pages.
	readied, end := hugepage.ForNext(int(min(sr.Header().Objects, math.MaxInt32)) * restoreBytesPerObject)
	defer end()
	var tasks restoreTasks
	next := fsm.New()
	if err := next.RestoreParallel(sr, runtime.GOMAXPROCS(0), tasks.run); err != nil {
		return nil, nil, err
	}
	cpu1, ok1 := threadCPU()
	done := &restored{hdr: sr.Header(), took: time.Since(t0), readied: readied}
	if ok0 && ok1 && !tasks.unmeasured.Load() {
		done.cpu = cpu1 - cpu0 + time.Duration(tasks.cpu.Load())
	}
	if readied > 0 {
		done.huge = hugepage.InUse()
	}
	return next, done, nil
}

// restoreTasks runs a restore's tasks (fsm.Parallel) in goroutines of
// their own, and sums the CPU they use.
type restoreTasks struct {
	cpu        atomic.Int64 // nanoseconds
	unmeasured atomic.Bool  // a thread's CPU could not be read
}

func (r *restoreTasks) run(tasks ...func()) {
	var wg sync.WaitGroup
	for _, t := range tasks {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0, ok0 := threadCPU()
			t()
			cpu1, ok1 := threadCPU()
			if !ok0 || !ok1 {
				r.unmeasured.Store(true)
			}
			r.cpu.Add(int64(cpu1 - cpu0))
		})
	}
	wg.Wait()
}

// setIndexKeys says whether the state keeps its key index (fsm.IndexKeys):
// the leader looks keys up for reads, followers only apply. Off drops it;
// on, buildKeyIndex builds it and a restored state comes with one.
func (s *stateMachine) setIndexKeys(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.indexKeys = on
	if !on {
		s.f.IndexKeys(false)
	}
}

// buildKeyIndex builds the state's key index from a clone of its objects,
// holding the state's lock only to start and to finish: applies, reads and
// pings go on meanwhile (fsm/keyindex.go).
func (s *stateMachine) buildKeyIndex(ctx context.Context) {
	s.mu.Lock()
	b := s.f.StartKeyIndex()
	s.mu.Unlock()
	if b.Build(ctx) != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.f.FinishKeyIndex(b)
}

// read runs fn with the state read-locked.
func (s *stateMachine) read(fn func(f *fsm.FSM)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	fn(s.f)
}

// write runs fn with Apply excluded, as fsm.FSM.Snapshot needs.
func (s *stateMachine) write(fn func(f *fsm.FSM)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(s.f)
}

type fsmSnapshot struct {
	snap *fsm.Snapshot
	hdr  snapshots.Header
	done func(snapshotDone)
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	// The writer's own CPU, apart from its waits for a CPU or the disk:
	// that of the OS thread it is kept on.
	runtime.LockOSThread()
	cpu0, ok0 := threadCPU()
	err := s.snap.Write(sink, s.hdr)
	cpu1, ok1 := threadCPU()
	runtime.UnlockOSThread()
	if err != nil {
		_ = sink.Cancel()
		return err
	}
	if ws, ok := sink.(*watchedSink); ok && ok0 && ok1 {
		ws.encodeCPU = cpu1 - cpu0
	}
	if err := sink.Close(); err != nil {
		return err
	}
	if s.done != nil {
		s.done(snapshotDone{id: sink.ID(), seq: s.hdr.AppliedSeq})
	}
	return nil
}

func (s *fsmSnapshot) Release() {}
