package index

import "math/bits"

// The radix tree (Dynamo's variant A, one node per block) of one worker, stored as a compact arena.
//
// Node identity is a uint32 index into tree.nodes; index 0 is the root. A node's children are linked through
// firstChild/nextSib (for the breadth-first dump and for detaching them) and found through one tree-wide
// open-addressing table keyed by (parent index, tokens hash) (childTable). The worker set of a node is a bitmask over the tree's dp_rank slots
// (slot i = the i-th dp_rank seen); slots 64 and above live in the sparse tree.extra map. Per slot, a lookup map
// sends a block hash to the node that holds it.
//
// Lifetime (what Dynamo's reference counting gives): a node lives while it is attached (in its parent's children)
// or referenced by a lookup entry (node.refs). A node that loses its last worker has its children detached; a
// detached node without lookup references is freed with its detached subtree, and its index goes on a free list.
// An attached node without workers stays (Dynamo keeps it in its parent's map and reuses it, with its old block
// hash, when the same tokens hash is stored under that parent again).
//
// Owned by the Indexer; protected by Indexer.mu.

const (
	rootNode = uint32(0)
	nilNode  = ^uint32(0)
)

type node struct {
	blockHash  uint64 // engine hash (ExternalSequenceBlockHash); 0 for the root
	tokensHash uint64 // the edge key under parent (LocalBlockHash)
	workers    uint64 // bit i: dp slot i holds this block (slots >= 64 in tree.extra)
	parent     uint32 // nilNode when detached (and for the root)
	firstChild uint32 // nilNode when none; for a free node: next free index
	nextSib    uint32 // next child of the same parent
	refs       uint32 // lookup entries that point here
}

type slotState struct {
	dp     uint32
	lookup map[uint64]uint32 // block hash -> node index
}

type tree struct {
	nodes    []node
	freeHead uint32 // free list through node.firstChild; nilNode when empty
	live     int    // live nodes, root excluded
	children childTable
	slots    []slotState
	slotOf   map[uint32]int
	// extra holds worker bits of slots >= 64: extra[n][i] covers slots 64*(i+1) .. 64*(i+1)+63.
	extra map[uint32][]uint64
	stack []uint32 // scratch for freeing subtrees
}

func newTree() *tree {
	t := &tree{
		nodes:    make([]node, 1, 1024),
		freeHead: nilNode,
		slotOf:   make(map[uint32]int),
	}
	t.nodes[rootNode] = node{parent: nilNode, firstChild: nilNode, nextSib: nilNode}
	return t
}

// slot returns the slot of dp, creating it (with an empty lookup entry, as Dynamo does for every event).
func (t *tree) slot(dp uint32) int {
	if s, ok := t.slotOf[dp]; ok {
		return s
	}
	s := len(t.slots)
	t.slots = append(t.slots, slotState{dp: dp, lookup: make(map[uint64]uint32)})
	t.slotOf[dp] = s
	return s
}

// residentBlocks is Dynamo's current_size: the number of lookup entries over all slots.
func (t *tree) residentBlocks() int {
	n := 0
	for i := range t.slots {
		n += len(t.slots[i].lookup)
	}
	return n
}

func (t *tree) hasWorker(n uint32, s int) bool {
	if s < 64 {
		return t.nodes[n].workers&(1<<uint(s)) != 0
	}
	w := t.extra[n]
	i := s/64 - 1
	return i < len(w) && w[i]&(1<<uint(s%64)) != 0
}

func (t *tree) addWorker(n uint32, s int) {
	if s < 64 {
		t.nodes[n].workers |= 1 << uint(s)
		return
	}
	if t.extra == nil {
		t.extra = make(map[uint32][]uint64)
	}
	w := t.extra[n]
	i := s/64 - 1
	for len(w) <= i {
		w = append(w, 0)
	}
	w[i] |= 1 << uint(s%64)
	t.extra[n] = w
}

func (t *tree) removeWorker(n uint32, s int) {
	if s < 64 {
		t.nodes[n].workers &^= 1 << uint(s)
		return
	}
	w := t.extra[n]
	i := s/64 - 1
	if i >= len(w) {
		return
	}
	w[i] &^= 1 << uint(s%64)
	for _, x := range w {
		if x != 0 {
			return
		}
	}
	delete(t.extra, n)
}

func (t *tree) noWorkers(n uint32) bool {
	if t.nodes[n].workers != 0 {
		return false
	}
	_, ok := t.extra[n]
	return !ok
}

// workerCount returns the size of n's worker set.
func (t *tree) workerCount(n uint32) int {
	c := bits.OnesCount64(t.nodes[n].workers)
	for _, x := range t.extra[n] {
		c += bits.OnesCount64(x)
	}
	return c
}

func (t *tree) newNode(bh, th uint64) uint32 {
	t.live++
	nd := node{blockHash: bh, tokensHash: th, parent: nilNode, firstChild: nilNode, nextSib: nilNode}
	if n := t.freeHead; n != nilNode {
		t.freeHead = t.nodes[n].firstChild
		t.nodes[n] = nd
		return n
	}
	t.nodes = append(t.nodes, nd)
	return uint32(len(t.nodes) - 1)
}

func (t *tree) attach(c, p uint32, th uint64) {
	nc := &t.nodes[c]
	nc.parent = p
	nc.tokensHash = th
	nc.nextSib = t.nodes[p].firstChild
	t.nodes[p].firstChild = c
	t.childInsert(c)
}

// isAncestorOrSelf reports whether x is p or one of p's ancestors (following attachment up to a detached top).
func (t *tree) isAncestorOrSelf(x, p uint32) bool {
	for n := p; n != nilNode; n = t.nodes[n].parent {
		if n == x {
			return true
		}
	}
	return false
}

// clearChildren detaches every child of x (Dynamo's children.clear()); detached children without lookup
// references are freed with their subtrees.
func (t *tree) clearChildren(x uint32) {
	c := t.nodes[x].firstChild
	t.nodes[x].firstChild = nilNode
	for c != nilNode {
		nc := &t.nodes[c]
		next := nc.nextSib
		t.childDelete(c)
		nc.parent, nc.nextSib = nilNode, nilNode
		if nc.refs == 0 {
			t.free(c)
		}
		c = next
	}
}

// free releases the detached, unreferenced node x and every descendant that is left unreferenced.
func (t *tree) free(x uint32) {
	t.stack = append(t.stack[:0], x)
	for len(t.stack) > 0 {
		n := t.stack[len(t.stack)-1]
		t.stack = t.stack[:len(t.stack)-1]
		for c := t.nodes[n].firstChild; c != nilNode; {
			nc := &t.nodes[c]
			next := nc.nextSib
			t.childDelete(c)
			nc.parent, nc.nextSib = nilNode, nilNode
			if nc.refs == 0 {
				t.stack = append(t.stack, c)
			}
			c = next
		}
		if t.extra != nil {
			delete(t.extra, n)
		}
		t.nodes[n] = node{parent: nilNode, firstChild: t.freeHead, nextSib: nilNode}
		t.freeHead = n
		t.live--
	}
}

func (t *tree) unref(x uint32) {
	nx := &t.nodes[x]
	nx.refs--
	if nx.refs == 0 && nx.parent == nilNode {
		t.free(x)
	}
}

// setLookup points lookup[bh] of slot s at c, releasing the node it pointed at before.
func (t *tree) setLookup(lk map[uint64]uint32, bh uint64, c uint32) {
	t.nodes[c].refs++
	if old, ok := lk[bh]; ok {
		lk[bh] = c
		t.unref(old)
		return
	}
	lk[bh] = c
}

// store applies a Stored event for slot s (§3.2). Dynamo would attach a node found through the lookup under
// a second parent (a DAG, or a cycle its dump never leaves); this tree stays a tree: a lookup hit that is p or an
// ancestor of p is InvalidBlockSequence, a hit attached elsewhere is not reused (a new node is made and the old
// one keeps its workers, as when Dynamo overwrites a lookup entry).
func (t *tree) store(s int, hasParent bool, parent uint64, blocks []Block) Status {
	lk := t.slots[s].lookup
	p := rootNode
	if hasParent {
		x, ok := lk[parent]
		if !ok {
			return StatusParentNotFound
		}
		p = x
	}
	for _, b := range blocks {
		c, ok := t.child(p, b.TokensHash)
		if ok && t.noWorkers(c) {
			// No worker holds c: Dynamo 1.6.1 has pruned it (its store then makes a new node), so c takes the new
			// block hash and starts empty (contract decision 3: store 101, 102 under it, remove 102, store 103 with
			// 102's tokens: the dump says 101 -> 103).
			t.clearChildren(c)
			t.nodes[c].blockHash = b.BlockHash
		}
		if !ok {
			x, hit := lk[b.BlockHash]
			switch {
			case hit && t.isAncestorOrSelf(x, p):
				return StatusInvalidBlockSequence
			case hit && t.nodes[x].parent == nilNode:
				c = x
			default:
				c = t.newNode(b.BlockHash, b.TokensHash)
			}
			t.attach(c, p, b.TokensHash)
		}
		t.setLookup(lk, b.BlockHash, c)
		t.addWorker(c, s)
		p = c
	}
	return StatusOK
}

// remove applies a Removed event for slot s (§3.3): best effort, first error.
func (t *tree) remove(s int, hashes []uint64) Status {
	lk := t.slots[s].lookup
	st := StatusOK
	for _, h := range hashes {
		x, ok := lk[h]
		if !ok {
			st = StatusBlockNotFound
			continue
		}
		t.removeWorker(x, s)
		if t.noWorkers(x) {
			t.clearChildren(x)
		}
		delete(lk, h)
		t.unref(x)
	}
	return st
}

// clearAll applies a Cleared event (§3.4, worker-wide): every slot's blocks are dropped; the slots keep empty
// lookup entries.
func (t *tree) clearAll() {
	for s := range t.slots {
		for _, x := range t.slots[s].lookup {
			t.removeWorker(x, s)
			if t.noWorkers(x) {
				t.clearChildren(x)
			}
		}
	}
	for s := range t.slots {
		lk := t.slots[s].lookup
		t.slots[s].lookup = make(map[uint64]uint32)
		for _, x := range lk {
			t.unref(x)
		}
	}
}

// findMatches computes Dynamo's overlap scores (§3.6, variant A) into scores (indexed by slot; 0 = no score).
func (t *tree) findMatches(seq []uint64, earlyExit bool, scores []uint32) {
	if len(seq) == 0 {
		return
	}
	cur, ok := t.child(rootNode, seq[0])
	if !ok {
		return
	}
	nw := len(t.slots)
	active := make([]bool, nw)
	count := 0
	for s := 0; s < nw; s++ {
		if t.hasWorker(cur, s) {
			active[s] = true
			count++
		}
	}
	if count == 0 {
		return
	}
	depth := uint32(1)
	if !(earlyExit && count == 1) {
		for idx := 1; idx < len(seq); idx++ {
			c, ok := t.child(cur, seq[idx])
			if !ok {
				break
			}
			if t.workerCount(c) != count {
				for s := 0; s < nw; s++ {
					if active[s] && !t.hasWorker(c, s) {
						scores[s] = depth
						active[s] = false
						count--
					}
				}
			}
			if count == 0 {
				break
			}
			depth = uint32(idx + 1)
			cur = c
			if earlyExit && count == 1 {
				break
			}
		}
	}
	for s := 0; s < nw; s++ {
		if active[s] {
			scores[s] = depth
		}
	}
}

// childTable finds attached children by (parent, tokens hash): an open-addressing hash table (linear probing,
// backward-shift deletion) of node indices whose keys are read from the nodes themselves, 4 bytes per slot
// instead of a Go map's 24-byte entries. A node's parent and tokensHash must not change while it is in the table.
type childTable struct {
	slots []uint32 // nilNode = empty; len is a power of two
	n     int
}

func childHash(parent uint32, th uint64) uint64 {
	h := th ^ (uint64(parent)+1)*0x9e3779b97f4a7c15
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// child returns the attached child of p under tokens hash th.
func (t *tree) child(p uint32, th uint64) (uint32, bool) {
	ct := &t.children
	if ct.n == 0 {
		return nilNode, false
	}
	mask := uint64(len(ct.slots) - 1)
	for i := childHash(p, th) & mask; ; i = (i + 1) & mask {
		c := ct.slots[i]
		if c == nilNode {
			return nilNode, false
		}
		if nd := &t.nodes[c]; nd.parent == p && nd.tokensHash == th {
			return c, true
		}
	}
}

// childInsert adds the attached node c (its parent and tokensHash set; not already present).
func (t *tree) childInsert(c uint32) {
	ct := &t.children
	if (ct.n+1)*4 > len(ct.slots)*3 {
		t.childGrow()
	}
	mask := uint64(len(ct.slots) - 1)
	i := childHash(t.nodes[c].parent, t.nodes[c].tokensHash) & mask
	for ct.slots[i] != nilNode {
		i = (i + 1) & mask
	}
	ct.slots[i] = c
	ct.n++
}

func (t *tree) childGrow() {
	ct := &t.children
	old := ct.slots
	size := max(16, 2*len(old))
	ct.slots = make([]uint32, size)
	for i := range ct.slots {
		ct.slots[i] = nilNode
	}
	ct.n = 0
	for _, c := range old {
		if c != nilNode {
			t.childInsert(c)
		}
	}
}

// childDelete removes node c (still carrying its parent and tokensHash) from the table.
func (t *tree) childDelete(c uint32) {
	ct := &t.children
	mask := uint64(len(ct.slots) - 1)
	i := childHash(t.nodes[c].parent, t.nodes[c].tokensHash) & mask
	for ct.slots[i] != c {
		if ct.slots[i] == nilNode {
			return // not present
		}
		i = (i + 1) & mask
	}
	ct.slots[i] = nilNode
	ct.n--
	// Backward shift: move later entries of the probe run into the hole when their home is not in (i, j].
	for j := (i + 1) & mask; ct.slots[j] != nilNode; j = (j + 1) & mask {
		k := childHash(t.nodes[ct.slots[j]].parent, t.nodes[ct.slots[j]].tokensHash) & mask
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			ct.slots[i] = ct.slots[j]
			ct.slots[j] = nilNode
			i = j
		}
	}
}
