//go:build !linux

package hugepage

import "errors"

type region struct{}

func advise(int) (region, error) { return region{}, errors.ErrUnsupported }

func (region) withdraw() {}

func physicalMemory() uint64 { return 0 }

// InUse returns 0: huge pages are Linux's here.
func InUse() uint64 { return 0 }
