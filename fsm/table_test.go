package fsm

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCommandTable: every command type of the log format has a row, and a
// row's empty command reports a type whose row makes the same Go type, so
// Decode and Apply agree on what an entry is.
func TestCommandTable(t *testing.T) {
	for typ := CmdMountSegment; typ <= CmdUpsertStartCopy; typ++ {
		c := newCommand(typ)
		require.NotNil(t, c, "type %d has no row", typ)
		own := newCommand(c.Type())
		require.NotNil(t, own, "%s reports type %d, which has no row", typ, c.Type())
		assert.Equal(t, reflect.TypeOf(c), reflect.TypeOf(own), "%s", typ)
		assert.Equal(t, typ.String(), c.Type().String())
		assert.NotContains(t, typ.String(), "type(")
	}
	assert.Nil(t, newCommand(CmdUpsertStartCopy+1))
	assert.Equal(t, "type(23)", (CmdUpsertStartCopy + 1).String())

	r := New().ApplyCommand(foreign{})
	assert.Contains(t, r.Err.Error(), "not applicable")
}

// foreign claims PutEnd's type byte without being a PutEnd.
type foreign struct{}

func (foreign) Type() CmdType { return CmdPutEnd }
func (foreign) encode(*enc)   {}
func (foreign) decode(*dec)   {}
