package service

import "context"

// WriteTrace, in a call's context, records what became of the call's
// proposals: refused says the node refused one before logging it because
// it no longer leads (or is handing leadership over); logged says one
// reached the log (or may have). A call refused before any of its writes
// was logged had no effect, so a front may send it to the new leader.
type WriteTrace struct{ refused, logged bool }

// NoEffect tells whether the call's writes were refused, none logged.
func (t *WriteTrace) NoEffect() bool { return t.refused && !t.logged }

type writeTraceKey struct{}

// WithWriteTrace returns a context whose proposals the backend records in
// the returned trace.
func WithWriteTrace(ctx context.Context) (context.Context, *WriteTrace) {
	t := &WriteTrace{}
	return context.WithValue(ctx, writeTraceKey{}, t), t
}

// TraceWrite records a proposal's outcome in ctx's trace, if it has one:
// refusedUnlogged when the node refused it before logging it.
func TraceWrite(ctx context.Context, refusedUnlogged bool) {
	t, ok := ctx.Value(writeTraceKey{}).(*WriteTrace)
	if !ok {
		return
	}
	if refusedUnlogged {
		t.refused = true
	} else {
		t.logged = true
	}
}
