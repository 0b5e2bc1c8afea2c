//go:build !failpoints

package node

import "github.com/hashicorp/raft"

// withFailpoints returns the log store unchanged: failpoints exist only in
// builds with the failpoints tag (failpoint_on.go).
func withFailpoints(s raft.LogStore, _ string) raft.LogStore { return s }
