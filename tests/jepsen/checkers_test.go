package jepsen

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/oplog"
)

// The checkers must catch what they claim to catch: each case is a small
// history with a known verdict.

func regOp(id, client int, kind string, value uint64, status string, call, ret int64) Op {
	return Op{ID: id, Workload: WRegister, Client: client, Kind: kind, Key: "reg/k00", Value: value, Status: status, Call: call, Return: ret, Nemesis: "none"}
}

func putEnd(seq uint64, key string, size uint64) oplog.Entry {
	return oplog.NewEntry(seq, 0, oplog.OpPutEnd, key, oplog.EncodePutEndPayload(oplog.PutEndPayload{Size: size}), seq, oplog.SourceNone)
}

func removeEntry(seq uint64, key string, src oplog.Source, tsMs int64) oplog.Entry {
	return oplog.NewEntry(seq, tsMs, oplog.OpRemove, key, "", seq, src)
}

func TestRegisterModel(t *testing.T) {
	const k = "reg/k00"
	cases := []struct {
		name     string
		ops      []Op
		es       []oplog.Entry
		ok       bool
		problems int
	}{
		{"write then read", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			regOp(1, 1, "read", 5, StatusOK, 20, 30),
		}, []oplog.Entry{putEnd(1, k, 5)}, true, 0},
		{"acknowledged write missing from the OpLog", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			regOp(1, 1, "read", 5, StatusOK, 20, 30),
		}, nil, true, 1},
		{"stale read after an acknowledged write", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			regOp(1, 1, "read", 0, StatusOK, 20, 30),
		}, []oplog.Entry{putEnd(1, k, 5)}, false, 0},
		{"read of a value never written", []Op{
			regOp(0, 1, "read", 7, StatusOK, 20, 30),
		}, nil, false, 0},
		{"concurrent read may see either", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 100),
			regOp(1, 1, "read", 0, StatusOK, 10, 20),
			regOp(2, 2, "read", 5, StatusOK, 30, 40),
		}, []oplog.Entry{putEnd(1, k, 5)}, true, 0},
		{"reads cannot go back in time", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 100),
			regOp(1, 2, "read", 5, StatusOK, 30, 40),
			regOp(2, 1, "read", 0, StatusOK, 50, 60),
		}, []oplog.Entry{putEnd(1, k, 5)}, false, 0},
		{"unknown write the OpLog shows applied may apply later", []Op{
			regOp(0, 0, "write", 5, StatusUnknown, 0, 10),
			regOp(1, 1, "read", 0, StatusOK, 20, 30),
			regOp(2, 1, "read", 5, StatusOK, 40, 50),
		}, []oplog.Entry{putEnd(1, k, 5)}, true, 0},
		{"unknown write the OpLog does not show never applied", []Op{
			regOp(0, 0, "write", 5, StatusUnknown, 0, 10),
			regOp(1, 1, "read", 0, StatusOK, 20, 30),
		}, nil, true, 0},
		{"unknown write the OpLog does not show, yet read", []Op{
			regOp(0, 0, "write", 5, StatusUnknown, 0, 10),
			regOp(1, 1, "read", 5, StatusOK, 20, 30),
		}, nil, false, 0},
		{"applied unknown write takes effect before the next acknowledged write", []Op{
			regOp(0, 0, "write", 5, StatusUnknown, 0, 10),
			regOp(1, 1, "remove", 0, StatusOK, 20, 30),
			regOp(2, 1, "write", 6, StatusOK, 40, 50),
			regOp(3, 1, "read", 5, StatusOK, 60, 70),
		}, []oplog.Entry{putEnd(1, k, 5), removeEntry(2, k, oplog.SourceRemove, 0), putEnd(3, k, 6)}, false, 0},
		{"unknown write cannot apply twice", []Op{
			regOp(0, 0, "write", 5, StatusUnknown, 0, 10),
			regOp(1, 1, "read", 5, StatusOK, 20, 30),
			regOp(2, 1, "remove", 0, StatusOK, 40, 50),
			regOp(3, 1, "read", 5, StatusOK, 60, 70),
		}, []oplog.Entry{putEnd(1, k, 5), removeEntry(2, k, oplog.SourceRemove, 0)}, false, 0},
		{"failed write is dropped", []Op{
			regOp(0, 0, "write", 5, StatusFail, 0, 10),
			regOp(1, 1, "read", 0, StatusOK, 20, 30),
		}, nil, true, 0},
		{"write over a visible object", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			regOp(1, 0, "write", 6, StatusOK, 20, 30),
		}, []oplog.Entry{putEnd(1, k, 5), putEnd(2, k, 6)}, false, 0},
		{"remove found nothing on a visible object", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			regOp(1, 1, "remove", 0, StatusInfo, 20, 30),
		}, []oplog.Entry{putEnd(1, k, 5)}, false, 0},
		{"acknowledged remove undone", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			regOp(1, 1, "remove", 0, StatusOK, 20, 30),
			regOp(2, 1, "read", 5, StatusOK, 40, 50),
		}, []oplog.Entry{putEnd(1, k, 5), removeEntry(2, k, oplog.SourceRemove, 0)}, false, 0},
		{"unknown removes, one applied per the OpLog, may go either way", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			regOp(1, 1, "remove", 0, StatusUnknown, 20, 30),
			regOp(2, 2, "remove", 0, StatusUnknown, 25, 35),
			regOp(3, 1, "read", 0, StatusOK, 40, 50),
		}, []oplog.Entry{putEnd(1, k, 5), removeEntry(2, k, oplog.SourceRemove, 0)}, true, 0},
		{"unknown remove the OpLog does not show never applied", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			regOp(1, 1, "remove", 0, StatusUnknown, 20, 30),
			regOp(3, 1, "read", 0, StatusOK, 40, 50),
		}, []oplog.Entry{putEnd(1, k, 5)}, false, 0},
		{"eviction in the OpLog explains a disappearance", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10_000_000_000),
			regOp(1, 1, "read", 0, StatusOK, 30_000_000_000, 31_000_000_000),
		}, []oplog.Entry{putEnd(1, k, 5), removeEntry(3, k, oplog.SourceEvict, 20_000)}, true, 0},
		{"an eviction cannot act before its command time", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10_000_000_000),
			regOp(1, 1, "read", 0, StatusOK, 12_000_000_000, 13_000_000_000),
		}, []oplog.Entry{putEnd(1, k, 5), removeEntry(3, k, oplog.SourceEvict, 20_000)}, false, 0},
	}
	upsert := func(id int, value uint64, status, steps string, call, ret int64) Op {
		o := regOp(id, id, "upsert", value, status, call, ret)
		o.Steps = steps
		return o
	}
	notReadyRead := regOp(3, 3, "read", 0, StatusOK, 22, 28)
	notReadyRead.Code = "REPLICA_IS_NOT_READY"
	cases = append(cases, []struct {
		name     string
		ops      []Op
		es       []oplog.Entry
		ok       bool
		problems int
	}{
		{"an upsert overwrites", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			upsert(1, 6, StatusOK, "upsert_start=OK upsert_end=OK", 20, 30),
			regOp(2, 2, "read", 6, StatusOK, 40, 50),
		}, []oplog.Entry{putEnd(1, k, 5), putEnd(2, k, 6)}, true, 0},
		{"the old value after the upsert ended", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			upsert(1, 6, StatusOK, "upsert_start=OK upsert_end=OK", 20, 30),
			regOp(2, 2, "read", 5, StatusOK, 40, 50),
		}, []oplog.Entry{putEnd(1, k, 5), putEnd(2, k, 6)}, false, 0},
		{"reads of a key being written say nothing", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			upsert(1, 6, StatusOK, "upsert_start=OK upsert_end=OK", 20, 30),
			notReadyRead,
			regOp(2, 2, "read", 6, StatusOK, 40, 50),
		}, []oplog.Entry{putEnd(1, k, 5), putEnd(2, k, 6)}, true, 0},
		{"an upsert that started and did not end ends the old value", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			upsert(1, 6, StatusUnknown, "upsert_start=OK upsert_end=OUTCOME_UNKNOWN", 20, 30),
			regOp(2, 2, "read", 5, StatusOK, 40, 50),
		}, []oplog.Entry{putEnd(1, k, 5)}, false, 0},
		{"and a put may follow it", []Op{
			regOp(0, 0, "write", 5, StatusOK, 0, 10),
			upsert(1, 6, StatusUnknown, "upsert_start=OK upsert_end=ILLEGAL_CLIENT", 20, 30),
			regOp(2, 2, "write", 7, StatusOK, 40, 50),
			regOp(3, 3, "read", 7, StatusOK, 60, 70),
		}, []oplog.Entry{putEnd(1, k, 5), putEnd(2, k, 7)}, true, 0},
		{"an acknowledged upsert missing from the OpLog", []Op{
			upsert(1, 6, StatusOK, "upsert_start=OK upsert_end=OK", 20, 30),
		}, nil, true, 1},
	}...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, _, problems := registerHistory(tc.ops, tc.es, 0, 9)
			assert.Len(t, problems, tc.problems, "%v", problems)
			r, err := checkRegister(h, 0, t.TempDir())
			require.NoError(t, err)
			if tc.ok {
				assert.Equal(t, "Ok", r.Result)
			} else {
				assert.Equal(t, "Illegal", r.Result)
				assert.Equal(t, []string{k}, r.BadKeys)
				assert.FileExists(t, r.Visualized)
			}
		})
	}
}

func leaseOp(id int, kind, key string, status, code string, callMs, retMs, leaseMs int64, value uint64) Op {
	return Op{ID: id, Workload: WLease, Kind: kind, Key: key, Status: status, Code: code, CallMs: callMs, ReturnMs: retMs, LeaseUntilMs: leaseMs, Value: value, Nemesis: "none"}
}

func TestLeaseChecker(t *testing.T) {
	read := leaseOp(0, "get", "lease/a", StatusOK, "", 1000, 1010, 6000, 4096)
	cases := []struct {
		name  string
		ops   []Op
		es    []oplog.Entry
		viols int
	}{
		{"remove refused within the lease", []Op{read, leaseOp(1, "remove", "lease/a", StatusInfo, "OBJECT_HAS_LEASE", 2000, 2010, 0, 0)}, nil, 0},
		{"remove succeeded within the lease", []Op{read, leaseOp(1, "remove", "lease/a", StatusOK, "", 2000, 2010, 0, 0)}, nil, 1},
		{"remove succeeded after the lease", []Op{read, leaseOp(1, "remove", "lease/a", StatusOK, "", 6001, 6010, 0, 0)}, nil, 0},
		{"remove concurrent with the read", []Op{read, leaseOp(1, "remove", "lease/a", StatusOK, "", 1005, 1020, 0, 0)}, nil, 0},
		{"remove finds the key gone within the lease", []Op{read, leaseOp(1, "remove", "lease/a", StatusInfo, "OBJECT_NOT_FOUND", 2000, 2010, 0, 0)}, nil, 1},
		{"key gone within the lease", []Op{read, leaseOp(1, "get", "lease/a", StatusOK, "OBJECT_NOT_FOUND", 3000, 3010, 0, 0)}, nil, 1},
		{"evicted within the lease", []Op{read}, []oplog.Entry{{SequenceID: 9, OpType: oplog.OpRemove, Key: "lease/a", Source: oplog.SourceEvict, TimestampMs: 5999}}, 1},
		{"evicted after the lease", []Op{read}, []oplog.Entry{{SequenceID: 9, OpType: oplog.OpRemove, Key: "lease/a", Source: oplog.SourceEvict, TimestampMs: 6000}}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, vs := checkLease(tc.ops, indexOpLog(tc.es))
			assert.Len(t, vs, tc.viols, "%v", vs)
		})
	}
}

func setOp(id int, kind, key, status string, value uint64) Op {
	return Op{ID: id, Workload: WSet, Kind: kind, Key: key, Status: status, Value: value, Nemesis: "none"}
}

func TestSetChecker(t *testing.T) {
	putEnd := oplog.Entry{SequenceID: 1, OpType: oplog.OpPutEnd, Key: "set/a"}
	removed := oplog.Entry{SequenceID: 2, OpType: oplog.OpRemove, Key: "set/a", Source: oplog.SourceRemove}
	evicted := oplog.Entry{SequenceID: 2, OpType: oplog.OpRemove, Key: "set/a", Source: oplog.SourceEvict}
	cases := []struct {
		name  string
		ops   []Op
		es    []oplog.Entry
		viols int
	}{
		{"acknowledged and present", []Op{setOp(0, "put", "set/a", StatusOK, 7), setOp(1, "final-read", "set/a", StatusOK, 7)}, []oplog.Entry{putEnd}, 0},
		{"acknowledged and lost", []Op{setOp(0, "put", "set/a", StatusOK, 7), setOp(1, "final-read", "set/a", StatusOK, 0)}, []oplog.Entry{putEnd}, 1},
		{"acknowledged but not in the OpLog", []Op{setOp(0, "put", "set/a", StatusOK, 7), setOp(1, "final-read", "set/a", StatusOK, 7)}, nil, 1},
		{"removed and gone", []Op{setOp(0, "put", "set/a", StatusOK, 7), setOp(1, "remove", "set/a", StatusOK, 0), setOp(2, "final-read", "set/a", StatusOK, 0)}, []oplog.Entry{putEnd, removed}, 0},
		{"removed and back", []Op{setOp(0, "put", "set/a", StatusOK, 7), setOp(1, "remove", "set/a", StatusOK, 0), setOp(2, "final-read", "set/a", StatusOK, 7)}, []oplog.Entry{putEnd, removed}, 1},
		{"evicted per the OpLog", []Op{setOp(0, "put", "set/a", StatusOK, 7), setOp(1, "final-read", "set/a", StatusOK, 0)}, []oplog.Entry{putEnd, evicted}, 0},
		{"failed yet present", []Op{setOp(0, "put", "set/a", StatusFail, 7), setOp(1, "final-read", "set/a", StatusOK, 7)}, nil, 1},
		{"failed yet in the OpLog", []Op{setOp(0, "put", "set/a", StatusFail, 7), setOp(1, "final-read", "set/a", StatusOK, 0)}, []oplog.Entry{putEnd}, 1},
		{"unknown either way", []Op{setOp(0, "put", "set/a", StatusUnknown, 7), setOp(1, "final-read", "set/a", StatusOK, 0)}, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, vs := checkSet(tc.ops, indexOpLog(tc.es))
			assert.Len(t, vs, tc.viols, "%v", vs)
		})
	}
}

func TestScheduleFromSeed(t *testing.T) {
	a := drawSchedule(7, 10*60e9, AllNemeses, true, 5e9, 15e9, 3e9, 8e9, 3)
	b := drawSchedule(7, 10*60e9, AllNemeses, true, 5e9, 15e9, 3e9, 8e9, 3)
	require.Equal(t, a, b, "the same seed gives the same schedule")
	seen := map[string]int{}
	for i, e := range a {
		seen[e.Kind]++
		if i > 0 {
			assert.GreaterOrEqual(t, e.At, a[i-1].At+a[i-1].Dur, "events do not overlap")
		}
	}
	for _, k := range AllNemeses {
		assert.Positive(t, seen[k], "%s scheduled in a 10 minute run", k)
	}
}

// TestNemesesFrom reads make jepsen's NEMESES and refuses a name that is
// no nemesis.
func TestNemesesFrom(t *testing.T) {
	kinds, err := nemesesFrom("pause-leader,restart-leader")
	require.NoError(t, err)
	require.Equal(t, []string{PauseLeader, RestartLeader}, kinds)
	_, err = nemesesFrom("pause-leader,pause-follower")
	require.ErrorContains(t, err, `"pause-follower" is no nemesis`)
}

// TestReportsDataRace finds the race detector's report in a node's log,
// and nothing in a clean log or a missing one.
func TestReportsDataRace(t *testing.T) {
	dir := t.TempDir()
	raced, clean := filepath.Join(dir, "raced.log"), filepath.Join(dir, "clean.log")
	require.NoError(t, os.WriteFile(raced, []byte("[INFO] serving\n==================\nWARNING: DATA RACE\nWrite at 0x00c0000d23f0 by goroutine 10:\n"), 0o644))
	require.NoError(t, os.WriteFile(clean, []byte("[INFO] serving\n"), 0o644))
	assert.True(t, reportsDataRace(raced))
	assert.False(t, reportsDataRace(clean))
	assert.False(t, reportsDataRace(filepath.Join(dir, "missing.log")))
}
