package index

import "testing"

// TestTokenStoreNeverMovesWindows: storing blocks never copies the windows already stored. The arena grows by
// fixed-size chunks; a flat slice regrown by append copied every window on the drain path at each growth (an
// O(index) memmove: a 25-50 ms publish stall every ~25% of index growth at 1,000 batches/s). Failed before: the
// first window moved.
func TestTokenStoreNeverMovesWindows(t *testing.T) {
	const bs = 4
	ts := newTokenStore(bs)
	le := make([]byte, 4*bs)
	for i := range le {
		le[i] = byte(i)
	}
	src := &tokenSrc{le: le, bs: bs}
	ts.set(1, src, 0)
	first := &ts.window(1)[0]
	for n := uint32(2); n < 100_000; n++ {
		ts.set(n, src, 0)
		if &ts.window(1)[0] != first {
			t.Fatalf("storing node %d moved node 1's window: the arena was copied", n)
		}
	}
	if w := ts.window(99_999); len(w) != bs || w[0] != 0x03020100 {
		t.Fatalf("window of node 99999 = %v", w)
	}
	if ts.window(100_000) != nil {
		t.Fatal("a node never stored has a window")
	}
}
