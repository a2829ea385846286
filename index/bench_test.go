package index

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// Benchmarks. Run (numbers in the closing note):
//
//	go test ./index -run '^$' -bench 'ApplyStored|ApplyRemoved|EventsReply' -benchtime 2s
//	go test ./index -run '^$' -bench 'TreeDump|HeapPerBlock' -benchtime 3x
//
// Targets: >= 2M blocks/s for 32-block Stored events on one core (hashing included), <= 150 heap bytes per
// resident block at 1M blocks, TreeDump JSON of 1M blocks in < 1 s.

// storedInput is one Stored event as the drain loop sees it: little-endian vectors from a FlatBuffer.
type storedInput struct {
	hashesLE, tokensLE []byte
	hashes             []uint64
}

// makeStored returns n events of nblocks fresh random blocks with bs random tokens each (no shared prefixes:
// the worst case, one new node per block).
func makeStored(rng *rand.Rand, n, nblocks, bs int) []storedInput {
	out := make([]storedInput, n)
	for i := range out {
		in := storedInput{hashesLE: make([]byte, 8*nblocks), tokensLE: make([]byte, 4*nblocks*bs)}
		for j := range nblocks {
			h := rng.Uint64()
			in.hashes = append(in.hashes, h)
			binary.LittleEndian.PutUint64(in.hashesLE[8*j:], h)
		}
		for j := 0; j < len(in.tokensLE); j += 4 {
			binary.LittleEndian.PutUint32(in.tokensLE[j:], uint32(rng.IntN(128000)))
		}
		out[i] = in
	}
	return out
}

func BenchmarkApplyStored(b *testing.B) {
	for _, c := range []struct {
		nb   int
		keep bool
	}{{1, false}, {32, false}, {1, true}, {32, true}} {
		nb := c.nb
		b.Run(fmt.Sprintf("blocks=%d/tokens=32/keep_tokens=%v", nb, c.keep), func(b *testing.B) {
			const batch = 4096
			in := makeStored(rand.New(rand.NewPCG(1, 1)), batch, nb, 32)
			ix, _ := New(Config{WorkerID: 1, BlockSize: 32, MaxBufferSize: 10000, KeepTokens: c.keep})
			b.SetBytes(int64(len(in[0].tokensLE)))
			b.ReportAllocs()
			var id uint64
			start := time.Now()
			paused := time.Duration(0)
			for b.Loop() {
				k := int(id % batch)
				if k == 0 && id > 0 {
					// Every batch: clear the tree (not timed) so the index stays at batch*nb resident blocks.
					b.StopTimer()
					t0 := time.Now()
					id++
					ix.Apply(&Event{ID: id, Kind: KindCleared})
					paused += time.Since(t0)
					b.StartTimer()
				}
				id++
				if _, err := ix.ApplyStoredTokens(id, 0, false, 0, in[k].hashesLE, in[k].tokensLE, nil, false); err != nil {
					b.Fatal(err)
				}
			}
			el := time.Since(start) - paused
			b.ReportMetric(float64(b.N*nb)/el.Seconds(), "blocks/s")
		})
	}
}

func BenchmarkApplyRemoved(b *testing.B) {
	b.Run("blocks=32", func(b *testing.B) {
		const batch = 4096
		in := makeStored(rand.New(rand.NewPCG(2, 2)), batch, 32, 32)
		ix, _ := New(Config{WorkerID: 1, BlockSize: 32, MaxBufferSize: 10000})
		var id uint64
		fill := func() {
			for k := range in {
				id++
				if _, err := ix.ApplyStoredTokens(id, 0, false, 0, in[k].hashesLE, in[k].tokensLE, nil, false); err != nil {
					b.Fatal(err)
				}
			}
		}
		fill()
		b.SetBytes(8 * 32)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if i == batch {
				b.StopTimer()
				fill()
				i = 0
				b.StartTimer()
			}
			id++
			if _, err := ix.Apply(&Event{ID: id, Kind: KindRemoved, Hashes: in[i].hashes}); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(b.N*32)/b.Elapsed().Seconds(), "blocks/s")
	})
}

// fillBlocks builds an index with n resident blocks in chains of 32 fresh blocks.
func fillBlocks(tb testing.TB, n int) *Indexer {
	rng := rand.New(rand.NewPCG(3, 3))
	ix, _ := New(Config{WorkerID: 1, BlockSize: 32, MaxBufferSize: 10000})
	tokens := makeStored(rng, 1, 32, 32)[0].tokensLE
	hashes := make([]byte, 8*32)
	for id := uint64(1); int(id-1)*32 < n; id++ {
		for j := range 32 {
			binary.LittleEndian.PutUint64(hashes[8*j:], rng.Uint64())
			binary.LittleEndian.PutUint32(tokens[4*32*j:], rng.Uint32()) // a new tokens hash for every block
		}
		if _, err := ix.ApplyStoredTokens(id, uint32(id%2), false, 0, hashes, tokens, nil, false); err != nil {
			tb.Fatal(err)
		}
	}
	return ix
}

func BenchmarkTreeDump(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			ix := fillBlocks(b, n)
			b.ReportAllocs()
			var size int
			for b.Loop() {
				snap, msg := ix.buildDump(rankFilter{})
				if msg != "" {
					b.Fatal(msg)
				}
				size = len(snap.encode())
			}
			b.SetBytes(int64(size))
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/dump")
			b.ReportMetric(float64(size)/float64(n), "B/block")
		})
	}
}

func BenchmarkEventsReply(b *testing.B) {
	// events=10: the newest ten, what a consumer catching up asks (bench/recovery_bench.py's events10).
	for _, c := range []struct{ events, nb int }{{10000, 1}, {10000, 32}, {10, 32}} {
		nb := c.nb
		b.Run(fmt.Sprintf("events=%d/blocks=%d", c.events, nb), func(b *testing.B) {
			in := makeStored(rand.New(rand.NewPCG(4, 4)), 10000, nb, 32)
			ix, _ := New(Config{WorkerID: 1, BlockSize: 32, MaxBufferSize: 10000})
			for i := range in {
				if _, err := ix.ApplyStoredTokens(uint64(i+1), 0, false, 0, in[i].hashesLE, in[i].tokensLE, nil, false); err != nil {
					b.Fatal(err)
				}
			}
			start := uint64(10000 - c.events + 1)
			ctx := context.Background()
			b.ReportAllocs()
			var size int
			for b.Loop() {
				r, err := ix.Recover(ctx, &start, nil)
				if err != nil || r.Kind != RespEvents || r.NumEvents != c.events {
					b.Fatalf("%v %v %d", err, r.Kind, r.NumEvents)
				}
				size = len(r.JSON)
			}
			b.SetBytes(int64(size))
		})
	}
}

// BenchmarkHeapPerBlock measures live heap per resident block (tree + lookup + a 10k-event log) at 1M blocks.
// impl=maps is the baseline measured in the same run: the test model, shaped like Dynamo's tree (a node per
// block holding a children map and a worker set, per-rank lookup maps), fed the same blocks.
func BenchmarkHeapPerBlock(b *testing.B) {
	const n = 1_000_000
	b.Run(fmt.Sprintf("impl=maps/blocks=%d", n), func(b *testing.B) {
		b.ReportAllocs()
		var perBlock float64
		for b.Loop() {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			rng := rand.New(rand.NewPCG(3, 3))
			mt := newMTree()
			blocks := make([]Block, 32)
			for id := 0; id*32 < n; id++ {
				for j := range blocks {
					blocks[j] = Block{rng.Uint64(), rng.Uint64()}
				}
				mt.store(uint32(id%2), false, 0, blocks)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			perBlock = float64(after.HeapAlloc-before.HeapAlloc) / n
			runtime.KeepAlive(mt)
		}
		b.ReportMetric(perBlock, "heap-B/block")
	})
	b.Run(fmt.Sprintf("impl=arena/blocks=%d", n), func(b *testing.B) {
		b.ReportAllocs()
		var perBlock float64
		for b.Loop() {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			ix := fillBlocks(b, n)
			runtime.GC()
			runtime.ReadMemStats(&after)
			if got := ix.Stats().ResidentBlocks; got != n {
				b.Fatalf("resident %d, want %d", got, n)
			}
			perBlock = float64(after.HeapAlloc-before.HeapAlloc) / n
			runtime.KeepAlive(ix)
		}
		b.ReportMetric(perBlock, "heap-B/block")
	})
}

// BenchmarkSnapshot measures a replay snapshot of n resident blocks (chains of 32, block size 16, tokens kept):
// the copy under the read lock (what ingest waits for), and the whole Snapshot+Events walk; and the heap the token
// store adds per block. go test ./index -run '^$' -bench Snapshot -benchtime 3x
func BenchmarkSnapshot(b *testing.B) {
	const n, bs = 100_000, 16
	fill := func(keep bool) *Indexer {
		rng := rand.New(rand.NewPCG(5, 5))
		ix, _ := New(Config{WorkerID: 1, BlockSize: bs, MaxBufferSize: 10000, KeepTokens: keep})
		in := makeStored(rng, n/32, 32, bs)
		for i, e := range in {
			if _, err := ix.ApplyStoredTokens(uint64(i+1), 0, false, 0, e.hashesLE, e.tokensLE, nil, false); err != nil {
				b.Fatal(err)
			}
		}
		return ix
	}
	b.Run(fmt.Sprintf("heap/blocks=%d", n), func(b *testing.B) {
		var per float64
		for b.Loop() {
			var m0, m1, m2 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&m0)
			off := fill(false)
			runtime.GC()
			runtime.ReadMemStats(&m1)
			on := fill(true)
			runtime.GC()
			runtime.ReadMemStats(&m2)
			per = (float64(m2.HeapAlloc-m1.HeapAlloc) - float64(m1.HeapAlloc-m0.HeapAlloc)) / n
			runtime.KeepAlive(off)
			runtime.KeepAlive(on)
		}
		b.ReportMetric(per, "token-heap-B/block")
	})
	ix := fill(true)
	b.Run(fmt.Sprintf("copy/blocks=%d", n), func(b *testing.B) {
		for b.Loop() {
			if _, err := ix.Snapshot(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("copy+events/blocks=%d", n), func(b *testing.B) {
		for b.Loop() {
			s, err := ix.Snapshot()
			if err != nil {
				b.Fatal(err)
			}
			blocks := 0
			if err := s.Events(func(e *SnapshotEvent) { blocks += len(e.BlockHashes) }); err != nil || blocks != n {
				b.Fatalf("%d blocks, %v", blocks, err)
			}
		}
	})
}

// storedIndex is an index keeping tokens with n resident blocks stored as root chains of 32 blocks of 32 tokens
// (seeded): the checkpoint benchmarks' tree.
func storedIndex(tb testing.TB, n int) *Indexer {
	tb.Helper()
	rng := rand.New(rand.NewPCG(7, 7))
	ix, _ := New(Config{WorkerID: 1, BlockSize: 32, MaxBufferSize: 10000, KeepTokens: true})
	for i, e := range makeStored(rng, n/32, 32, 32) {
		if _, err := ix.ApplyStoredTokens(uint64(i+1), 0, false, 0, e.hashesLE, e.tokensLE, nil, false); err != nil {
			tb.Fatal(err)
		}
	}
	return ix
}

// BenchmarkWriteCheckpoint: encoding a checkpoint (no I/O) of a 32-block-per-event stream, the work a periodic
// checkpoint does on the drain goroutine before its file I/O (publish stalled at every checkpoint before).
func BenchmarkWriteCheckpoint(b *testing.B) {
	for _, n := range []int{100_000, 200_000} {
		ix := storedIndex(b, n)
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := ix.WriteCheckpoint(io.Discard, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
