package fsm

import (
	"strconv"

	"github.com/moonraft/moonraft/errcode"
)

// commandDef is one row of the command table: the command's name, an
// empty command to decode an entry of its type into, and how the state
// machine applies it.
type commandDef struct {
	name  string
	new   func() Command
	apply func(f *FSM, c Command) Result
}

// commands is the command table, indexed by type (Consul's
// registerCommand): a new command is a type constant, its struct with
// Type, encode and decode, and one row here.
var commands [256]commandDef

func init() {
	register(CmdMountSegment, "MountSegment", (*FSM).mountSegment)
	register(CmdMountSegmentTransport, "MountSegment", (*FSM).mountSegment)
	register(CmdUnmountSegment, "UnmountSegment", (*FSM).unmountSegment)
	register(CmdRemountSegments, "RemountSegments", (*FSM).remountSegments)
	register(CmdRemountSegmentsTransport, "RemountSegments", (*FSM).remountSegments)
	register(CmdPutStart, "PutStart", (*FSM).putStart)
	register(CmdPutEnd, "PutEnd", (*FSM).putEnd)
	register(CmdPutRevoke, "PutRevoke", (*FSM).putRevoke)
	register(CmdRemove, "Remove", (*FSM).remove)
	register(CmdRemoveByRegex, "RemoveByRegex", (*FSM).removeByRegex)
	register(CmdRemoveAll, "RemoveAll", (*FSM).removeAll)
	register(CmdTick, "Tick", (*FSM).tick)
	register(CmdPromote, "Promote", (*FSM).promote)
	register(CmdPromoteMooncake, "Promote", (*FSM).promote)
	register(CmdExported, "Exported", (*FSM).exported)
	register(CmdBatch, "Batch", (*FSM).batch)
	register(CmdUpsertStart, "UpsertStart", (*FSM).upsertStart)
	register(CmdUpsertStartCopy, "UpsertStart", (*FSM).upsertStart)
	register(CmdGracefulUnmount, "GracefulUnmount", (*FSM).gracefulUnmount)
	register(CmdDrainSegments, "DrainSegments", (*FSM).drainSegments)
	register(CmdMember, "Member", (*FSM).member)
	register(CmdReleaseRemovals, "ReleaseRemovals", (*FSM).releaseRemovals)
}

// register adds the row of type t, whose commands are *T.
func register[T any, C interface {
	*T
	Command
}](t CmdType, name string, apply func(*FSM, C) Result) {
	if commands[t].new != nil {
		panic("fsm: command type " + strconv.Itoa(int(t)) + " registered twice")
	}
	commands[t] = commandDef{
		name: name,
		new:  func() Command { return C(new(T)) },
		apply: func(f *FSM, c Command) Result {
			cc, ok := c.(C)
			if !ok {
				return failed(errcode.InvalidParams, "command %s of Go type %T is not applicable", name, c)
			}
			return apply(f, cc)
		},
	}
}

// newCommand returns an empty command of type t, or nil for a type this
// build does not know.
func newCommand(t CmdType) Command {
	if d := commands[t]; d.new != nil {
		return d.new()
	}
	return nil
}

func (t CmdType) String() string {
	if name := commands[t].name; name != "" {
		return name
	}
	return "type(" + strconv.Itoa(int(t)) + ")"
}
