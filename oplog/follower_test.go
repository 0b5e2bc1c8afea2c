package oplog_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moonraft/moonraft/errcode"
	"github.com/moonraft/moonraft/oplog"
)

// memFeed is an in-memory oplog.Feed. The store (what ReadSince sees) and
// the watch (what the test pushes) are independent, so a test can deliver
// entries out of order, twice, never, or corrupted, whatever the store has.
type memFeed struct {
	mu        sync.Mutex
	recs      map[uint64][]byte
	renewals  []oplog.Renewal
	rev       int64
	reads     []readCall // every ReadSince call
	failReads int        // the next failReads ReadSince calls fail
	watchRevs []int64    // afterRev of every Watch call
	dropWatch int        // the next dropWatch watches end at once, with no event
	events    chan oplog.WatchEvent
}

type readCall struct {
	after uint64
	limit int
}

func newMemFeed() *memFeed {
	return &memFeed{recs: map[uint64][]byte{}, events: make(chan oplog.WatchEvent)}
}

// put stores records; each put is one etcd revision.
func (m *memFeed) put(rs ...oplog.Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rs {
		m.recs[r.Seq] = r.Value
	}
	m.rev++
}

func (m *memFeed) ReadSince(_ context.Context, after uint64, limit int) ([]oplog.Record, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads = append(m.reads, readCall{after, limit})
	if m.failReads > 0 {
		m.failReads--
		return nil, 0, errors.New("etcd unreachable")
	}
	var seqs []uint64
	for s := range m.recs {
		if s > after {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	var out []oplog.Record
	for _, s := range seqs[:min(len(seqs), limit)] {
		out = append(out, oplog.Record{Seq: s, Value: m.recs[s]})
	}
	return out, m.rev, nil
}

func (m *memFeed) ReadRenewals(context.Context) ([]oplog.Renewal, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.renewals), m.rev, nil
}

func (m *memFeed) Watch(ctx context.Context, afterRev int64) <-chan oplog.WatchEvent {
	m.mu.Lock()
	m.watchRevs = append(m.watchRevs, afterRev)
	drop := m.dropWatch > 0
	m.dropWatch--
	m.mu.Unlock()
	out := make(chan oplog.WatchEvent)
	if drop {
		close(out)
		return out
	}
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-m.events:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// push delivers one watch event; it blocks until a watch takes it, so the
// first push also waits for the follower's catch-up to end.
func (m *memFeed) push(t testing.TB, ev oplog.WatchEvent) {
	t.Helper()
	select {
	case m.events <- ev:
	case <-time.After(5 * time.Second):
		t.Fatal("no watch took the event")
	}
}

func (m *memFeed) readCalls() []readCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.reads)
}

func (m *memFeed) watches() []int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.watchRevs)
}

// history is a valid OpLog: history[i] has seq i+1.
type history []oplog.Entry

// newHistory generates n entries over a few keys: PUT_END of absent keys,
// REMOVE of present ones, and PUT_REVOKE / REMOVE of keys the follower never
// sees complete, with key sequences continuing across removals.
func newHistory(n int, seed uint64) history {
	rng := rand.New(rand.NewPCG(seed, 1))
	keys := []string{"m/a", "m/b", "m/c", "n/d", "e"}
	live := map[string]bool{}
	ks := map[string]uint64{}
	h := make(history, 0, n)
	for seq := uint64(1); seq <= uint64(n); seq++ {
		k := keys[rng.IntN(len(keys))]
		ks[k]++
		ts := int64(1_000 + seq)
		switch {
		case live[k]:
			h = append(h, oplog.NewEntry(seq, ts, oplog.OpRemove, k, "", ks[k], oplog.SourceRemove))
			live[k] = false
		case rng.IntN(4) == 0:
			h = append(h, oplog.NewEntry(seq, ts, oplog.OpPutRevoke, k, "", ks[k], oplog.SourceNone))
		default:
			h = append(h, putEnd(seq, ts, k, ks[k]))
			live[k] = true
		}
	}
	return h
}

func putEnd(seq uint64, ts int64, key string, keySeq uint64) oplog.Entry {
	size := seq * 100
	p := oplog.PutEndPayload{Size: size, Replicas: []oplog.ReplicaDesc{{
		Status:  oplog.ReplicaComplete,
		Buffers: []oplog.BufferDesc{{SegmentID: "s1", SegmentName: "seg-1", Address: 4096 * seq, Size: size}},
	}}}
	return oplog.NewEntry(seq, ts, oplog.OpPutEnd, key, oplog.EncodePutEndPayload(p), keySeq, oplog.SourceNone)
}

func rec(e oplog.Entry) oplog.Record { return oplog.Record{Seq: e.SequenceID, Value: e.Encode()} }

// recs returns the records of seqs from..to.
func (h history) recs(from, to uint64) []oplog.Record {
	var rs []oplog.Record
	for s := from; s <= to; s++ {
		rs = append(rs, rec(h[s-1]))
	}
	return rs
}

func (h history) event(seqs ...uint64) oplog.WatchEvent {
	var ev oplog.WatchEvent
	for _, s := range seqs {
		ev.Records = append(ev.Records, rec(h[s-1]))
	}
	return ev
}

type modelObject struct {
	size, keySeq uint64
	payload      oplog.PutEndPayload
}

// model applies the first n entries the simple way.
func (h history) model(t testing.TB, n uint64) map[string]modelObject {
	m := map[string]modelObject{}
	for _, e := range h[:n] {
		if e.OpType != oplog.OpPutEnd {
			delete(m, e.Key)
			continue
		}
		p, err := oplog.DecodePutEndPayload(e.Payload)
		require.NoError(t, err)
		m[e.Key] = modelObject{p.Size, e.KeySequenceID, p}
	}
	return m
}

func digestOf(m map[string]modelObject) [32]byte {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	hs := oplog.NewObjectSetHasher()
	for _, k := range keys {
		hs.Add(k, m[k].size, m[k].keySeq)
	}
	return hs.Sum()
}

type followHarness struct {
	t      testing.TB
	feed   *memFeed
	f      *oplog.Follower
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

func newFollowHarness(t testing.TB, feed *memFeed, cfg oplog.FollowerConfig) *followHarness {
	cfg.Feed = feed
	return &followHarness{t: t, feed: feed, f: oplog.NewFollower(cfg), done: make(chan struct{})}
}

func (h *followHarness) run() *followHarness {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		h.err = h.f.Run(ctx)
	}()
	h.t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(5 * time.Second):
			h.t.Error("Run did not return after cancel")
		}
	})
	return h
}

// wait returns Run's result.
func (h *followHarness) wait() error {
	h.t.Helper()
	select {
	case <-h.done:
		return h.err
	case <-time.After(5 * time.Second):
		h.t.Fatal("Run did not return")
		return nil
	}
}

func (h *followHarness) waitFor(seq uint64) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(h.t, h.f.WaitFor(ctx, seq), "stats %+v", h.f.Stats())
}

func TestFollowerCatchUpThenWatch(t *testing.T) {
	hist := newHistory(30, 1)
	feed := newMemFeed()
	feed.put(hist.recs(1, 25)...)
	h := newFollowHarness(t, feed, oplog.FollowerConfig{BatchLimit: 10, GapTimeout: time.Minute})

	// Readers run alongside, for the race detector.
	stop := make(chan struct{})
	var readers sync.WaitGroup
	readers.Add(1)
	go func() {
		defer readers.Done()
		for {
			select {
			case <-stop:
				return
			default:
				h.f.Get("m/a")
				h.f.Stats()
				h.f.ObjectSetDigest()
				h.f.Len()
			}
		}
	}()
	defer func() { close(stop); readers.Wait() }()

	h.run()
	h.waitFor(25)
	assert.Equal(t, []readCall{{0, 10}, {10, 10}, {20, 10}}, feed.readCalls(), "three pages")
	feed.put(hist.recs(26, 30)...)
	feed.push(t, hist.event(26, 27, 28, 29, 30))
	h.waitFor(30)

	assert.Equal(t, []int64{1}, feed.watches(), "the watch starts at the revision of the last page")
	want := hist.model(t, 30)
	assert.Equal(t, uint64(30), h.f.AppliedSeq())
	assert.Equal(t, digestOf(want), h.f.ObjectSetDigest())
	assert.Equal(t, len(want), h.f.Len())
	for k, o := range want {
		got, ok := h.f.Get(k)
		require.True(t, ok, k)
		assert.Equal(t, oplog.ObjectState{Size: o.size, KeySeq: o.keySeq, Payload: o.payload}, got)
	}
	s := h.f.Stats()
	assert.Equal(t, oplog.FollowerStats{AppliedSeq: 30, Objects: len(want)}, s)
}

func TestFollowerOrdering(t *testing.T) {
	tests := []struct {
		name       string
		gapTimeout time.Duration
		events     [][]uint64 // watch events after the catch-up of 1..2
		store      []uint64   // also in the store, for gap re-reads
		want       uint64
		check      func(t *testing.T, s oplog.FollowerStats, reads []readCall)
	}{
		{
			name: "in order", events: [][]uint64{{3}, {4}, {5}}, want: 5,
			check: func(t *testing.T, s oplog.FollowerStats, _ []readCall) {
				assert.Zero(t, s.Reordered)
				assert.Zero(t, s.Duplicates)
			},
		},
		{
			name: "reordered across events", events: [][]uint64{{5}, {3}, {4}}, want: 5,
			check: func(t *testing.T, s oplog.FollowerStats, _ []readCall) {
				assert.Equal(t, uint64(1), s.Reordered)
				assert.Zero(t, s.Buffered)
				assert.Zero(t, s.GapRereads)
			},
		},
		{
			name: "reversed in one event", events: [][]uint64{{6, 5, 4, 3}}, want: 6,
			check: func(t *testing.T, s oplog.FollowerStats, _ []readCall) {
				assert.Equal(t, uint64(3), s.Reordered)
			},
		},
		{
			name: "duplicates", events: [][]uint64{{3}, {3}, {2, 1}, {5}, {5}, {4, 4}}, want: 5,
			check: func(t *testing.T, s oplog.FollowerStats, _ []readCall) {
				// 3 again, 2, 1, 5 while buffered, 4 again.
				assert.Equal(t, uint64(5), s.Duplicates)
				assert.Equal(t, uint64(1), s.Reordered)
			},
		},
		{
			name: "gap re-read from the feed", gapTimeout: 20 * time.Millisecond,
			events: [][]uint64{{3}, {4, 5, 6}, {8}, {9}}, store: []uint64{7}, want: 9,
			check: func(t *testing.T, s oplog.FollowerStats, reads []readCall) {
				assert.GreaterOrEqual(t, s.GapRereads, uint64(1))
				assert.Contains(t, reads, readCall{6, 1000}, "the gap is read from applied")
				assert.Zero(t, s.Buffered)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hist := newHistory(10, 2)
			feed := newMemFeed()
			feed.put(hist.recs(1, 2)...)
			h := newFollowHarness(t, feed, oplog.FollowerConfig{GapTimeout: cmpOr(tt.gapTimeout, time.Minute)}).run()
			for i, ev := range tt.events {
				feed.push(t, hist.event(ev...))
				if i == 0 {
					for _, s := range tt.store {
						feed.put(rec(hist[s-1]))
					}
				}
			}
			h.waitFor(tt.want)
			assert.Equal(t, tt.want, h.f.AppliedSeq())
			assert.Equal(t, digestOf(hist.model(t, tt.want)), h.f.ObjectSetDigest())
			tt.check(t, h.f.Stats(), feed.readCalls())
		})
	}
}

func cmpOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func TestFollowerGapMissingFromFeedWaits(t *testing.T) {
	hist := newHistory(10, 3)
	feed := newMemFeed()
	feed.put(hist.recs(1, 2)...)
	h := newFollowHarness(t, feed, oplog.FollowerConfig{GapTimeout: 20 * time.Millisecond}).run()
	feed.push(t, hist.event(3))
	feed.push(t, hist.event(5, 6))
	require.Eventually(t, func() bool { return h.f.Stats().GapRereads >= 2 }, 5*time.Second, 5*time.Millisecond)

	s := h.f.Stats()
	assert.Equal(t, uint64(3), s.AppliedSeq, "nothing after the gap is applied")
	assert.Equal(t, 2, s.Buffered)
	assert.Equal(t, uint64(4), s.WaitingFor)
	assert.Contains(t, s.LastError, "entry 4 is missing")
	assert.Equal(t, digestOf(hist.model(t, 3)), h.f.ObjectSetDigest())

	// When it finally comes, the buffered entries follow it.
	feed.push(t, hist.event(4))
	h.waitFor(6)
	s = h.f.Stats()
	assert.Zero(t, s.Buffered)
	assert.Zero(t, s.WaitingFor)
	assert.Equal(t, digestOf(hist.model(t, 6)), h.f.ObjectSetDigest())
}

func TestFollowerBufferOverflowRereadsAtOnce(t *testing.T) {
	hist := newHistory(10, 4)
	feed := newMemFeed()
	feed.put(hist.recs(1, 1)...)
	h := newFollowHarness(t, feed, oplog.FollowerConfig{GapTimeout: time.Minute, MaxBuffered: 2}).run()
	feed.push(t, hist.event(3))
	feed.put(hist.recs(2, 10)...)
	feed.push(t, hist.event(4))
	feed.push(t, hist.event(5)) // the buffer is full: re-read now, not in a minute
	h.waitFor(10)
	s := h.f.Stats()
	assert.Equal(t, uint64(1), s.Overflowed)
	assert.Equal(t, uint64(1), s.GapRereads)
	assert.Equal(t, digestOf(hist.model(t, 10)), h.f.ObjectSetDigest())
}

// corrupt returns e's record with its checksum off by one.
func corrupt(e oplog.Entry) oplog.Record {
	e.Checksum++
	return rec(e)
}

// torn returns e's record cut in half, as a torn read would.
func torn(e oplog.Entry) oplog.Record {
	r := rec(e)
	r.Value = r.Value[:len(r.Value)/2]
	return r
}

func TestFollowerBadEntry(t *testing.T) {
	hist := newHistory(10, 5)
	wrongSeq := rec(hist[5]) // entry 6 stored under seq 5
	wrongSeq.Seq = 5
	tests := []struct {
		name     string
		stored   oplog.Record // entry 5 as the store has it
		watched  oplog.Record // entry 5 as the watch delivers it
		code     errcode.Code // OK: the re-read value is applied
		contains string
	}{
		{"checksum edited everywhere", corrupt(hist[4]), corrupt(hist[4]), errcode.ChecksumMismatch, "entry 5 is bad (so is the value re-read from the feed)"},
		{"torn everywhere", torn(hist[4]), torn(hist[4]), errcode.InvalidParams, "entry 5 is bad"},
		{"wrong seq everywhere", wrongSeq, wrongSeq, errcode.InvalidParams, "stored under seq 5 has sequence_id 6"},
		{"corrupt watch value, good in the feed", rec(hist[4]), corrupt(hist[4]), errcode.OK, ""},
		{"torn watch value, good in the feed", rec(hist[4]), torn(hist[4]), errcode.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			feed := newMemFeed()
			feed.put(hist.recs(1, 4)...)
			h := newFollowHarness(t, feed, oplog.FollowerConfig{GapTimeout: time.Minute}).run()
			feed.push(t, oplog.WatchEvent{Records: []oplog.Record{rec(hist[5])}}) // 6, buffered
			feed.put(tt.stored)
			feed.push(t, oplog.WatchEvent{Records: []oplog.Record{tt.watched}})
			if tt.code == errcode.OK {
				h.waitFor(6)
				assert.Equal(t, uint64(1), h.f.Stats().EntryResyncs)
				assert.Equal(t, digestOf(hist.model(t, 6)), h.f.ObjectSetDigest())
				return
			}
			err := h.wait()
			require.Error(t, err)
			assert.Equal(t, tt.code, errcode.Of(err), err.Error())
			assert.ErrorContains(t, err, tt.contains)
			assert.ErrorContains(t, err, "applied seq is 4")
			assert.Equal(t, uint64(4), h.f.AppliedSeq(), "nothing from the bad entry on")
			assert.Equal(t, digestOf(hist.model(t, 4)), h.f.ObjectSetDigest())
			assert.Contains(t, feed.readCalls(), readCall{4, 1}, "one re-read of the bad entry")
			s := h.f.Stats()
			assert.Zero(t, s.EntryResyncs)
			assert.Equal(t, err.Error(), s.LastError)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(h.f.WaitFor(ctx, 5)), "WaitFor gives up once Run has stopped")
		})
	}
}

func TestFollowerBadEntryInCatchUp(t *testing.T) {
	hist := newHistory(6, 6)
	feed := newMemFeed()
	feed.put(hist.recs(1, 6)...)
	feed.put(corrupt(hist[2]))
	h := newFollowHarness(t, feed, oplog.FollowerConfig{}).run()
	err := h.wait()
	assert.Equal(t, errcode.ChecksumMismatch, errcode.Of(err))
	assert.ErrorContains(t, err, "entry 3 is bad")
	assert.Equal(t, uint64(2), h.f.AppliedSeq())
}

func TestFollowerKeySequence(t *testing.T) {
	const hour = 3_600_000
	tests := []struct {
		name    string
		entries []oplog.Entry
		err     string // "" if all apply
	}{
		{"increasing across a removal", []oplog.Entry{
			putEnd(1, 10, "k", 1),
			oplog.NewEntry(2, 20, oplog.OpRemove, "k", "", 2, oplog.SourceEvict),
			putEnd(3, 30, "k", 3),
		}, ""},
		{"regression on a live key", []oplog.Entry{
			putEnd(1, 10, "k", 4),
			putEnd(2, 20, "k", 4),
		}, `key "k": key_sequence_id 4 after 4`},
		{"regression after a removal", []oplog.Entry{
			putEnd(1, 10, "k", 1),
			oplog.NewEntry(2, 20, oplog.OpRemove, "k", "", 2, oplog.SourceRemove),
			putEnd(3, 30, "k", 1),
		}, `key "k": key_sequence_id 1 after 2`},
		{"restart within the hour", []oplog.Entry{
			oplog.NewEntry(1, 10, oplog.OpRemove, "k", "", 7, oplog.SourceRemove),
			putEnd(2, 10+hour-1, "k", 1),
		}, `key "k": key_sequence_id 1 after 7`},
		{"restart after the hour", []oplog.Entry{
			oplog.NewEntry(1, 10, oplog.OpRemove, "k", "", 7, oplog.SourceRemove),
			putEnd(2, 10+hour, "k", 1),
		}, ""},
		{"a later removal is remembered anew", []oplog.Entry{
			oplog.NewEntry(1, 10, oplog.OpRemove, "k", "", 7, oplog.SourceRemove),
			putEnd(2, 20, "k", 8),
			oplog.NewEntry(3, 30, oplog.OpPutRevoke, "k", "", 9, oplog.SourceNone),
			putEnd(4, 10+hour, "k", 1),
		}, `key "k": key_sequence_id 1 after 9`},
		{"a revoke of an unseen key", []oplog.Entry{
			oplog.NewEntry(1, 10, oplog.OpPutRevoke, "k", "", 3, oplog.SourceNone),
			putEnd(2, 20, "k", 2),
		}, `key "k": key_sequence_id 2 after 3`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			feed := newMemFeed()
			for _, e := range tt.entries {
				feed.put(rec(e))
			}
			h := newFollowHarness(t, feed, oplog.FollowerConfig{}).run()
			n := uint64(len(tt.entries))
			if tt.err == "" {
				h.waitFor(n)
				return
			}
			err := h.wait()
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
			assert.ErrorContains(t, err, tt.err)
			assert.Equal(t, n-1, h.f.AppliedSeq())
		})
	}
}

func TestFollowerRenewals(t *testing.T) {
	feed := newMemFeed()
	feed.put(rec(putEnd(1, 10, "a", 1)), rec(putEnd(2, 10, "b", 1)))
	feed.renewals = []oplog.Renewal{
		{Key: "a", LeaseTimeoutMs: 5000, SoftPinTimeoutMs: 6000, TimestampMs: 900},
	}
	var now atomic.Int64
	now.Store(1000)
	h := newFollowHarness(t, feed, oplog.FollowerConfig{Now: now.Load}).run()
	feed.push(t, oplog.WatchEvent{Renewals: []oplog.Renewal{
		{Key: "a", LeaseTimeoutMs: 4000, SoftPinTimeoutMs: 9000}, // lease lower: kept at 5000
		{Key: "b", LeaseTimeoutMs: 999},                          // already expired: grants nothing
		{Key: "c", LeaseTimeoutMs: 7000},                         // before c's entry: kept for it
		{Key: "c", SoftPinTimeoutMs: 8000},
		{Key: "d", LeaseTimeoutMs: 1500}, // before d's entry, but expired by then
		{Key: "e", LeaseTimeoutMs: 7000}, // e never comes
	}})
	// Events are applied in order, so once 3 is in the renewals before it are.
	feed.push(t, oplog.WatchEvent{Records: []oplog.Record{rec(putEnd(3, 20, "c", 1))}})
	h.waitFor(3)
	now.Store(2000)
	feed.push(t, oplog.WatchEvent{Records: []oplog.Record{rec(putEnd(4, 20, "d", 1))}})
	h.waitFor(4)

	deadlines := func(key string) [2]int64 {
		o, ok := h.f.Get(key)
		require.True(t, ok, key)
		return [2]int64{o.LeaseTimeoutMs, o.SoftPinTimeoutMs}
	}
	assert.Equal(t, [2]int64{5000, 9000}, deadlines("a"))
	assert.Equal(t, [2]int64{0, 0}, deadlines("b"))
	assert.Equal(t, [2]int64{7000, 8000}, deadlines("c"))
	assert.Equal(t, [2]int64{0, 0}, deadlines("d"))
	assert.Equal(t, uint64(3), h.f.Stats().Renewals, "a twice, c")
	_, ok := h.f.Get("e")
	assert.False(t, ok, "renewals create nothing")
}

func TestFollowerParkedRenewalsBounded(t *testing.T) {
	feed := newMemFeed()
	var now atomic.Int64
	now.Store(1000)
	h := newFollowHarness(t, feed, oplog.FollowerConfig{Now: now.Load, MaxBuffered: 2}).run()
	feed.push(t, oplog.WatchEvent{
		Records: []oplog.Record{rec(putEnd(1, 10, "z", 1))}, // to know when the event is done
		Renewals: []oplog.Renewal{
			{Key: "a", LeaseTimeoutMs: 1500},
			{Key: "b", LeaseTimeoutMs: 5000},
			{Key: "c", LeaseTimeoutMs: 5000}, // no room
		}})
	h.waitFor(1)
	now.Store(2000)
	feed.push(t, oplog.WatchEvent{Renewals: []oplog.Renewal{
		{Key: "d", LeaseTimeoutMs: 5000}, // a's expiry makes room
	}})
	feed.push(t, oplog.WatchEvent{Records: []oplog.Record{
		rec(putEnd(2, 10, "a", 1)), rec(putEnd(3, 10, "b", 1)), rec(putEnd(4, 10, "c", 1)), rec(putEnd(5, 10, "d", 1)),
	}})
	h.waitFor(5)
	for key, want := range map[string]int64{"a": 0, "b": 5000, "c": 0, "d": 5000} {
		o, _ := h.f.Get(key)
		assert.Equal(t, want, o.LeaseTimeoutMs, key)
	}
}

func TestFollowerSeed(t *testing.T) {
	hist := newHistory(15, 7)
	seed := map[string]oplog.ObjectState{}
	for k, o := range hist.model(t, 10) {
		seed[k] = oplog.ObjectState{Size: o.size, KeySeq: o.keySeq, Payload: o.payload}
	}
	feed := newMemFeed()
	feed.put(hist.recs(11, 15)...) // 1..10 were cleaned up
	h := newFollowHarness(t, feed, oplog.FollowerConfig{})
	require.NoError(t, h.f.Seed(10, seed))
	assert.Equal(t, uint64(10), h.f.AppliedSeq())
	h.run()
	h.waitFor(15)
	assert.Equal(t, digestOf(hist.model(t, 15)), h.f.ObjectSetDigest())
	assert.Equal(t, uint64(10), feed.readCalls()[0].after, "reading starts after the seed")
	assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(h.f.Seed(0, nil)), "only before Run")
	assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(h.f.Run(context.Background())), "Run only once")
}

func TestFollowerSeedRejects(t *testing.T) {
	p := oplog.PutEndPayload{Size: 8}
	tests := []struct {
		name string
		objs map[string]oplog.ObjectState
		msg  string
	}{
		{"empty key", map[string]oplog.ObjectState{"": {Size: 8, KeySeq: 1, Payload: p}}, "empty key"},
		{"key seq 0", map[string]oplog.ObjectState{"k": {Size: 8, Payload: p}}, "key_sequence_id 0"},
		{"size mismatch", map[string]oplog.ObjectState{"k": {Size: 9, KeySeq: 1, Payload: p}}, "size 9 but its payload says 8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := oplog.NewFollower(oplog.FollowerConfig{Feed: newMemFeed()})
			err := f.Seed(3, tt.objs)
			assert.Equal(t, errcode.InvalidParams, errcode.Of(err))
			assert.ErrorContains(t, err, tt.msg)
			assert.Zero(t, f.AppliedSeq())
		})
	}
}

func TestFollowerWatchErrorResyncs(t *testing.T) {
	hist := newHistory(8, 8)
	feed := newMemFeed()
	feed.put(hist.recs(1, 3)...)
	h := newFollowHarness(t, feed, oplog.FollowerConfig{GapTimeout: time.Minute}).run()
	feed.push(t, oplog.WatchEvent{Records: hist.recs(4, 4)})
	feed.put(hist.recs(4, 6)...)
	feed.push(t, oplog.WatchEvent{Err: errors.New("mvcc: required revision has been compacted")})
	h.waitFor(6) // read again from 4
	feed.put(hist.recs(7, 8)...)
	feed.push(t, hist.event(7, 8))
	h.waitFor(8)
	s := h.f.Stats()
	assert.Equal(t, uint64(1), s.Resyncs)
	assert.Contains(t, s.LastError, "compacted")
	assert.Len(t, feed.watches(), 2)
	assert.Contains(t, feed.readCalls(), readCall{4, 1000})
	assert.Equal(t, digestOf(hist.model(t, 8)), h.f.ObjectSetDigest())
}

func TestFollowerWatchEndsAtOnce(t *testing.T) {
	hist := newHistory(4, 11)
	feed := newMemFeed()
	feed.put(hist.recs(1, 2)...)
	feed.dropWatch = 3
	h := newFollowHarness(t, feed, oplog.FollowerConfig{}).run()
	feed.put(hist.recs(3, 4)...)
	feed.push(t, hist.event(3, 4))
	h.waitFor(4)
	s := h.f.Stats()
	assert.Equal(t, uint64(3), s.Resyncs)
	assert.Contains(t, s.LastError, "the watch ended")
	assert.Len(t, feed.watches(), 4)
}

func TestFollowerRetriesFeedErrors(t *testing.T) {
	hist := newHistory(5, 9)
	feed := newMemFeed()
	feed.put(hist.recs(1, 5)...)
	feed.failReads = 2
	h := newFollowHarness(t, feed, oplog.FollowerConfig{}).run()
	h.waitFor(5)
	assert.Len(t, feed.readCalls(), 3)
	assert.Contains(t, h.f.Stats().LastError, "etcd unreachable")
}

func TestFollowerStops(t *testing.T) {
	h := newFollowHarness(t, newMemFeed(), oplog.FollowerConfig{}).run()
	h.feed.push(t, oplog.WatchEvent{}) // wait for the watch
	h.cancel()
	require.NoError(t, h.wait(), "ctx ending is not an error")
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	assert.Equal(t, errcode.UnavailableInCurrentStatus, errcode.Of(h.f.WaitFor(ctx, 1)))
	assert.NoError(t, h.f.WaitFor(ctx, 0))

	err := oplog.NewFollower(oplog.FollowerConfig{}).Run(context.Background())
	assert.Equal(t, errcode.InvalidParams, errcode.Of(err), "no feed")
}

// fuzzHistory is the entry sequence FuzzFollowerApply permutes.
var fuzzHistory = newHistory(24, 10)

// FuzzFollowerApply delivers a fuzzer-chosen order of fuzzHistory's entries
// (each byte an entry, repeats allowed; a byte with the high bit set joins
// the previous watch event) and then the last entry: the follower must end
// with the in-order digest. The seed corpus is in testdata.
func FuzzFollowerApply(f *testing.F) {
	n := uint64(len(fuzzHistory))
	want := digestOf(fuzzHistory.model(f, n))
	f.Fuzz(func(t *testing.T, order []byte) {
		if len(order) > 256 {
			return
		}
		feed := newMemFeed()
		h := newFollowHarness(t, feed, oplog.FollowerConfig{GapTimeout: 2 * time.Millisecond, BatchLimit: 5}).run()
		var ev oplog.WatchEvent
		var stored uint64
		flush := func() {
			if len(ev.Records) == 0 {
				return
			}
			// etcd has an entry before a watch delivers it.
			for _, r := range ev.Records {
				for ; stored < r.Seq; stored++ {
					feed.put(rec(fuzzHistory[stored]))
				}
			}
			feed.push(t, ev)
			ev = oplog.WatchEvent{}
		}
		for _, b := range order {
			if b&0x80 == 0 {
				flush()
			}
			ev.Records = append(ev.Records, rec(fuzzHistory[uint64(b&0x7f)%n]))
		}
		// Then as etcd would: everything stored, and the watch delivers at
		// least the last entry, which a follower short of it buffers and
		// re-reads the gap before.
		ev.Records = append(ev.Records, rec(fuzzHistory[n-1]))
		flush()
		h.waitFor(n)
		h.cancel()
		require.NoError(t, h.wait())
		assert.Equal(t, want, h.f.ObjectSetDigest())
		s := h.f.Stats()
		assert.Equal(t, n, s.AppliedSeq)
		assert.Zero(t, s.Buffered)
		assert.Empty(t, s.LastError)
	})
}
