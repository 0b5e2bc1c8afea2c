package fsm

import (
	"context"

	"github.com/moonraft/moonraft/internal/btree"
)

// The leader's key index: a hash of the objects by key. The leader, which
// looks keys up by the hundred thousand a second for reads, keeps one;
// followers, which only apply writes, are spared its cost (a map insert per
// write, ~55 bytes per object). The index changes no answer, only how
// fast it comes: the tree stays for ordered scans and the snapshot's
// copy-on-write clone. It maps a key to the object alone: the key again in
// each entry cost 45 bytes an object (BenchmarkHeapPerObject).
//
// A new leader builds it, once the failover's rush is over
// (node.Config.KeyIndexAfter), from a clone of the object tree, away from
// the state's lock (~0.3 s per million objects): built under the lock, even
// in steps, it held up every read, ping and apply of a freshly promoted
// leader at a million objects for half a second. Until it is finished,
// reads go through the tree and the state notes which keys change.

// KeyIndexBuild is a key index being built (StartKeyIndex).
type KeyIndexBuild struct {
	objects *btree.BTreeG[objItem] // the clone the index is built from
	byKey   map[string]*object     // written only by Build
	// changed: the keys stored or forgotten since the clone, written only
	// by the state under its lock.
	changed map[string]struct{}
}

// IndexKeys builds the key index at once (on), or drops it or the build in
// progress.
func (f *FSM) IndexKeys(on bool) {
	if !on {
		f.byKey, f.keyBuild = nil, nil
		return
	}
	if f.byKey == nil {
		b := f.StartKeyIndex()
		_ = b.Build(context.Background())
		f.FinishKeyIndex(b)
	}
}

// StartKeyIndex begins a build of the key index from the objects as they
// are now, dropping any index or build there was. Build may then run
// without the state's lock, while commands are applied.
func (f *FSM) StartKeyIndex() *KeyIndexBuild {
	b := &KeyIndexBuild{objects: f.objects.Clone(), changed: map[string]struct{}{}}
	f.byKey, f.keyBuild = nil, b
	return b
}

// Build fills the index from the clone. It touches nothing the state's
// lock guards, so it runs without it. It stops early, with ctx's error,
// when ctx is done.
func (b *KeyIndexBuild) Build(ctx context.Context) error {
	b.byKey = make(map[string]*object, b.objects.Len())
	var err error
	n := 0
	ascendAhead(b.objects, func(it objItem) bool {
		if n++; n%4096 == 0 && ctx.Err() != nil {
			err = ctx.Err()
			return false
		}
		b.byKey[it.key] = it.obj
		return true
	})
	return err
}

// FinishKeyIndex brings a built index up to date with the keys that changed
// since StartKeyIndex and makes it the state's. It reports false, and does
// nothing, when b is not the state's build in progress (the index was
// dropped or started again, or the state restored, since).
func (f *FSM) FinishKeyIndex(b *KeyIndexBuild) bool {
	if f.keyBuild != b || b.byKey == nil {
		return false
	}
	for key := range b.changed {
		if it, ok := f.objects.Get(objItem{key: key}); ok {
			b.byKey[key] = it.obj
		} else {
			delete(b.byKey, key)
		}
	}
	f.byKey, f.keyBuild = b.byKey, nil
	return true
}

// indexKey records that key now holds it (it.obj nil: key is gone) in the
// key index, or for the build in progress.
func (f *FSM) indexKey(key string, it objItem) {
	switch {
	case f.byKey != nil && it.obj != nil:
		f.byKey[key] = it.obj
	case f.byKey != nil:
		delete(f.byKey, key)
	case f.keyBuild != nil:
		f.keyBuild.changed[key] = struct{}{}
	}
}

// findObject finds key through the key index if there is one, else
// through the tree. Through the index, the item's key is the caller's.
func (f *FSM) findObject(key string) (objItem, bool) {
	if f.byKey != nil {
		o, ok := f.byKey[key]
		return objItem{key, o}, ok
	}
	return f.objects.Get(objItem{key: key})
}
