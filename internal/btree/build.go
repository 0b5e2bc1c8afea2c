package btree

// Builder builds a tree from items given in ascending order, as a restore
// reads them from a sorted snapshot. Each item is appended on the right
// edge of the tree, with no search and no split: every node comes out full
// but the last of each level, which Tree evens out with the one before it.
type Builder[T any] struct {
	t    *BTreeG[T]
	last T
	// path is the tree's right edge, the leaf first: path[h+1]'s last
	// child is path[h]. Every node left of it is full.
	path []*node[T]
}

// NewBuilder returns a builder of a tree of the given degree and order.
func NewBuilder[T any](degree int, less LessFunc[T]) *Builder[T] {
	return &Builder[T]{t: NewG(degree, less)}
}

// Len is the number of items added.
func (b *Builder[T]) Len() int { return b.t.length }

// Add appends item to the tree. It reports false, adding nothing, unless
// item comes after every item added before.
func (b *Builder[T]) Add(item T) bool {
	t := b.t
	if t.length > 0 && !t.cow.less(b.last, item) {
		return false
	}
	b.last = item
	t.length++
	if len(b.path) == 0 {
		b.path = append(b.path, b.newNode(false))
	}
	if leaf := b.path[0]; len(leaf.items) < t.maxItems() {
		leaf.items = append(leaf.items, item)
		return true
	}
	// The leaf is full: item separates it from the next leaf, one level up
	// or, where that level's node is full too, higher.
	h := 1
	for h < len(b.path) && len(b.path[h].items) == t.maxItems() {
		h++
	}
	if h == len(b.path) {
		root := b.newNode(true)
		root.children = append(root.children, b.path[h-1])
		b.path = append(b.path, root)
	}
	b.path[h].items = append(b.path[h].items, item)
	for k := h - 1; k >= 0; k-- {
		n := b.newNode(k > 0)
		b.path[k+1].children = append(b.path[k+1].children, n)
		b.path[k] = n
	}
	return true
}

func (b *Builder[T]) newNode(inner bool) *node[T] {
	n := b.t.cow.newNode()
	n.items = make(items[T], 0, b.t.maxItems())
	if inner {
		n.children = make(items[*node[T]], 0, b.t.maxItems()+1)
	}
	return n
}

// Tree returns the tree built; the builder must not be used after.
//
// Only the right edge can hold fewer items than a node must (minItems):
// the last node of each level, begun after the one before it filled up,
// an inner one with no items yet if the item above it went higher. From
// the root down, each such node takes items (and children) from its full
// left neighbour, through the item between them in their parent, until
// the two hold about as many; the parent keeps its number of items, and
// has some by the time the level below it is evened out.
func (b *Builder[T]) Tree() *BTreeG[T] {
	t := b.t
	if len(b.path) == 0 {
		return t
	}
	for h := len(b.path) - 2; h >= 0; h-- {
		n, parent := b.path[h], b.path[h+1]
		if len(n.items) >= t.minItems() {
			continue
		}
		i := len(parent.items) - 1 // parent.items[i] separates left and n
		left := parent.children[i]
		pool := make(items[T], 0, len(left.items)+1+len(n.items))
		pool = append(append(append(pool, left.items...), parent.items[i]), n.items...)
		keep := (len(pool) - 1) / 2
		left.items.truncate(keep)
		parent.items[i] = pool[keep]
		n.items = append(n.items[:0], pool[keep+1:]...)
		if len(left.children) > 0 { // inner nodes: their children follow
			kids := append(append(make(items[*node[T]], 0, len(left.children)+len(n.children)), left.children...), n.children...)
			left.children.truncate(keep + 1)
			n.children = append(n.children[:0], kids[keep+1:]...)
		}
	}
	t.root = b.path[len(b.path)-1]
	b.path = nil
	return t
}
