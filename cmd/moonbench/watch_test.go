package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The watch's summary counts leader changes by term, keeps the backlog's
// peaks, and takes the rates over the whole run; the plot is written.
func TestWatchSummary(t *testing.T) {
	var w watchSummary
	for _, s := range []exportSample{
		{T: 0, Term: 2, AppliedSeq: 0, ExportedSeq: 0},
		{T: 1, Term: 2, AppliedSeq: 3000, ExportedSeq: 1000, BacklogMs: 900, WritesPaced: 2},
		{T: 2, Term: 3, AppliedSeq: 5000, ExportedSeq: 2500, BacklogMs: 1200, EtcdError: "context deadline exceeded"},
		{T: 4, Term: 3, AppliedSeq: 6000, ExportedSeq: 6000},
	} {
		w.add(s)
	}
	w.finish()
	assert.Equal(t, 1, w.Elections)
	assert.Equal(t, uint64(2500), w.MaxBacklog)
	assert.Equal(t, int64(1200), w.MaxBacklogMs)
	assert.InDelta(t, 1500, w.AdmittedRate, 0.1)
	assert.InDelta(t, 1500, w.ExportedRate, 0.1)
	assert.Equal(t, 1, w.PacedSamples)
	assert.Equal(t, 1, w.EtcdDownTimes)

	dir := t.TempDir()
	require.NoError(t, w.write(filepath.Join(dir, "w.json"), filepath.Join(dir, "w.svg")))
	for _, f := range []string{"w.json", "w.svg"} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
		assert.Positive(t, st.Size())
	}
}
