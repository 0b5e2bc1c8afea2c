//go:build failpoints

package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"github.com/moonraft/moonraft/raftstore"
)

// Failpoints for fault tests, compiled only with `-tags failpoints` (as
// etcd builds its failpoints): a release binary has none. Each is switched
// on by creating a file in the node's data dir and off by removing it.
const (
	// failpointStallLog holds every write to the Raft log while the file
	// exists: a disk that has stopped answering. The leader's Raft loop
	// then stops (it cannot step down), while its heartbeats and the
	// client API go on.
	failpointStallLog = "failpoint-stall-log"
	// failpointSlowLog makes every write to the Raft log take as long as
	// the duration the file holds ("1s"): a disk whose fsyncs stall.
	failpointSlowLog = "failpoint-slow-log"
	// failpointFailLog makes every write to the Raft log fail with EIO
	// while the file exists: a disk that reports errors.
	failpointFailLog = "failpoint-fail-log"
)

func withFailpoints(s raft.LogStore, dataDir string) raft.LogStore {
	return &faultyLog{LogStore: s, stall: filepath.Join(dataDir, failpointStallLog),
		slow: filepath.Join(dataDir, failpointSlowLog), fail: filepath.Join(dataDir, failpointFailLog)}
}

type faultyLog struct {
	raft.LogStore
	stall, slow, fail string
}

func (l *faultyLog) StoreLog(log *raft.Log) error {
	if err := l.fault(); err != nil {
		return err
	}
	return l.LogStore.StoreLog(log)
}

func (l *faultyLog) StoreLogs(logs []*raft.Log) error {
	if err := l.fault(); err != nil {
		return err
	}
	return l.LogStore.StoreLogs(logs)
}

func (l *faultyLog) IsMonotonic() bool { return raftstore.IsMonotonic(l.LogStore) }

func (l *faultyLog) fault() error {
	if _, err := os.Stat(l.fail); err == nil {
		return fmt.Errorf("write raft log: %w (%s)", syscall.EIO, failpointFailLog)
	}
	if b, err := os.ReadFile(l.slow); err == nil {
		if d, err := time.ParseDuration(strings.TrimSpace(string(b))); err == nil {
			time.Sleep(d)
		}
	}
	for {
		if _, err := os.Stat(l.stall); err != nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}
