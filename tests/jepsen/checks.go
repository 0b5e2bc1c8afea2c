package jepsen

import (
	"fmt"
	"sort"
	"strings"

	"github.com/moonraft/moonraft/oplog"
)

// violation is one broken promise, with the ops that show it.
type violation struct {
	Workload string `json:"workload"`
	Nemesis  string `json:"nemesis"` // the fault in force at the op that shows it
	What     string `json:"what"`
	Ops      []int  `json:"ops,omitempty"`
}

func (v violation) String() string {
	return fmt.Sprintf("[%s, during %s] %s (ops %v)", v.Workload, v.Nemesis, v.What, v.Ops)
}

// oplogIndex is what the OpLog says per key.
type oplogIndex struct {
	putEnds map[string][]oplog.Entry
	removes map[string][]oplog.Entry
}

func indexOpLog(entries []oplog.Entry) oplogIndex {
	ix := oplogIndex{putEnds: map[string][]oplog.Entry{}, removes: map[string][]oplog.Entry{}}
	for _, e := range entries {
		switch e.OpType {
		case oplog.OpPutEnd:
			ix.putEnds[e.Key] = append(ix.putEnds[e.Key], e)
		case oplog.OpRemove:
			ix.removes[e.Key] = append(ix.removes[e.Key], e)
		}
	}
	return ix
}

// setResult counts what the set check saw.
type setResult struct {
	Acked          int `json:"acked"`
	Unknown        int `json:"unknown"`
	Failed         int `json:"failed"`
	Removed        int `json:"removed"`
	RemovedUnknown int `json:"removed_unknown"`
	Recovered      int `json:"unknown_recovered"` // unknown puts found at the end
	SystemRemoved  int `json:"system_removed"`    // acked, then evicted or expired (per the OpLog)
	Present        int `json:"present_at_end"`
}

// checkSet: every acknowledged put is readable at the end with its size,
// unless a remove of it succeeded (or may have) or the state machine
// removed it itself (the OpLog says so); an acknowledged remove is not
// undone; a put that failed definitely is not there and never reached the
// OpLog; every acknowledged put and remove is in the OpLog.
func checkSet(ops []Op, ix oplogIndex) (setResult, []violation) {
	type keyOps struct {
		put     *Op
		removes []*Op
		final   *Op
	}
	keys := map[string]*keyOps{}
	get := func(k string) *keyOps {
		if keys[k] == nil {
			keys[k] = &keyOps{}
		}
		return keys[k]
	}
	for i := range ops {
		op := &ops[i]
		if op.Workload != WSet {
			continue
		}
		switch op.Kind {
		case "put":
			get(op.Key).put = op
		case "remove":
			get(op.Key).removes = append(get(op.Key).removes, op)
		case "final-read":
			if op.Status == StatusOK {
				get(op.Key).final = op
			}
		}
	}
	var r setResult
	var vs []violation
	bad := func(op *Op, what string, more ...*Op) {
		ids := []int{op.ID}
		for _, m := range more {
			if m != nil {
				ids = append(ids, m.ID)
			}
		}
		vs = append(vs, violation{Workload: WSet, Nemesis: op.Nemesis, What: what, Ops: ids})
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		ko := keys[k]
		p := ko.put
		if p == nil {
			continue
		}
		if ko.final == nil {
			bad(p, fmt.Sprintf("%s: no final read succeeded", k))
			continue
		}
		present := ko.final.Value != 0
		if present {
			r.Present++
		}
		var removedOK, removedMaybe *Op
		for _, rm := range ko.removes {
			switch rm.Status {
			case StatusOK:
				removedOK = rm
				r.Removed++
				if !hasSource(ix.removes[k], oplog.SourceRemove) {
					bad(rm, fmt.Sprintf("%s: remove acknowledged but no REMOVE source=remove in the OpLog", k))
				}
			case StatusUnknown:
				removedMaybe = rm
				r.RemovedUnknown++
			}
		}
		systemRemoved := false
		for _, e := range ix.removes[k] {
			systemRemoved = systemRemoved || systemRemoval(e.Source)
		}
		switch p.Status {
		case StatusOK:
			r.Acked++
			if len(ix.putEnds[k]) == 0 {
				bad(p, fmt.Sprintf("%s: put acknowledged but no PUT_END in the OpLog", k))
			}
			switch {
			case removedOK != nil:
				if present {
					bad(p, fmt.Sprintf("%s: removal acknowledged, yet the key is back (size %d)", k, ko.final.Value), removedOK, ko.final)
				}
			case removedMaybe != nil:
			case systemRemoved:
				r.SystemRemoved++
				if present {
					bad(p, fmt.Sprintf("%s: the OpLog removes it (%s), yet it is there at the end", k, sources(ix.removes[k])), ko.final)
				}
			case !present:
				bad(p, fmt.Sprintf("%s: acknowledged put lost: not readable at the end and never removed", k), ko.final)
			case ko.final.Value != p.Value:
				bad(p, fmt.Sprintf("%s: put size %d, read %d at the end", k, p.Value, ko.final.Value), ko.final)
			}
		case StatusUnknown:
			r.Unknown++
			if present {
				r.Recovered++
				if ko.final.Value != p.Value {
					bad(p, fmt.Sprintf("%s: put size %d, read %d at the end", k, p.Value, ko.final.Value), ko.final)
				}
			}
		default:
			r.Failed++
			if present {
				bad(p, fmt.Sprintf("%s: put failed (%s) yet the key is there at the end", k, p.Code), ko.final)
			}
			if len(ix.putEnds[k]) > 0 {
				bad(p, fmt.Sprintf("%s: put failed (%s) yet the OpLog has its PUT_END (seq %d)", k, p.Code, ix.putEnds[k][0].SequenceID))
			}
		}
	}
	return r, vs
}

func hasSource(es []oplog.Entry, s oplog.Source) bool {
	for _, e := range es {
		if e.Source == s {
			return true
		}
	}
	return false
}

func sources(es []oplog.Entry) string {
	var s []string
	for _, e := range es {
		s = append(s, fmt.Sprintf("seq %d %s", e.SequenceID, e.Source))
	}
	return strings.Join(s, ", ")
}

// leaseResult counts what the lease check looked at, so a run can prove
// it was not vacuous.
type leaseResult struct {
	Leases          int `json:"leases"`            // ok reads that returned a lease
	RemovesInLease  int `json:"removes_in_lease"`  // unforced removes invoked after such a read returned and before its lease ended
	RefusedInLease  int `json:"refused_in_lease"`  // ... of which answered OBJECT_HAS_LEASE
	RemovesOK       int `json:"removes_ok"`        // unforced removes that succeeded (outside leases)
	ReadsInLease    int `json:"reads_in_lease"`    // reads of a key invoked within an earlier read's lease
	Evictions       int `json:"evictions"`         // OpLog REMOVE source=evict of lease keys
	EvictionsOfRead int `json:"evictions_of_read"` // ... of keys that had been leased to a reader
}

// checkLease: a GetReplicaList that returned lease L at time R (its return,
// wall clock; L is the leader's wall clock, the same machine's) is never
// followed, before L, by a successful unforced Remove of that key invoked
// after R and returned before L, by a read or remove invoked after R that
// finds the key gone and returned before L, or by an OpLog REMOVE of the
// key (an eviction, or any other) with a command time in (R, L).
func checkLease(ops []Op, ix oplogIndex) (leaseResult, []violation) {
	byKey := map[string][]*Op{}
	for i := range ops {
		op := &ops[i]
		if op.Workload == WLease && (op.Kind == "get" || op.Kind == "remove") {
			byKey[op.Key] = append(byKey[op.Key], op)
		}
	}
	var r leaseResult
	var vs []violation
	inLease := map[int]bool{} // ops counted as within some lease
	// A lease key is never re-created, so one broken lease shows in many
	// later ops; each kind of evidence is reported once per key.
	reported := map[string]bool{}
	report := func(k, kind string, v violation) {
		if !reported[k+"\x00"+kind] {
			reported[k+"\x00"+kind] = true
			vs = append(vs, v)
		}
	}
	for k, es := range ix.removes {
		if !strings.HasPrefix(k, "lease/") {
			continue
		}
		for _, e := range es {
			if e.Source != oplog.SourceEvict {
				continue
			}
			r.Evictions++
			for _, op := range byKey[k] {
				if op.Kind == "get" && op.Status == StatusOK && op.LeaseUntilMs > 0 {
					r.EvictionsOfRead++
					break
				}
			}
		}
	}
	for k, kops := range byKey {
		for _, rd := range kops {
			if rd.Kind != "get" || rd.Status != StatusOK || rd.LeaseUntilMs <= 0 {
				continue
			}
			R, L := rd.ReturnMs, rd.LeaseUntilMs
			r.Leases++
			for _, op := range kops {
				if op == rd || op.CallMs <= R || op.CallMs >= L {
					continue
				}
				switch op.Kind {
				case "remove":
					if !inLease[op.ID] {
						inLease[op.ID] = true
						r.RemovesInLease++
						if op.Code == "OBJECT_HAS_LEASE" {
							r.RefusedInLease++
						}
					}
					if op.Status == StatusOK && op.ReturnMs < L {
						report(k, "removed", violation{Workload: WLease, Nemesis: op.Nemesis, Ops: []int{rd.ID, op.ID},
							What: fmt.Sprintf("%s: leased until %d by a read returned at %d, yet an unforced remove invoked at %d succeeded at %d", k, L, R, op.CallMs, op.ReturnMs)})
					}
					if op.Code == "OBJECT_NOT_FOUND" && op.ReturnMs < L {
						report(k, "gone", violation{Workload: WLease, Nemesis: op.Nemesis, Ops: []int{rd.ID, op.ID},
							What: fmt.Sprintf("%s: leased until %d by a read returned at %d, yet a remove invoked at %d found it gone at %d", k, L, R, op.CallMs, op.ReturnMs)})
					}
				case "get":
					if op.Status != StatusOK {
						continue
					}
					if !inLease[op.ID] {
						inLease[op.ID] = true
						r.ReadsInLease++
					}
					if op.Value == 0 && op.ReturnMs < L {
						report(k, "gone", violation{Workload: WLease, Nemesis: op.Nemesis, Ops: []int{rd.ID, op.ID},
							What: fmt.Sprintf("%s: leased until %d by a read returned at %d, yet a read invoked at %d found it gone (%s) at %d", k, L, R, op.CallMs, op.Code, op.ReturnMs)})
					}
				}
			}
			for _, e := range ix.removes[k] {
				if e.TimestampMs > R && e.TimestampMs < L {
					report(k, "oplog", violation{Workload: WLease, Nemesis: rd.Nemesis, Ops: []int{rd.ID},
						What: fmt.Sprintf("%s: leased until %d by a read returned at %d, yet the OpLog removes it (seq %d, source %s) at %d", k, L, R, e.SequenceID, e.Source, e.TimestampMs)})
				}
			}
		}
		for _, op := range kops {
			if op.Kind == "remove" && op.Status == StatusOK {
				r.RemovesOK++
			}
		}
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].Ops[0] < vs[j].Ops[0] })
	return r, vs
}
