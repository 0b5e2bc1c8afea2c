package jepsen

import (
	"bufio"
	"encoding/json"
	"errors"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moonraft/moonraft/errcode"
)

// Op statuses, as Jepsen names them: ok (it happened), fail (it certainly
// did not happen), info (it certainly did not change anything but told us
// something, e.g. a remove answered OBJECT_NOT_FOUND), unknown (it may or
// may not have happened: its Return is then "never" for the checker).
const (
	StatusOK      = "ok"
	StatusFail    = "fail"
	StatusInfo    = "info"
	StatusUnknown = "unknown"
)

// Workloads.
const (
	WRegister = "register"
	WSet      = "set"
	WLease    = "lease"
)

// never is the Return of an op whose outcome is unknown: it may take effect
// at any time after its call (etcd's robustness tests do the same).
const never = math.MaxInt64

// Op is one operation of the history: invoked by a client, completed with
// a status. Times are in two clocks: Call/Return are monotonic nanoseconds
// since the run started (for porcupine), CallMs/ReturnMs are Unix
// milliseconds (to compare with the leader's lease deadlines and OpLog
// timestamps: every process shares this machine's clock).
type Op struct {
	ID       int    `json:"id"`
	Workload string `json:"workload"`
	Client   int    `json:"client"`
	Kind     string `json:"kind"`
	Key      string `json:"key"`
	// Value: for a write the size written; for a read the size read, 0
	// when the key is absent.
	Value        uint64 `json:"value"`
	Force        bool   `json:"force,omitempty"`
	Status       string `json:"status"`
	Code         string `json:"code,omitempty"`
	Err          string `json:"err,omitempty"`
	Call         int64  `json:"call_ns"`
	Return       int64  `json:"return_ns"`
	CallMs       int64  `json:"call_ms"`
	ReturnMs     int64  `json:"return_ms"`
	LeaseUntilMs int64  `json:"lease_until_ms,omitempty"`
	Nemesis      string `json:"nemesis"`
	// Steps says how the op's parts ended, e.g. "put_start=OK put_end=OUTCOME_UNKNOWN revoke=OBJECT_NOT_FOUND".
	Steps string `json:"steps,omitempty"`
}

// recorder collects the history of every client.
type recorder struct {
	start   time.Time
	mu      sync.Mutex
	ops     []*Op
	nemesis atomic.Pointer[string]
}

func newRecorder() *recorder {
	r := &recorder{start: time.Now()}
	r.setNemesis("none")
	return r
}

func (r *recorder) setNemesis(n string) { r.nemesis.Store(&n) }

func (r *recorder) now() int64 { return time.Since(r.start).Nanoseconds() }

// invoke records the start of an op.
func (r *recorder) invoke(workload string, client int, kind, key string, value uint64, force bool) *Op {
	op := &Op{Workload: workload, Client: client, Kind: kind, Key: key, Value: value, Force: force,
		Nemesis: *r.nemesis.Load(), Return: -1, CallMs: time.Now().UnixMilli(), Call: r.now()}
	r.mu.Lock()
	op.ID = len(r.ops)
	r.ops = append(r.ops, op)
	r.mu.Unlock()
	return op
}

// outcome is how an op ended.
type outcome struct {
	status string
	err    error  // the error it ended with, if any
	value  uint64 // for reads: the size read
	lease  int64  // for reads: the lease granted (leader's Unix ms)
	steps  string
}

// complete records how op ended.
func (r *recorder) complete(op *Op, o outcome) {
	ret, retMs := r.now(), time.Now().UnixMilli()
	r.mu.Lock()
	defer r.mu.Unlock()
	op.Status = o.status
	op.Return, op.ReturnMs = ret, retMs
	if o.err != nil {
		op.Code = codeName(o.err)
		op.Err = o.err.Error()
	}
	if o.value != 0 {
		op.Value = o.value
	}
	op.LeaseUntilMs = o.lease
	op.Steps = o.steps
}

// snapshot returns a copy of the ops recorded so far.
func (r *recorder) snapshot() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Op, len(r.ops))
	for i, op := range r.ops {
		out[i] = *op
	}
	return out
}

func codeName(err error) string {
	if err == nil {
		return "OK"
	}
	var e *errcode.Error
	if errors.As(err, &e) {
		return e.Code.String()
	}
	return "NO_CODE"
}

// writeHistory writes ops as JSON lines.
func writeHistory(path string, ops []Op) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := range ops {
		if err := enc.Encode(&ops[i]); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
