package jepsen

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/moonraft/moonraft/internal/child"
)

// failpointSlowLog is node/failpoint_on.go's switch: while this file is in
// a node's data dir, each of its Raft log writes takes the duration it
// holds. The fault suite's nodes are built with -tags failpoints.
const failpointSlowLog = "failpoint-slow-log"

// failpointFailLog is its sibling: while the file exists, each Raft log
// write of the node fails with EIO.
const failpointFailLog = "failpoint-fail-log"

// fillerName is the file the disk-full nemesis fills a node's data dir
// file system with.
const fillerName = "nemesis-filler"

// nodeDir is node i's data dir.
func (c *cluster) nodeDir(i int) string {
	return filepath.Join(c.dataDir, c.nodes[i].id)
}

// mountDisks gives every node's data dir a tmpfs of its own, of sizeMB, so
// that one node's disk can be filled without touching the others' (tests
// run as root, as CI does).
func (c *cluster) mountDisks(sizeMB int) error {
	for i := range c.nodes {
		dir := c.nodeDir(i)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%dm", sizeMB)); err != nil {
			return fmt.Errorf("mount a %d MiB tmpfs on %s for the disk-full nemesis (needs root): %w", sizeMB, dir, err)
		}
		c.mounted = append(c.mounted, dir)
	}
	return nil
}

func (c *cluster) unmountDisks() {
	for _, dir := range c.mounted {
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	}
	c.mounted = nil
}

// fillDisk takes every free byte of node i's file system, in steps since
// the node writes meanwhile, and says how much it took.
func (c *cluster) fillDisk(i int) (int64, error) {
	f, err := os.OpenFile(filepath.Join(c.nodeDir(i), fillerName), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := st.Size()
	for _, step := range []int64{16 << 20, 1 << 20, 4 << 10} {
		for {
			err := syscall.Fallocate(int(f.Fd()), 0, size, step)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				return size, err
			}
			size += step
		}
	}
	return size, nil
}

// slowDisk makes each of node i's Raft log writes take d.
func (c *cluster) slowDisk(i int, d string) error {
	return os.WriteFile(filepath.Join(c.nodeDir(i), failpointSlowLog), []byte(d), 0o644)
}

// healDisks gives every node its space back and a fast disk.
func (c *cluster) healDisks() error {
	var errs []error
	for i := range c.nodes {
		for _, name := range []string{fillerName, failpointSlowLog} {
			if err := os.Remove(filepath.Join(c.nodeDir(i), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// keepNodeData stops the nodes and copies each one's data dir into
// dst/<id>: a failed run's Raft logs and snapshots show what each node
// applied, which its log and the OpLog cannot (finding 18). The disks are
// healed first, so no filler is copied.
func (c *cluster) keepNodeData(dst string) error {
	var ps []*child.Proc
	for _, p := range c.nodes {
		ps = append(ps, p.Proc)
	}
	child.StopAll(10*time.Second, ps...)
	errs := []error{c.healDisks()}
	for i, p := range c.nodes {
		errs = append(errs, os.CopyFS(filepath.Join(dst, p.id), os.DirFS(c.nodeDir(i))))
	}
	return errors.Join(errs...)
}
