package fsm

import (
	"testing"

	"github.com/moonraft/moonraft/errcode"
	"github.com/stretchr/testify/assert"
)

// TestMemberAddrs: Member records, replaces and forgets a member's client
// address; the addresses survive a snapshot and count in the digest, and a
// state that never had one keeps the snapshot format it had.
func TestMemberAddrs(t *testing.T) {
	x := newH(t)
	before := x.f.Digest()
	x.code(errcode.InvalidParams, &Member{GRPCAddr: "10.0.0.1:7100"})
	x.ok(&Member{ID: "n0", GRPCAddr: "10.0.0.1:7100"})
	x.ok(&Member{ID: "n1", GRPCAddr: "10.0.0.2:7100"})
	x.ok(&Member{ID: "n1", GRPCAddr: "10.0.0.9:7100"})
	x.ok(&Member{ID: "n2", GRPCAddr: "10.0.0.3:7100"})
	x.ok(&Member{ID: "n2"})
	x.ok(&Member{ID: "nobody"})
	want := map[string]string{"n0": "10.0.0.1:7100", "n1": "10.0.0.9:7100"}
	assert.Equal(t, want, x.f.MemberAddrs())
	assert.NotEqual(t, before, x.f.Digest())
	back := roundTrip(t, x.f)
	assert.Equal(t, want, back.MemberAddrs())
	assert.Equal(t, x.f.Digest(), back.Digest())

	x.ok(&Member{ID: "n0"})
	x.ok(&Member{ID: "n1"})
	assert.Empty(t, x.f.MemberAddrs())
	assert.Equal(t, before, x.f.Digest(), "no members: the state (and snapshot) of before")
}
