package index

import "math/bits"

// The radix tree (one node per block, with 1.6.1's compressed edges recorded as node flags) of one stream,
// stored as a compact arena.
//
// Node identity is a uint32 index into tree.nodes; index 0 is the root. A node's children are linked through
// firstChild/nextSib (for the breadth-first dump and for detaching them) and found through one tree-wide
// open-addressing table keyed by (parent index, tokens hash) (childTable). The worker set of a node is a bitmask
// over the tree's dp_rank slots (slot i = the i-th dp_rank seen); slots 64 and above live in the sparse tree.extra
// map. Per slot, a lookup map sends a block hash to the node that holds it. tree.flags holds each node's edge flags.
//
// Lifetime (what reference counting gives Dynamo): a node lives while it is attached (in its parent's children)
// or referenced by a lookup entry (node.refs). A node that loses its last worker has its children detached, except
// an unheld, unreferenced block that continues its edge (kept, as 1.6.1 keeps uncovered blocks in an edge); a
// detached node without lookup references is freed with its detached subtree, and its index goes on a free list.
// An attached node without workers stays; a store reaching it by its tokens reuses it in place with the new block
// hash (1.6.1 would have pruned it and made a new node).
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

// Edge flags, one byte per node in tree.flags. The tree has one node per block, but 1.6.1's radix tree is
// compressed (an edge holds a run of blocks) and its dump groups blocks by those edges and by how far each worker
// covers them; the flags record where 1.6.1's edges begin and end so that the dump groups blocks as 1.6.1 does.
// flagEdge marks a node that begins an edge (every child of the root does); the other nodes of an edge hang as
// the only "in-edge" child (flagEdge clear) of the node before them. flagInternal marks the last node of an edge
// that has had edges attached below it (1.6.1's `internal`: such an edge is never extended again).
const (
	flagEdge     uint8 = 1
	flagInternal uint8 = 2
)

type tree struct {
	nodes    []node
	flags    []uint8 // per node (edge flags); len(flags) == len(nodes)
	freeHead uint32  // free list through node.firstChild; nilNode when empty
	live     int     // live nodes, root excluded
	children childTable
	slots    []slotState
	slotOf   map[uint32]int
	// extra holds worker bits of slots >= 64: extra[n][i] covers slots 64*(i+1) .. 64*(i+1)+63.
	extra map[uint32][]uint64
	stack []uint32 // scratch for freeing subtrees
	// tok holds every node's token window (Config.KeepTokens; tokens.go); nil when off.
	tok *tokenStore
}

func newTree() *tree {
	t := &tree{
		nodes:    make([]node, 1, 1024),
		flags:    make([]uint8, 1, 1024),
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
		t.flags[n] = 0
		if t.tok != nil {
			t.tok.forget(n) // free forgot it too; a restored arena is not trusted to have
		}
		return n
	}
	t.nodes = append(t.nodes, nd)
	t.flags = append(t.flags, 0)
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
func (t *tree) clearChildren(x uint32) { t.detachChildren(x, false) }

// prune detaches the children of x, which no worker holds any more (1.6.1's prune_unreachable), except an
// in-edge child no worker holds either and no lookup entry names: 1.6.1 keeps the uncovered blocks of an edge in
// the edge (they decide whether a later store re-covers, extends or splits it), and so does this tree. (A child a
// lookup still names, through a second hash of the same tokens, is detached as before, so that the lookup rules
// of store see it as detached.)
func (t *tree) prune(x uint32) { t.detachChildren(x, true) }

func (t *tree) detachChildren(x uint32, keepEmptyEdge bool) {
	c := t.nodes[x].firstChild
	t.nodes[x].firstChild = nilNode
	for c != nilNode {
		nc := &t.nodes[c]
		next := nc.nextSib
		if keepEmptyEdge && t.flags[c]&flagEdge == 0 && t.noWorkers(c) && nc.refs == 0 {
			nc.nextSib = t.nodes[x].firstChild
			t.nodes[x].firstChild = c
			c = next
			continue
		}
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
		if t.tok != nil {
			t.tok.forget(n)
		}
		t.nodes[n] = node{parent: nilNode, firstChild: t.freeHead, nextSib: nilNode}
		t.flags[n] = 0
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

// store applies a Stored event for slot s (upstream radix_tree.rs apply_stored). Dynamo would attach a node found through the lookup under a second
// parent in its older versions (a DAG, or a cycle its dump never leaves); this tree stays a tree: a lookup hit that
// is p or an ancestor of p is InvalidBlockSequence, a hit attached elsewhere is not reused (a new node is made and
// the old one keeps its workers, as when a lookup entry is overwritten). The edge flags follow 1.6.1's
// apply_stored: a store under a block inside an edge splits the edge there unless it only re-covers or extends
// that edge's own blocks; a new block extends the edge of its parent when the parent ends a leaf edge the worker
// holds to its end, else it begins an edge.
func (t *tree) store(s int, hasParent bool, parent uint64, blocks []Block, src *tokenSrc) Status {
	lk := t.slots[s].lookup
	p := rootNode
	if hasParent {
		x, ok := lk[parent]
		if !ok {
			return StatusParentNotFound
		}
		p = x
		if y := t.inEdgeChild(x); y != nilNode && !t.edgeTakes(y, blocks) {
			t.split(x, y)
		}
	}
	for i, b := range blocks {
		c, ok := t.child(p, b.TokensHash)
		stale := nilNode
		if ok && t.noWorkers(c) {
			// No worker holds c: it counts as absent (1.6.1 has pruned it) and is reused in place when a node is
			// needed (below).
			stale, ok = c, false
		}
		if !ok {
			x, hit := lk[b.BlockHash]
			switch {
			case hit && t.isAncestorOrSelf(x, p):
				return StatusInvalidBlockSequence
			case hit && t.nodes[x].parent == nilNode:
				if stale != nilNode {
					t.detachChild(p, stale)
				}
				c = x
				t.attachEdge(c, p, b.TokensHash, s, false)
			case stale != nilNode:
				// The stale node takes the new block hash (the stale-block-hash decision, docs/decisions.md: store 101, 102 under it, remove
				// 102, store 103 with 102's tokens: the dump says 101 -> 103). Where it begins an edge, 1.6.1 has
				// pruned it and makes a fresh node: so it starts empty. Inside an edge 1.6.1 keeps the edge (and
				// the old hash: a deviation, see doc.go), and so does this tree (its successors are unheld).
				c = stale
				if t.flags[c]&flagEdge != 0 {
					t.clearChildren(c)
					t.flags[c] &^= flagInternal
				}
				t.nodes[c].blockHash = b.BlockHash
			default:
				c = t.newNode(b.BlockHash, b.TokensHash)
				t.attachEdge(c, p, b.TokensHash, s, true)
			}
		}
		t.setLookup(lk, b.BlockHash, c)
		t.addWorker(c, s)
		if t.tok != nil && src != nil {
			t.tok.set(c, src, i)
		}
		p = c
	}
	return StatusOK
}

// detachChild detaches c from its parent p (a linear walk of p's children: only for a stale child replaced by a
// re-attached one, a rare path), freeing it when no lookup entry refers to it.
func (t *tree) detachChild(p, c uint32) {
	if t.nodes[p].firstChild == c {
		t.nodes[p].firstChild = t.nodes[c].nextSib
	} else {
		for n := t.nodes[p].firstChild; n != nilNode; n = t.nodes[n].nextSib {
			if t.nodes[n].nextSib == c {
				t.nodes[n].nextSib = t.nodes[c].nextSib
				break
			}
		}
	}
	t.childDelete(c)
	t.nodes[c].parent, t.nodes[c].nextSib = nilNode, nilNode
	if t.nodes[c].refs == 0 {
		t.free(c)
	}
}

// inEdgeChild returns the child of n that continues n's edge, or nilNode when n ends its edge.
func (t *tree) inEdgeChild(n uint32) uint32 {
	for c := t.nodes[n].firstChild; c != nilNode; c = t.nodes[c].nextSib {
		if t.flags[c]&flagEdge == 0 {
			return c
		}
	}
	return nilNode
}

// edgeTakes reports whether a store of blocks under the node before y (y continuing its edge) leaves the edge
// whole, as 1.6.1's try_reuse_parent_edge: the blocks equal (tokens and block hashes) the edge's next blocks, or
// the edge's remaining blocks are a prefix of them and the edge may still be extended (not internal).
func (t *tree) edgeTakes(y uint32, blocks []Block) bool {
	n, last := y, y
	for _, b := range blocks {
		if n == nilNode {
			return t.flags[last]&flagInternal == 0
		}
		if t.nodes[n].tokensHash != b.TokensHash || t.nodes[n].blockHash != b.BlockHash {
			return false
		}
		last, n = n, t.inEdgeChild(n)
	}
	return true
}

// split ends x's edge at x: y (x's in-edge child) begins an edge of its own.
func (t *tree) split(x, y uint32) {
	t.flags[y] |= flagEdge
	t.flags[x] |= flagInternal
}

// attachEdge attaches the new (or re-attached) node c under p and sets its edge flags: it extends p's edge when
// p is not the root, ends its edge (splitting it if p is inside it), the edge is not internal and slot s holds p;
// else it begins an edge and p's edge becomes internal. fresh says c carries no children of its own.
func (t *tree) attachEdge(c, p uint32, th uint64, s int, fresh bool) {
	ext := false
	if p != rootNode {
		if y := t.inEdgeChild(p); y != nilNode {
			t.split(p, y)
		} else {
			ext = t.flags[p]&flagInternal == 0 && t.hasWorker(p, s) && fresh
		}
	}
	t.attach(c, p, th)
	if ext {
		t.flags[c] &^= flagEdge
		return
	}
	t.flags[c] |= flagEdge
	if p != rootNode {
		t.flags[p] |= flagInternal
	}
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
		if own := t.nodes[x].blockHash; own != h && lk[own] == x {
			// h is a second hash of a block this rank still holds under its own hash (the same tokens stored
			// again under the same parent): the rank keeps the block. Only the alias goes (1.6.1 never indexed
			// it: BlockNotFound, nothing changes).
			delete(lk, h)
			t.unref(x)
			st = StatusBlockNotFound
			continue
		}
		t.removeWorker(x, s)
		if t.noWorkers(x) {
			t.prune(x)
		}
		delete(lk, h)
		t.unref(x)
	}
	return st
}

// clearAll applies a Cleared event (upstream radix_tree.rs clear_all_blocks; worker-wide): every slot's blocks are dropped; the slots keep empty
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

// findMatches computes Dynamo's overlap scores (upstream radix_tree.rs find_matches; one node per block) into scores (indexed by slot; 0 = no score).
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
