package fsm

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"flag"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/moonraft/moonraft/snapshots"
	"github.com/stretchr/testify/require"
)

// The compat fixtures are a Raft log (commands as this package encodes
// them) and the snapshot of the state it leads to, written by a released
// format and committed. A later build must decode every command of the old
// log and load the old snapshot, and both must give the same state: that is
// what a rolling upgrade and a restart on an old data dir rely on.
//
// Write them only for a format that is being frozen (a release), never to
// make a failing test pass: go test ./fsm -run TestCompat -write-compat-fixtures
var writeCompat = flag.Bool("write-compat-fixtures", false, "rewrite fsm/testdata/compat from this build")

const (
	compatDir      = "testdata/compat"
	compatCommands = 3000
)

// compatFixture names one frozen format: its command log and snapshot, and
// whether the snapshot holds its objects in "objects.v2".
type compatFixture struct {
	log, snap string
	packed    bool
}

var compatFixtures = []compatFixture{
	{"v1-commands.bin", "v1-state.moonsnap", false}, // moonraft after issue 12
	{"v2-commands.bin", "v2-state.moonsnap", true},  // issue 41: packed objects
}

func TestCompatFixtures(t *testing.T) {
	if *writeCompat {
		writeCompatFixture(t, compatFixtures[len(compatFixtures)-1])
	}
	for _, fx := range compatFixtures {
		t.Run(fx.log, func(t *testing.T) {
			cmds := readCommandLog(t, filepath.Join(compatDir, fx.log))
			require.Len(t, cmds, compatCommands)
			replayed := New()
			seen := map[CmdType]bool{}
			for i, entry := range cmds {
				c, err := Decode(entry)
				require.NoError(t, err, "command %d of the old log", i)
				require.NotNil(t, c, "command %d of the old log was skipped as unknown", i)
				replayed.ApplyCommand(c)
				seen[c.Type()] = true
			}
			for ct := CmdMountSegment; ct <= CmdBatch; ct++ {
				require.True(t, seen[ct], "the old log has no %v: the fixture proves nothing for it", ct)
			}
			require.NoError(t, replayed.CheckInvariants())

			snap, err := os.ReadFile(filepath.Join(compatDir, fx.snap))
			require.NoError(t, err)
			restored := New()
			h, err := restored.Restore(bytes.NewReader(snap))
			require.NoError(t, err, "the old snapshot must load")
			require.NoError(t, restored.CheckInvariants())
			require.Equal(t, uint64(compatCommands), h.RaftIndex)
			require.Positive(t, h.Objects, "the fixture should hold objects")
			require.Equal(t, restored.Digest(), replayed.Digest(), "the old log and the old snapshot give different states")

			// Nothing of the old format is lost or reinterpreted on the way
			// through this build. A packed snapshot writes back to the very
			// same body; an earlier one's body is the encoding the state's
			// digest is taken over.
			old, err := snapshots.Inspect(bytes.NewReader(snap))
			require.NoError(t, err)
			if !fx.packed {
				require.Equal(t, old.Digest, restored.Digest())
				return
			}
			var again bytes.Buffer
			require.NoError(t, restored.Snapshot().Write(&again, h))
			now, err := snapshots.Inspect(&again)
			require.NoError(t, err)
			require.Equal(t, old.Digest, now.Digest)
		})
	}
}

// writeCompatFixture records compatCommands commands of the determinism
// generator and the snapshot after them.
func writeCompatFixture(t *testing.T, fx compatFixture) {
	require.NoError(t, os.MkdirAll(compatDir, 0o755))
	g := newGen(rand.New(rand.NewPCG(20261123, 12)))
	f := New()
	var log bytes.Buffer
	for i := 0; i < compatCommands; i++ {
		entry := Encode(g.next(f))
		f.Apply(entry)
		log.Write(binary.AppendUvarint(nil, uint64(len(entry))))
		log.Write(entry)
	}
	require.NoError(t, os.WriteFile(filepath.Join(compatDir, fx.log), log.Bytes(), 0o644))
	var snap bytes.Buffer
	require.NoError(t, f.Snapshot().Write(&snap, snapshots.Header{
		RaftIndex: compatCommands, RaftTerm: 1, ClusterID: "compat", NodeID: "n1", CreatedUnixMs: 1_700_000_000_000}))
	require.NoError(t, os.WriteFile(filepath.Join(compatDir, fx.snap), snap.Bytes(), 0o644))
}

func readCommandLog(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	r := bufio.NewReader(bytes.NewReader(b))
	var out [][]byte
	for {
		n, err := binary.ReadUvarint(r)
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		entry := make([]byte, n)
		_, err = io.ReadFull(r, entry)
		require.NoError(t, err)
		out = append(out, entry)
	}
}
