package fsm

// A node answers its clients' pings from a set of the live sessions it
// keeps beside the state, so that a ping does not take the state's lock:
// hundreds of pings queued behind an apply and let go together starve a
// busy leader's Raft goroutines (docs/RELIABILITY.md, finding 27). The
// state tells it what changed.

// SessionChange says that a client's session began (Live) or ended.
type SessionChange struct {
	ClientID string
	Live     bool
}

// TrackSessions makes the state record its session changes for
// TakeSessionChanges, starting with every session it has as begun (on),
// or stop and forget them.
func (f *FSM) TrackSessions(on bool) {
	f.trackSessions = on
	f.sessionChanges = nil
	for id := range f.sessions {
		f.sessionChanged(id, true)
	}
}

// TakeSessionChanges returns the session changes since the last call, in
// the order they happened, and forgets them.
func (f *FSM) TakeSessionChanges() []SessionChange {
	c := f.sessionChanges
	f.sessionChanges = nil
	return c
}

func (f *FSM) sessionChanged(clientID string, live bool) {
	if f.trackSessions {
		f.sessionChanges = append(f.sessionChanges, SessionChange{clientID, live})
	}
}
