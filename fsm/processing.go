package fsm

import (
	"cmp"
	"slices"
	"strings"
)

// procIndex holds every PROCESSING object, by key: putObject and forget
// keep it equal to the PROCESSING part of the object tree. A map rather
// than a tree ordered by start time: every put enters and leaves it, and a
// PutEnd finds its object here without a descent of the object tree, while
// only the rare reclaim needs an order, and sorts for itself. oldestMs
// bounds the start times held from below, so a tick scans only when
// something may be stale.
type procIndex struct {
	objs     map[string]*object
	oldestMs int64
}

func newProcIndex() procIndex { return procIndex{objs: map[string]*object{}} }

func (p *procIndex) set(key string, o *object) {
	if len(p.objs) == 0 || o.putStartMs < p.oldestMs {
		p.oldestMs = o.putStartMs
	}
	p.objs[key] = o
}

func (p *procIndex) remove(key string) { delete(p.objs, key) }

func (p *procIndex) get(key string) (*object, bool) {
	o, ok := p.objs[key]
	return o, ok
}

// holds reports whether key is indexed as o, and no earlier than oldestMs.
func (p *procIndex) holds(key string, o *object) bool {
	return p.objs[key] == o && o.putStartMs >= p.oldestMs
}

func (p *procIndex) len() int { return len(p.objs) }

// startedBy returns the keys of the objects started at or before cutoffMs,
// by start time then key (every node drops them in the same order), and
// raises oldestMs to the oldest start of the rest.
func (p *procIndex) startedBy(cutoffMs int64) []procItem {
	if len(p.objs) == 0 || p.oldestMs > cutoffMs {
		return nil
	}
	var old []procItem
	oldest, first := int64(0), true
	for key, o := range p.objs {
		switch {
		case o.putStartMs <= cutoffMs:
			old = append(old, procItem{o.putStartMs, key})
		case first || o.putStartMs < oldest:
			oldest, first = o.putStartMs, false
		}
	}
	p.oldestMs = oldest
	slices.SortFunc(old, cmpProc)
	return old
}

// sorted returns every entry in startedBy's order.
func (p *procIndex) sorted() []procItem {
	all := make([]procItem, 0, len(p.objs))
	for key, o := range p.objs {
		all = append(all, procItem{o.putStartMs, key})
	}
	slices.SortFunc(all, cmpProc)
	return all
}

func cmpProc(a, b procItem) int {
	if c := cmp.Compare(a.putStartMs, b.putStartMs); c != 0 {
		return c
	}
	return strings.Compare(a.key, b.key)
}
