package raftstore

import (
	"strings"

	"github.com/moonraft/moonraft/errcode"
)

// Peer is one member of the initial cluster.
type Peer struct {
	ID       string
	RaftAddr string
}

// ParsePeers parses "id=host:port,id=host:port".
func ParsePeers(s string) ([]Peer, error) {
	var out []Peer
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		if !ok || id == "" || addr == "" {
			return nil, errcode.New(errcode.InvalidParams, "peer %q: want id=host:port", part)
		}
		if seen[id] {
			return nil, errcode.New(errcode.InvalidParams, "peer id %q appears twice", id)
		}
		seen[id] = true
		out = append(out, Peer{ID: id, RaftAddr: addr})
	}
	return out, nil
}
