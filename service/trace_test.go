package service

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestWriteTrace: a call has no effect only when a proposal was refused
// unlogged and none was logged.
func TestWriteTrace(t *testing.T) {
	for _, tc := range []struct {
		name     string
		refused  []bool
		noEffect bool
	}{
		{"refused", []bool{true}, true},
		{"logged", []bool{false}, false},
		{"refused after one was logged", []bool{false, true}, false},
		{"nothing proposed", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, trace := WithWriteTrace(context.Background())
			for _, r := range tc.refused {
				TraceWrite(ctx, r)
			}
			assert.Equal(t, tc.noEffect, trace.NoEffect())
		})
	}
	TraceWrite(context.Background(), true) // no trace: nothing to record
}
