package stream

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/internal/wiretest"
	"github.com/kvshm/kvshm/vllmwire"
)

// BenchmarkSnapshotBatches: the whole snapshot of 100 k resident blocks (block size 16, chains of 32): the tree
// copy, the walk and the msgpack encoding, and its bytes per block on the wire.
// go test ./daemon -run '^$' -bench SnapshotBatches -benchtime 3x
func BenchmarkSnapshotBatches(b *testing.B) {
	const n, bs = 100_000, 16
	ix, err := index.New(index.Config{WorkerID: 1, BlockSize: bs, MaxBufferSize: 10000, KeepTokens: true})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for id := range n / 32 {
		hs := make([]uint64, 32)
		toks := make([]uint32, 32*bs)
		for i := range hs {
			hs[i] = rng.Uint64()
		}
		for i := range toks {
			toks[i] = uint32(rng.IntN(128000))
		}
		if _, err := ix.ApplyStoredTokens(uint64(id+1), 0, false, 0, wiretest.LE64(hs), wiretest.LE32(toks), nil, false); err != nil {
			b.Fatal(err)
		}
	}
	var size int
	for b.Loop() {
		ts, err := ix.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		out, _, err := snapshotBatches(ts, vllmwire.Wire033, bs, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		size = len(out[0])
	}
	b.ReportMetric(float64(size)/n, "wire-B/block")
}

// TestSnapshotBatchesPerRank: a stream carrying several dp_ranks gets one batch per rank (ascending), each
// starting with its Cleared (Dynamo clears the batch's (worker, dp_rank)); a rank that holds nothing now gets the
// Cleared alone; a stream that has carried no rank gets one Cleared batch with the fallback rank. The fresh
// batches (a reply from seq 0) are the same without the Cleareds, and none for a rank that holds nothing.
func TestSnapshotBatchesPerRank(t *testing.T) {
	ix, _ := index.New(index.Config{WorkerID: 1, BlockSize: 2, KeepTokens: true})
	for _, e := range []struct {
		id   uint64
		dp   uint32
		hs   []uint64
		toks []uint32
	}{{1, 1, []uint64{11}, []uint32{1, 2}}, {2, 0, []uint64{21, 22}, []uint32{3, 4, 5, 6}}, {3, 2, []uint64{31}, []uint32{7, 8}}} {
		if _, err := ix.ApplyStoredTokens(e.id, e.dp, false, 0, wiretest.LE64(e.hs), wiretest.LE32(e.toks), nil, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ix.Apply(&index.Event{ID: 4, DpRank: 2, Kind: index.KindRemoved, Hashes: []uint64{31}}); err != nil {
		t.Fatal(err)
	}
	ts, err := ix.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	out, fresh, err := snapshotBatches(ts, vllmwire.Wire033, 2, 9, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Batch i is rank i's: its events as describe prints them.
	check := func(what string, batches [][]byte, want [][]string) {
		t.Helper()
		if len(batches) != len(want) {
			t.Fatalf("%d %s batches, want %d", len(batches), what, len(want))
		}
		for i, p := range batches {
			b, err := vllmwire.Decode(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := wiretest.Describe(b); !slices.Equal(got, want[i]) || b.DpRank != int64(i) {
				t.Fatalf("%s batch %d: %q rank %d, want %q rank %d", what, i, got, b.DpRank, want[i], i)
			}
		}
	}
	check("fresh", fresh, [][]string{
		{`BlockStored [21 22] parent false/0 tokens [3 4 5 6] bs 2 medium "GPU"`},
		{`BlockStored [11] parent false/0 tokens [1 2] bs 2 medium "GPU"`},
	})
	check("snapshot", out, [][]string{
		{"AllBlocksCleared", `BlockStored [21 22] parent false/0 tokens [3 4 5 6] bs 2 medium "GPU"`},
		{"AllBlocksCleared", `BlockStored [11] parent false/0 tokens [1 2] bs 2 medium "GPU"`},
		{"AllBlocksCleared"},
	})
	empty, _ := index.New(index.Config{WorkerID: 1, BlockSize: 2, KeepTokens: true})
	empty.MarkLost(5, 5, "test")
	ts, _ = empty.Snapshot()
	out, fresh, err = snapshotBatches(ts, vllmwire.Wire033, 2, 9, 0)
	if err != nil || len(out) != 1 || len(fresh) != 0 {
		t.Fatalf("no ranks: %d batches, %d fresh, %v; want 1, 0", len(out), len(fresh), err)
	}
	if b, _ := vllmwire.Decode(out[0]); !slices.Equal(wiretest.Describe(b), []string{"AllBlocksCleared"}) || b.DpRank != 9 {
		t.Fatalf("no ranks: %q rank %d, want the Cleared alone, rank 9", wiretest.Describe(b), b.DpRank)
	}
}

// TestSnapshotBatchesChunked: with a chunk size a rank's snapshot is several batches of that rank; the first opens
// with the Cleared and together they hold exactly the unchunked batch's events, in order (parents first).
func TestSnapshotBatchesChunked(t *testing.T) {
	ix, _ := index.New(index.Config{WorkerID: 1, BlockSize: 2, KeepTokens: true})
	var parent uint64
	for id := uint64(1); id <= 40; id++ {
		h := 100 + id
		if _, err := ix.ApplyStoredTokens(id, 0, id > 1, parent, wiretest.LE64([]uint64{h}), wiretest.LE32([]uint32{uint32(id), 7}), nil, false); err != nil {
			t.Fatal(err)
		}
		if id%3 != 0 { // a chain with branches: several BlockStored events
			parent = h
		}
	}
	ts, err := ix.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	whole, _, err := snapshotBatches(ts, vllmwire.Wire033, 2, 0, 0)
	if err != nil || len(whole) != 1 {
		t.Fatalf("unchunked: %d batches, %v", len(whole), err)
	}
	wb, err := vllmwire.Decode(whole[0])
	if err != nil {
		t.Fatal(err)
	}
	want := wiretest.Describe(wb)
	out, fresh, err := snapshotBatches(ts, vllmwire.Wire033, 2, 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	if len(fresh) != len(out) {
		t.Fatalf("%d fresh batches, want %d (the first without its Cleared)", len(fresh), len(out))
	}
	for i := range fresh {
		fb, err := vllmwire.Decode(fresh[i])
		if err != nil {
			t.Fatal(err)
		}
		ob, _ := vllmwire.Decode(out[i])
		want := wiretest.Describe(ob)
		if i == 0 {
			want = want[1:]
		}
		if got := wiretest.Describe(fb); !slices.Equal(got, want) {
			t.Fatalf("fresh batch %d: %q, want %q", i, got, want)
		}
	}
	if len(out) < 3 {
		t.Fatalf("chunk 64 B: %d batches of %d events, want several", len(out), len(want))
	}
	var got []string
	for i, p := range out {
		b, err := vllmwire.Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		d := wiretest.Describe(b)
		if (d[0] == "AllBlocksCleared") != (i == 0) || b.DpRank != 0 {
			t.Fatalf("batch %d: %q rank %d: only the first opens with the Cleared, all of rank 0", i, d, b.DpRank)
		}
		got = append(got, d...)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("chunked events:\n%q\nwant the unchunked batch's:\n%q", got, want)
	}
}
