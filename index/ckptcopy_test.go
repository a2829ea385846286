package index

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestCheckpointCopy: a CheckpointCopy encodes to the bytes WriteCheckpoint gave when it was taken, even while (and
// after) the writer goes on applying events; the token arena and its LoRA names are copied too.
func TestCheckpointCopy(t *testing.T) {
	for s := range uint64(6) {
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			d := newCkDriver(s + 1)
			ix, _ := New(Config{WorkerID: 9, BlockSize: 2, MaxBufferSize: 1 + d.rng.IntN(40)})
			for round := range 6 {
				for range d.rng.IntN(120) {
					d.step(ix)
				}
				want := checkpointBytes(t, ix, []byte("m"))
				c := ix.CheckpointCopy()
				done := make(chan []byte)
				go func() { // encoded concurrently with the writer (-race)
					var b bytes.Buffer
					if err := c.WriteCheckpoint(&b, []byte("m")); err != nil {
						t.Error(err)
					}
					done <- b.Bytes()
				}()
				for range 80 {
					d.step(ix)
				}
				if got := <-done; !bytes.Equal(got, want) {
					t.Fatalf("round %d: copy encodes to %d bytes differing from the index's %d at the copy", round, len(got), len(want))
				}
			}
		})
	}
	ix := tokenIndex(t)
	want := checkpointBytes(t, ix, nil)
	c := ix.CheckpointCopy()
	rng := rand.New(rand.NewPCG(3, 3))
	for i, e := range makeStored(rng, 20, 4, 4) {
		if _, err := ix.ApplyStoredTokens(uint64(1000+i), 0, false, 0, e.hashesLE, e.tokensLE, nil, false); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if err := c.WriteCheckpoint(&b, nil); err != nil || !bytes.Equal(b.Bytes(), want) {
		t.Fatalf("token copy: err %v, equal %v", err, bytes.Equal(b.Bytes(), want))
	}
}

// BenchmarkCheckpointCopy is the drain worker's share of an asynchronous checkpoint (compare BenchmarkWriteCheckpoint).
func BenchmarkCheckpointCopy(b *testing.B) {
	for _, n := range []int{100_000, 200_000} {
		ix := storedIndex(b, n)
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			for b.Loop() {
				_ = ix.CheckpointCopy()
			}
		})
	}
}
