package index

import (
	"errors"
	"fmt"
)

// errTreeInvariant is wrapped by every error check returns.
var errTreeInvariant = errors.New("kvshm/index: tree invariant violated")

// check verifies the tree's structural invariants and returns the first violation, wrapping errTreeInvariant. It
// is O(nodes + lookup entries + child table) and allocates: the model tests run it after every step, the fuzz
// targets after every input, and a build with the invariants tag after every applied event (checkInvariants).
//
//   - Arena: node 0 is the root (no parent, no sibling, no workers); the free list is a chain of distinct free nodes
//     (no parent, no sibling, no references); live counts every other node.
//   - Forest: every live node is reached exactly once walking firstChild/nextSib down from the root or from a
//     detached top (a live non-root node without a parent); each child's parent is the node whose list holds it
//     (parent/child symmetry); a detached top is referenced by a lookup entry (else it would have been freed).
//   - Child table: it holds exactly the attached nodes, each found by child(parent, tokensHash), so no two
//     siblings share a tokens hash.
//   - Lookup maps ↔ nodes: slotOf and slots agree; every lookup entry points at a live non-root node; each node's
//     refs equals the number of lookup entries pointing at it.
//   - Worker sets: bits only for existing slots; extra only for live nodes, with a nonzero word, for slots ≥ 64.
//     Not checked: that a node without workers has no children (reachable states have such nodes; the model tests
//     find them).
func (t *tree) check() error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errTreeInvariant, fmt.Sprintf(format, args...))
	}
	n := uint32(len(t.nodes))
	if n == 0 {
		return fail("no root")
	}
	if r := t.nodes[rootNode]; r.parent != nilNode || r.nextSib != nilNode || r.workers != 0 || r.refs != 0 {
		return fail("root %+v", r)
	}
	if _, ok := t.extra[rootNode]; ok {
		return fail("root has extra worker bits")
	}
	// Free list.
	free := make([]bool, n)
	nfree := 0
	for x := t.freeHead; x != nilNode; x = t.nodes[x].firstChild {
		switch {
		case x >= n || x == rootNode:
			return fail("free list holds node %d (arena %d)", x, n)
		case free[x]:
			return fail("free list loops at node %d", x)
		}
		free[x] = true
		nfree++
		if nd := t.nodes[x]; nd.parent != nilNode || nd.nextSib != nilNode || nd.refs != 0 || nd.workers != 0 {
			return fail("free node %d %+v", x, nd)
		}
	}
	if t.live != int(n)-1-nfree {
		return fail("live = %d, arena %d holds %d free nodes", t.live, n, nfree)
	}
	// Forest: walk down from the root and from every detached top.
	seen := make([]bool, n)
	attached := 0
	walk := func(top uint32) error {
		stack := []uint32{top}
		seen[top] = true
		for len(stack) > 0 {
			p := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for c := t.nodes[p].firstChild; c != nilNode; c = t.nodes[c].nextSib {
				switch {
				case c >= n || c == rootNode || free[c]:
					return fail("node %d lists child %d (free or out of the arena)", p, c)
				case seen[c]:
					return fail("node %d is reached twice (child of %d)", c, p)
				case t.nodes[c].parent != p:
					return fail("node %d is in %d's children but its parent is %d", c, p, t.nodes[c].parent)
				}
				seen[c] = true
				attached++
				if got, ok := t.child(p, t.nodes[c].tokensHash); !ok || got != c {
					return fail("child table finds %d (%v) for node %d under %d", got, ok, c, p)
				}
				stack = append(stack, c)
			}
		}
		return nil
	}
	if err := walk(rootNode); err != nil {
		return err
	}
	for x := uint32(1); x < n; x++ {
		if free[x] || t.nodes[x].parent != nilNode {
			continue
		}
		if t.nodes[x].nextSib != nilNode {
			return fail("detached node %d has a sibling %d", x, t.nodes[x].nextSib)
		}
		if t.nodes[x].refs == 0 {
			return fail("detached node %d has no lookup reference (not freed)", x)
		}
		if err := walk(x); err != nil {
			return err
		}
	}
	for x := uint32(1); x < n; x++ {
		if !free[x] && !seen[x] {
			return fail("live node %d (parent %d) is reached from no top", x, t.nodes[x].parent)
		}
	}
	// Child table.
	if t.children.n != attached {
		return fail("child table holds %d nodes, %d are attached", t.children.n, attached)
	}
	inTable := 0
	for _, c := range t.children.slots {
		if c == nilNode {
			continue
		}
		inTable++
		if c >= n || free[c] || t.nodes[c].parent == nilNode {
			return fail("child table holds node %d, which is not attached", c)
		}
	}
	if inTable != t.children.n {
		return fail("child table counts %d nodes, holds %d", t.children.n, inTable)
	}
	// Lookup maps and references.
	if len(t.slotOf) != len(t.slots) {
		return fail("%d slots, %d in slotOf", len(t.slots), len(t.slotOf))
	}
	refs := make([]uint32, n)
	for s, ss := range t.slots {
		if t.slotOf[ss.dp] != s {
			return fail("slot %d holds dp_rank %d, slotOf says %d", s, ss.dp, t.slotOf[ss.dp])
		}
		for bh, x := range ss.lookup {
			if x >= n || x == rootNode || free[x] {
				return fail("slot %d: lookup[%d] = node %d, not a live node", s, bh, x)
			}
			refs[x]++
		}
	}
	for x := uint32(1); x < n; x++ {
		if !free[x] && t.nodes[x].refs != refs[x] {
			return fail("node %d has refs %d, %d lookup entries point at it", x, t.nodes[x].refs, refs[x])
		}
	}
	// Worker sets.
	if len(t.slots) < 64 {
		for x := uint32(1); x < n; x++ {
			if w := t.nodes[x].workers; w>>uint(len(t.slots)) != 0 {
				return fail("node %d has worker bits %#x beyond %d slots", x, w, len(t.slots))
			}
		}
	}
	for x, w := range t.extra {
		switch {
		case x >= n || free[x]:
			return fail("extra worker bits for node %d, which is not live", x)
		case len(w) == 0 || 64*(len(w)+1) > len(t.slots)+63:
			return fail("node %d has %d extra words for %d slots", x, len(w), len(t.slots))
		}
		nonzero := false
		for _, v := range w {
			nonzero = nonzero || v != 0
		}
		if !nonzero {
			return fail("node %d has extra words, all zero", x)
		}
	}
	return nil
}
