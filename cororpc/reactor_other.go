//go:build !linux

package cororpc

import (
	"context"
	"net"
)

// reactor is Linux's (reactor_linux.go); elsewhere each connection has a
// reader goroutine of its own.
type reactor struct{}

func newReactor(context.Context, *Server) (*reactor, error) { return nil, nil }

func (*reactor) add(net.Conn) bool { return false }
func (*reactor) run()              {}
func (*reactor) stop()             {}
