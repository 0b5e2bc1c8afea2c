package node

import (
	"sync"

	"github.com/moonraft/moonraft/cmd/node/serve"
)

// listeners holds every test node's listeners, for tests that drain the
// Mooncake front.
var listeners sync.Map // *Node → *serve.Listeners

// listen opens n's listeners as bin/moonraft does (Config.Listen).
func listen(n *Node) (func(), error) {
	c := n.cfg
	l, err := serve.Open(n, serve.Config{
		GRPCAddr: c.GRPCAddr, MooncakeAddr: c.MooncakeAddr, HTTPAddr: c.HTTPAddr,
		MooncakeLoops: c.MooncakeLoops, HTTPTLS: c.HTTPTLS, AdminToken: c.AdminToken, Limits: c.Limits,
		LeaseTTLMs: uint64(c.Params.LeaseTTLMs), LeaderWithin: 2 * c.ElectionTimeout, Logger: n.log,
	})
	if err != nil {
		return nil, err
	}
	listeners.Store(n, l)
	return func() {
		l.Stop()
		listeners.Delete(n)
	}, nil
}

// listenersOf are n's listeners.
func listenersOf(n *Node) *serve.Listeners {
	l, _ := listeners.Load(n)
	return l.(*serve.Listeners)
}
