package tests

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moonraft/moonraft/etcdbridge"
	"github.com/moonraft/moonraft/mckeeper"
	mc "github.com/moonraft/moonraft/mooncakeapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMooncakeKeepersFollowTheLeader: Mooncake-protocol keepers, which
// moonbench's scale harness runs by the thousand, keep their sessions
// across a SIGKILL of the leader by finding the new one in etcd's
// master_view, as Mooncake's HA clients do; a keeper whose session
// expired remounts when it pings again.
func TestMooncakeKeepersFollowTheLeader(t *testing.T) {
	const ttl = 6 * time.Second
	etcd := startEtcd(t)
	c := StartCluster(t, t.TempDir(), 3, "--etcd-endpoints", etcd, "--client-ttl", ttl.String())
	ctx, cl, leader := c.Serving(2 * time.Minute)
	waitView(t, etcd, leader.MooncakeAddr)
	views, err := etcdbridge.Dial(etcdbridge.Config{Endpoints: strings.Split(etcd, ",")})
	require.NoError(t, err)
	defer views.Close()

	keepers := make([]*mckeeper.Keeper, 20)
	for i := range keepers {
		seg := mc.Segment{ID: mc.UUID{First: 2, Second: uint64(i)}, Name: fmt.Sprintf("host-%d", i), Base: uint64(i+1) << 30, Size: 1 << 20,
			TEEndpoint: "127.0.0.1:1", Protocol: "tcp"}
		k := mckeeper.New(mc.UUID{First: 1, Second: uint64(i)}, []mc.Segment{seg}, views.MooncakeMaster)
		require.NoError(t, k.Mount(ctx))
		k.Start(ctx)
		t.Cleanup(k.Stop)
		keepers[i] = k
	}
	sessions := func() uint64 {
		st, err := cl.Progress(ctx, c.Leader(ctx, cl).GRPCAddr)
		require.NoError(t, err)
		return st.Sessions
	}
	require.EqualValues(t, len(keepers), sessions())

	c.Kill(leader, syscall.SIGKILL)
	require.NotEqual(t, leader.ID, c.Leader(ctx, cl).ID)
	// Past three TTLs the sessions live only if the keepers ping the new
	// leader: Promote extends them by two.
	time.Sleep(3 * ttl)
	assert.EqualValues(t, len(keepers), sessions(), "sessions kept across the failover")
	for i, k := range keepers {
		assert.NoError(t, k.Err(), "keeper %d's last ping", i)
		assert.Zero(t, k.Remounts(), "keeper %d remounted", i)
	}

	k := keepers[0]
	k.Stop()
	require.Eventually(t, func() bool { return sessions() == uint64(len(keepers)-1) }, 3*ttl, 100*time.Millisecond, "the stopped keeper's session expires")
	remounts := make(chan mckeeper.Remount, 2)
	k.OnRemount(func(r mckeeper.Remount) { remounts <- r })
	restarted := time.Now()
	k.Start(ctx)
	require.Eventually(t, func() bool { return k.Remounts() == 1 && sessions() == uint64(len(keepers)) }, 2*ttl, 100*time.Millisecond,
		"the keeper remounts when told to: %v", k.Err())
	r := <-remounts
	assert.True(t, r.At.After(restarted), "the remount's time")
	assert.Zero(t, r.Silence, "no ping answered OK since the restart")
	assert.Positive(t, r.Took, "the NEED_REMOUNT ping's wait for its answer")
	assert.Less(t, r.Took, ttl)
	assert.Zero(t, r.Failed)
	assert.True(t, r.LastDial.At.After(restarted), "the connection made again after the restart")
	assert.Zero(t, r.LastDial.LookUp, "to the master's address it knew")
	assert.Equal(t, c.Leader(ctx, cl).MooncakeAddr, r.LastDial.Addr)
	assert.Positive(t, r.LastDial.Dial)
	assert.Empty(t, r.LastDial.Err)
	assert.Empty(t, remounts, "one remount")
}
