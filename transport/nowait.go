package transport

import "context"

// noWait marks a context under which a backend read must not wait: the
// Mooncake protocol's event loop runs quick reads itself, for every
// connection it serves, and a read that would wait for a leader, a quorum
// round or a removal in flight goes to a worker instead.
type noWait struct{ waited bool }

type noWaitKey struct{}

// NoWait returns a context for a read that must not wait, and a func that
// reports, after the read, whether it would have (its answer is then to
// be thrown away and the read done again where it may wait).
func NoWait(ctx context.Context) (context.Context, func() bool) {
	w := &noWait{}
	return context.WithValue(ctx, noWaitKey{}, w), func() bool { return w.waited }
}

// MustNotWait is what a backend asks where it would wait: true under
// NoWait (it then gives up, and the caller learns it would have waited).
func MustNotWait(ctx context.Context) bool {
	w, ok := ctx.Value(noWaitKey{}).(*noWait)
	if ok {
		w.waited = true
	}
	return ok
}
