package service

import "context"

// NoWaitContext marks a context under which a backend read must not wait:
// the Mooncake protocol's event loop runs quick reads itself, for every
// connection it serves, and a read that would wait for a leader, a quorum
// round or a removal in flight goes to a worker instead. It is its own
// mark, in one allocation: the event loop makes one for every read.
type NoWaitContext struct {
	context.Context
	waited bool
}

type noWaitKey struct{}

// NoWait returns a context for a read that must not wait; after the read,
// its Waited reports whether the read would have (its answer is then to
// be thrown away and the read done again where it may wait).
func NoWait(ctx context.Context) *NoWaitContext { return &NoWaitContext{Context: ctx} }

// Value is context.Context's, answering the mark itself.
func (c *NoWaitContext) Value(key any) any {
	if key == (noWaitKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// Waited reports whether a read under c gave up where it would have
// waited.
func (c *NoWaitContext) Waited() bool { return c.waited }

// MustNotWait is what a backend asks where it would wait: true under
// NoWait (it then gives up, and the caller learns it would have waited).
func MustNotWait(ctx context.Context) bool {
	c, ok := ctx.Value(noWaitKey{}).(*NoWaitContext)
	if ok {
		c.waited = true
	}
	return ok
}
