package daemon

import (
	"path/filepath"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
)

// BenchmarkDrainBatch measures the drain path alone (Reader.Next, fbs.Decode, index apply, per-batch counters,
// Release): each op fills the ring with one batch of Cleared events on an empty tree (the cheapest apply, so the
// drain's own overhead dominates) outside the timer and drains it with drainBatch.
func BenchmarkDrainBatch(b *testing.B) {
	path := filepath.Join(b.TempDir(), "bench.ring")
	w, err := shm.Create(path, shm.Options{Capacity: 1 << 20, WorkerID: 1, KVBlockSize: 4, MaxBufferSize: 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	r, err := shm.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	ix, err := index.New(index.Config{WorkerID: 1, BlockSize: 4, MaxBufferSize: 1024})
	if err != nil {
		b.Fatal(err)
	}
	st := &stream{key: streamKey{worker: 1}, ix: ix}
	a := &attachment{st: st, r: r, ix: ix, log: testLogger(b)}
	fb := flatbuffers.NewBuilder(256)
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for range maxBatch {
			ev := fbs.EventSpec{Seq: seq, Kind: fbs.KindCleared}
			seq++
			if !w.Append(shm.TypeEvent, fbs.Build(fb, &ev)) {
				b.Fatal("ring full")
			}
		}
		w.Publish()
		b.StartTimer()
		if n := a.drainBatch(); n != maxBatch {
			b.Fatalf("drained %d records, want %d", n, maxBatch)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*maxBatch), "ns/record")
}
