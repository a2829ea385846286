package index

import (
	"math/rand/v2"
	"testing"
)

// TestChildTable checks the open-addressing children table against a Go map through random attach/detach
// cycles, with few distinct tokens hashes so probe runs collide and wrap.
func TestChildTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	tr := newTree()
	type key struct {
		p  uint32
		th uint64
	}
	want := map[key]uint32{}
	var attached []uint32
	for step := range 20000 {
		if len(attached) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(attached))
			c := attached[i]
			nd := &tr.nodes[c]
			delete(want, key{nd.parent, nd.tokensHash})
			tr.childDelete(c)
			nd.parent = nilNode
			attached[i] = attached[len(attached)-1]
			attached = attached[:len(attached)-1]
		} else {
			p := rootNode
			if len(attached) > 0 && rng.IntN(2) == 0 {
				p = attached[rng.IntN(len(attached))]
			}
			th := uint64(rng.IntN(8))
			if _, ok := want[key{p, th}]; !ok {
				c := tr.newNode(uint64(step), th)
				tr.nodes[c].parent, tr.nodes[c].tokensHash = p, th
				tr.childInsert(c)
				want[key{p, th}] = c
				attached = append(attached, c)
			}
		}
		if tr.children.n != len(want) {
			t.Fatalf("step %d: table holds %d, want %d", step, tr.children.n, len(want))
		}
		if step%100 == 0 {
			for k, v := range want {
				if got, ok := tr.child(k.p, k.th); !ok || got != v {
					t.Fatalf("step %d: child(%d,%d) = %d,%v, want %d", step, k.p, k.th, got, ok, v)
				}
			}
			if _, ok := tr.child(rootNode, 1000); ok {
				t.Fatalf("step %d: found an absent key", step)
			}
		}
	}
}

// checkTree fails the test when ix's tree breaks an invariant (tree.check).
func checkTree(t testing.TB, ix *Indexer, when string) {
	t.Helper()
	ix.mu.RLock()
	err := ix.tree.check()
	ix.mu.RUnlock()
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
}
