package jepsen

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// The register model: per key, the state is 0 (absent, or a put still
// PROCESSING) or v, the size of the complete object. Every write and upsert
// uses a value never used before for its key, so a read identifies the
// write it saw. A read or remove answered REPLICA_IS_NOT_READY says nothing
// (the key is being written: by a put over 0, or by an upsert over v) and
// is left out.

type regInput struct {
	Kind  string // write, upsert, read, remove, drop
	Key   string
	Value uint64 // write, upsert: the value written
	Why   string // drop: the OpLog source
}

type regOutput struct {
	Unknown bool   // the op may or may not have taken effect
	Value   uint64 // read: the value read, 0 for absent
	Found   bool   // remove: it removed something (else it found nothing visible)
	Lost    bool   // upsert: it started but did not end, which ends the old value
}

// regStep is the sequential specification, as a set of possible next
// states (a NondeterministicModel): an op of unknown outcome may have
// taken effect or not, as Jepsen treats :info ops.
func regStep(state, input, output any) []any {
	s, in, out := state.(uint64), input.(regInput), output.(regOutput)
	switch in.Kind {
	case "write":
		// A write's PutStart succeeds only on a key with nothing visible,
		// and nothing can make the key visible before its PutEnd (only the
		// same client could end it; removes of a PROCESSING object fail).
		if out.Unknown {
			if s == 0 {
				return []any{s, in.Value}
			}
			return []any{s}
		}
		if s == 0 {
			return []any{in.Value}
		}
		return nil
	case "upsert":
		// An upsert overwrites whatever is there. One that started ends
		// the old value at once (unreadable while written, then taken over
		// or reclaimed); one whose start may not have applied may have
		// done that or nothing.
		switch {
		case out.Unknown:
			return []any{s, uint64(0)}
		case out.Lost:
			return []any{uint64(0)}
		}
		return []any{in.Value}
	case "read":
		if out.Value == s {
			return []any{s}
		}
		return nil
	case "remove":
		switch {
		case out.Unknown:
			return []any{s, uint64(0)}
		case out.Found && s != 0:
			return []any{uint64(0)}
		case !out.Found && s == 0:
			return []any{s}
		}
		return nil
	case "drop":
		// A removal the state machine made on its own (eviction, client
		// expiry), known from the OpLog.
		return []any{uint64(0)}
	}
	return nil
}

func describeReg(input, output any) string {
	in, out := input.(regInput), output.(regOutput)
	q := ""
	if out.Unknown {
		q = "?"
	}
	switch in.Kind {
	case "write":
		return fmt.Sprintf("write(%d)%s", in.Value, q)
	case "upsert":
		if out.Lost {
			return fmt.Sprintf("upsert(%d)→not ended", in.Value)
		}
		return fmt.Sprintf("upsert(%d)%s", in.Value, q)
	case "read":
		return fmt.Sprintf("read()→%d", out.Value)
	case "remove":
		switch {
		case out.Unknown:
			return "remove()?"
		case out.Found:
			return "remove()→ok"
		}
		return "remove()→none"
	case "drop":
		return "oplog:" + in.Why
	}
	return in.Kind
}

func partitionByKey(h []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range h {
		k := op.Input.(regInput).Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	slices.Sort(keys)
	out := make([][]porcupine.Operation, len(keys))
	for i, k := range keys {
		out[i] = byKey[k]
	}
	return out
}

func registerModel() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition:         partitionByKey,
		Init:              func() []any { return []any{uint64(0)} },
		Step:              regStep,
		Hash:              func(s any) uint64 { return s.(uint64) },
		DescribeOperation: describeReg,
		DescribeState: func(s any) string {
			if s.(uint64) == 0 {
				return "∅"
			}
			return fmt.Sprint(s.(uint64))
		},
		DescribeOperationMetadata: func(m any) string {
			if m == nil {
				return ""
			}
			return fmt.Sprint(m)
		},
	}
	return nm.ToModel()
}

// registerHistory turns the register ops into porcupine operations: ops
// that certainly did nothing are dropped; ops of unknown outcome never
// return. Removals the state machine made on its own (in the OpLog, with a
// source other than a client remove) are added as drops that may take
// effect any time after their command time (less a second of slack for
// the wall clock against the monotonic one).
//
// The OpLog, read gapless from seq 1, also settles most unknown outcomes,
// which otherwise make the search exponential in the number of ops left
// open: an unknown write applied if and only if the OpLog has a PUT_END of
// its key with its (unique) size; unknown removes of a key applied as many
// times as the OpLog has client REMOVEs of the key beyond the acknowledged
// removes. Settling them this way only adds constraints: if the OpLog lied,
// the reads would contradict it and the check would fail. Where the counts
// leave a choice the ops stay nondeterministic. The problems returned are
// OpLog entries missing for acknowledged ops.
func registerHistory(ops []Op, entries []oplog.Entry, startUnixMs int64, dropClient int) ([]porcupine.Operation, registerStats, []string) {
	logs := map[string]*keyLog{}
	kl := func(k string) *keyLog {
		if logs[k] == nil {
			logs[k] = &keyLog{putEnd: map[uint64]uint64{}}
		}
		return logs[k]
	}
	var problems []string
	for _, e := range entries {
		if !isRegKey(e.Key) {
			continue
		}
		switch {
		case e.OpType == oplog.OpPutEnd:
			p, err := oplog.DecodePutEndPayload(e.Payload)
			if err != nil {
				problems = append(problems, fmt.Sprintf("OpLog seq %d: PUT_END payload: %v", e.SequenceID, err))
				continue
			}
			l := kl(e.Key)
			l.putEnd[p.Size] = e.SequenceID
			l.putEndSeqs = append(l.putEndSeqs, e.SequenceID)
			l.sizes = append(l.sizes, p.Size)
		case e.OpType == oplog.OpRemove && e.Source == oplog.SourceRemove:
			kl(e.Key).removes++
		}
	}
	// The acknowledged writes by size, to bound when an applied unknown
	// write took effect: before the next acknowledged write of its key
	// (whose PutStart needed the key empty) returned.
	okWriteReturn := map[string]map[uint64]int64{}
	okRemoves, unknownRemoves := map[string]int{}, map[string]int{}
	for _, op := range ops {
		if op.Workload != WRegister {
			continue
		}
		switch {
		case (op.Kind == "write" || op.Kind == "upsert") && op.Status == StatusOK:
			if okWriteReturn[op.Key] == nil {
				okWriteReturn[op.Key] = map[uint64]int64{}
			}
			okWriteReturn[op.Key][op.Value] = op.Return
			if _, ok := kl(op.Key).putEnd[op.Value]; !ok {
				problems = append(problems, fmt.Sprintf("op %d: write %s=%d acknowledged but the OpLog has no PUT_END of that size", op.ID, op.Key, op.Value))
			}
		case op.Kind == "remove" && op.Status == StatusOK:
			okRemoves[op.Key]++
		case op.Kind == "remove" && (op.Status == StatusUnknown || op.Return < 0):
			unknownRemoves[op.Key]++
		}
	}
	appliedRemoves := map[string]int{}
	for k, u := range unknownRemoves {
		appliedRemoves[k] = kl(k).removes - okRemoves[k]
		if a := appliedRemoves[k]; a < 0 || a > u {
			problems = append(problems, fmt.Sprintf("%s: the OpLog has %d client REMOVEs for %d acknowledged and %d unknown removes", k, kl(k).removes, okRemoves[k], u))
		}
	}
	for k, o := range okRemoves {
		if unknownRemoves[k] == 0 && kl(k).removes != o {
			problems = append(problems, fmt.Sprintf("%s: the OpLog has %d client REMOVEs for %d acknowledged removes", k, kl(k).removes, o))
		}
	}

	var st registerStats
	var out []porcupine.Operation
	for _, op := range ops {
		if op.Workload != WRegister {
			continue
		}
		if op.Kind == "upsert" {
			st.Upserts++
			if op.Code == errcode.ObjectReplicaBusy.String() {
				st.UpsertsBusy++
			}
		}
		in := regInput{Kind: op.Kind, Key: op.Key}
		var o regOutput
		ret := op.Return
		open := op.Status == StatusUnknown || ret < 0
		switch op.Kind {
		case "write":
			in.Value = op.Value
			switch {
			case op.Status == StatusOK:
			case open:
				st.Unknown++
				seq, applied := kl(op.Key).putEnd[op.Value]
				if !applied {
					st.SettledNo++
					continue
				}
				st.SettledYes++
				ret = boundByLaterWrite(kl(op.Key), okWriteReturn[op.Key], seq)
			default:
				continue
			}
		case "upsert":
			in.Value = op.Value
			switch {
			case op.Status == StatusOK:
			case open:
				st.Unknown++
				if seq, applied := kl(op.Key).putEnd[op.Value]; applied {
					st.SettledYes++
					ret = boundByLaterWrite(kl(op.Key), okWriteReturn[op.Key], seq)
				} else if strings.HasPrefix(op.Steps, "upsert_start=OK") {
					st.SettledYes++
					o.Lost = true // started, never ended: ended the old value within the op
				} else {
					st.Open++
					o.Unknown, ret = true, never
				}
			default:
				continue
			}
		case "read":
			if op.Status != StatusOK || op.Code == notReady {
				continue
			}
			o.Value = op.Value
		case "remove":
			if op.Code == notReady {
				continue
			}
			switch {
			case op.Status == StatusOK:
				o.Found = true
			case op.Status == StatusInfo:
			case open:
				st.Unknown++
				switch a := appliedRemoves[op.Key]; {
				case a == 0:
					st.SettledNo++
					continue
				case a == unknownRemoves[op.Key]:
					st.SettledYes++
					o.Found, ret = true, never
				default:
					st.Open++
					o.Unknown, ret = true, never
				}
			default:
				continue
			}
		}
		out = append(out, porcupine.Operation{ClientId: op.Client, Input: in, Call: op.Call, Output: o, Return: ret,
			Metadata: regMeta{ID: op.ID, Nemesis: op.Nemesis, Desc: describeReg(in, o), Steps: op.Steps}})
	}
	for _, e := range entries {
		if e.OpType != oplog.OpRemove || !isRegKey(e.Key) || !systemRemoval(e.Source) {
			continue
		}
		call := (e.TimestampMs-startUnixMs)*int64(time.Millisecond) - int64(time.Second)
		out = append(out, porcupine.Operation{ClientId: dropClient, Input: regInput{Kind: "drop", Key: e.Key, Why: string(e.Source)},
			Call: call, Output: regOutput{}, Return: never, Metadata: regMeta{ID: -int(e.SequenceID), Nemesis: "oplog", Desc: e.Key + " " + string(e.Source)}})
	}
	return out, st, problems
}

// keyLog is what the OpLog says of one register key.
type keyLog struct {
	putEnd     map[uint64]uint64 // size → seq
	putEndSeqs []uint64          // in seq order, with their sizes
	sizes      []uint64
	removes    int // REMOVE source=remove
}

// notReady is the code of a read or remove of a key being written.
var notReady = errcode.ReplicaIsNotReady.String()

// boundByLaterWrite is when an applied write of unknown outcome, whose
// PUT_END has seq, took effect at the latest: when the first acknowledged
// write or upsert of the key with a later PUT_END returned (never if none).
func boundByLaterWrite(l *keyLog, okReturn map[uint64]int64, seq uint64) int64 {
	for i, s := range l.putEndSeqs {
		if s > seq {
			if r, ok := okReturn[l.sizes[i]]; ok {
				return r
			}
		}
	}
	return never
}

// registerStats says how the unknown outcomes were settled, and how many
// upserts were refused busy.
type registerStats struct {
	Unknown    int `json:"unknown"`     // register ops whose outcome the client did not learn
	SettledYes int `json:"settled_yes"` // ... that the OpLog shows applied
	SettledNo  int `json:"settled_no"`  // ... that the OpLog shows not applied (dropped)
	Open       int `json:"open"`        // ... left nondeterministic
	Upserts    int `json:"upserts"`     // upsert ops
	// UpsertsBusy were refused OBJECT_REPLICA_BUSY: a leased object is
	// copied (issue 42), so only a replica held by another task would be.
	UpsertsBusy int `json:"upserts_busy"`
}

// regMeta identifies a porcupine operation: the history op (or, negative,
// the OpLog seq of a drop) and the fault in force when it was invoked.
type regMeta struct {
	ID      int
	Nemesis string
	Desc    string // the op as the model sees it
	Steps   string
}

func (m regMeta) String() string {
	if m.ID < 0 {
		return fmt.Sprintf("OpLog seq %d %s", -m.ID, m.Desc)
	}
	return strings.TrimSpace(fmt.Sprintf("op %d %s during %s %s", m.ID, m.Desc, m.Nemesis, m.Steps))
}

func isRegKey(k string) bool { return len(k) > 4 && k[:4] == "reg/" }

// systemRemoval: a REMOVE the state machine made by itself, not a client's
// Remove (those are in the history already).
func systemRemoval(s oplog.Source) bool {
	switch s {
	case oplog.SourceRemove, oplog.SourceDiscard, oplog.SourceUpsert:
		// discard reclaims PROCESSING puts, which were never visible; an
		// upsert's REMOVE is part of the upsert op.
		return false
	}
	return true
}

// registerResult is the outcome of the linearizability check.
type registerResult struct {
	Ops          int       `json:"ops"`
	Keys         int       `json:"keys"`
	Drops        int       `json:"oplog_drops"`
	Result       string    `json:"result"` // Ok, Illegal, Unknown (timed out)
	BadKeys      []string  `json:"bad_keys,omitempty"`
	BadOps       []regMeta `json:"bad_ops,omitempty"` // per bad key, its first op (by call) outside the longest linearizable prefix
	Visualized   string    `json:"visualization,omitempty"`
	CheckSeconds float64   `json:"check_seconds"`
}

// checkRegister runs porcupine over h; on a violation (or a timeout) it
// writes the visualisation into outDir.
func checkRegister(h []porcupine.Operation, timeout time.Duration, outDir string) (registerResult, error) {
	model := registerModel()
	r := registerResult{Ops: len(h)}
	for _, op := range h {
		if op.Input.(regInput).Kind == "drop" {
			r.Drops++
		}
	}
	parts := partitionByKey(h)
	r.Keys = len(parts)
	t0 := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, h, timeout)
	r.CheckSeconds = time.Since(t0).Seconds()
	r.Result = resultName(res)
	if res == porcupine.Ok {
		return r, nil
	}
	// A partition is bad when its longest partial linearization misses ops;
	// the first op (by call) not in it names the fault in force there.
	for i, partials := range info.PartialLinearizationsOperations() {
		if i >= len(parts) {
			break
		}
		longest := 0
		var best []porcupine.Operation
		for _, p := range partials {
			if len(p) > longest {
				longest, best = len(p), p
			}
		}
		if longest == len(parts[i]) {
			continue
		}
		key := parts[i][0].Input.(regInput).Key
		r.BadKeys = append(r.BadKeys, key)
		in := map[int]bool{}
		for _, op := range best {
			in[op.Metadata.(regMeta).ID] = true
		}
		var first regMeta
		var firstCall int64 = never
		for _, op := range parts[i] {
			if m := op.Metadata.(regMeta); !in[m.ID] && op.Call < firstCall {
				firstCall, first = op.Call, m
			}
		}
		r.BadOps = append(r.BadOps, first)
	}
	path := filepath.Join(outDir, "register.html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return r, fmt.Errorf("porcupine visualisation: %w", err)
	}
	r.Visualized = path
	return r, nil
}

func resultName(r porcupine.CheckResult) string {
	switch r {
	case porcupine.Ok:
		return "Ok"
	case porcupine.Illegal:
		return "Illegal"
	}
	return "Unknown"
}
