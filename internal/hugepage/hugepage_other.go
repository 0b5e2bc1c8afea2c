//go:build !linux

package hugepage

import "errors"

type regions struct{}

func advise(int) (regions, error) { return regions{}, errors.ErrUnsupported }

func (regions) size() int { return 0 }

func (regions) withdraw() {}

func physicalMemory() uint64 { return 0 }

// InUse returns 0: huge pages are Linux's here.
func InUse() uint64 { return 0 }
