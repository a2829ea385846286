package index

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// The golden files in ../testdata/json (not blocks/, not error.json) were produced by dynamo-kv-router 1.6.1's
// LocalKvIndexer from the scenarios below (see ../testdata/json/README.md); -update never rewrites them. Each
// scenario is fed to an index with the default config (DumpChains, LossBestEffort) through ApplyStoredTokens, as
// the daemon feeds it, and every answer must equal Dynamo's byte for byte (chain grouping included: the edge
// flags of tree.go reproduce 1.6.1's compressed edges).

type goldenOp struct {
	kind      Kind // 0: a query
	id        uint64
	dp        uint32
	tokLo     int // Stored: tokens tokLo, tokLo+1, ..., tokLo+tokN-1
	tokN      int
	tokExtra  []uint32 // more tokens after those
	hashes    []uint64
	hasParent bool
	parent    uint64
	lora      string
	eagle     bool
	// query
	start, end *uint64
	file       string
	cacheHit   bool // the answer must come from the dump cache (extended by the log tail)
}

func gStored(id uint64, dp uint32, lo, n int, hs ...uint64) goldenOp {
	return goldenOp{kind: KindStored, id: id, dp: dp, tokLo: lo, tokN: n, hashes: hs}
}

func (o goldenOp) under(p uint64) goldenOp { o.hasParent, o.parent = true, p; return o }

func gRemoved(id uint64, dp uint32, hs ...uint64) goldenOp {
	return goldenOp{kind: KindRemoved, id: id, dp: dp, hashes: hs}
}

func gQuery(file string, start, end *uint64) goldenOp {
	return goldenOp{file: file, start: start, end: end}
}

func TestDynamo161Goldens(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	lora := gStored(2, 0, 8, 4, 103).under(102)
	lora.lora = "my-adapter"
	eagle := gStored(3, 0, 200, 9, 5, 6).under(4)
	eagle.eagle = true
	// Tokens 8..11 (block 3 again), then 60..63 (a new block 5).
	splitTail := goldenOp{kind: KindStored, id: 4, tokLo: 8, tokN: 4, hashes: []uint64{3, 5}, hasParent: true, parent: 2,
		tokExtra: []uint32{60, 61, 62, 63}}
	tail := gQuery("cache_tail.json", nil, nil)
	tail.cacheHit = true
	// 1.6.1 keeps an edge whose tail was removed as an edge of its own: [1] then [2] under 1 (not [1,2]).
	cutoff := gQuery("chain_cutoff.json", nil, nil)
	// A rank holding a prefix of another's edge: dp0 [1,2,3] then dp1 [1] (not dp0 [1], dp1 [1], dp0 [2,3]).
	prefix := gQuery("chain_prefix_rank.json", nil, nil)
	scenarios := map[string][]goldenOp{
		"events": {gStored(1, 0, 0, 8, 101, 102), lora, gRemoved(3, 0, 103), {kind: KindCleared, id: 4},
			gQuery("events.json", u(2), nil)},
		"tree_dump": {gStored(1, 0, 0, 8, 101, 102), gStored(2, 0, 100, 4, 201).under(101), gStored(3, 1, 0, 4, 101),
			gQuery("tree_dump.json", nil, nil), gQuery("too_new.json", u(10), u(20)),
			gQuery("invalid_range.json", u(5), u(2))},
		"gap":            {gStored(1, 0, 0, 4, 101), gStored(5, 0, 4, 4, 102).under(101), gQuery("gap.json", nil, nil)},
		"chain_linear":   {gStored(1, 0, 0, 20, 1, 2, 3, 4, 5), gStored(2, 0, 20, 8, 6, 7).under(5), gQuery("chain_linear.json", nil, nil)},
		"chain_rejoin":   {gStored(1, 0, 0, 12, 1, 2, 3), gStored(2, 0, 40, 4, 4).under(1), gRemoved(3, 0, 4), gQuery("chain_rejoin.json", nil, nil)},
		"chain_two_rank": {gStored(1, 0, 0, 12, 1, 2, 3), gStored(2, 1, 0, 12, 1, 2, 3), gQuery("chain_two_ranks.json", nil, nil)},
		"token_mismatch": {gStored(1, 0, 0, 9, 1, 2, 3), gStored(2, 0, 100, 12, 4).under(2), eagle,
			gQuery("token_mismatch.json", nil, nil)},
		"cache": {gStored(1, 0, 0, 8, 1, 2), gQuery("cache_base.json", nil, nil), gStored(2, 0, 8, 4, 3).under(2),
			gRemoved(3, 0, 3), tail},
		"stale_hash": {gStored(1, 0, 0, 4, 101), gStored(2, 0, 4, 4, 102).under(101), gRemoved(3, 0, 102),
			gStored(4, 0, 4, 4, 103).under(101), gQuery("stale_hash.json", nil, nil)},
		"chain_cutoff": {gStored(1, 0, 0, 12, 1, 2, 3), gStored(2, 0, 40, 4, 4).under(1), gRemoved(3, 0, 4),
			gRemoved(4, 0, 3), cutoff},
		"cleared_restore": {gStored(1, 0, 0, 12, 41, 42, 43), gStored(2, 0, 40, 4, 44).under(41),
			{kind: KindCleared, id: 3}, gStored(4, 0, 0, 8, 41, 45), gQuery("cleared_restore.json", nil, nil)},
		"recover_tail": {gStored(1, 0, 0, 16, 1, 2, 3, 4), gRemoved(2, 0, 4), gRemoved(3, 0, 3),
			gStored(4, 0, 8, 8, 3, 4).under(2), gQuery("recover_tail.json", nil, nil)},
		"split_after_tail": {gStored(1, 0, 0, 16, 1, 2, 3, 4), gRemoved(2, 0, 4), gRemoved(3, 0, 3),
			splitTail, gQuery("split_after_tail.json", nil, nil)},
		"chain_prefix_rank": {gStored(1, 0, 0, 12, 1, 2, 3), gStored(2, 1, 0, 4, 1), prefix},
	}
	for name, ops := range scenarios {
		t.Run(name, func(t *testing.T) {
			ix, err := New(Config{WorkerID: 7, BlockSize: 4, MaxBufferSize: 10})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range ops {
				switch o.kind {
				case KindStored:
					_, err = ix.ApplyStoredTokens(o.id, o.dp, o.hasParent, o.parent, hashesLE(o.hashes...),
						tokensToLE(toksLE(o.tokLo, o.tokN), o.tokExtra), []byte(o.lora), o.eagle)
				case KindRemoved, KindCleared:
					_, err = ix.Apply(&Event{ID: o.id, DpRank: o.dp, Kind: o.kind, Hashes: o.hashes})
				default:
					checkDynamoGolden(t, ix, o)
					continue
				}
				if err != nil {
					t.Fatalf("event %d: %v", o.id, err)
				}
			}
		})
	}
}

func checkDynamoGolden(t *testing.T, ix *Indexer, o goldenOp) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join("..", "testdata", "json", o.file))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ix.Recover(context.Background(), o.start, o.end)
	if err != nil {
		t.Fatal(err)
	}
	if r.CacheHit != o.cacheHit {
		t.Fatalf("%s: CacheHit %v, want %v", o.file, r.CacheHit, o.cacheHit)
	}
	if r.Incomplete {
		t.Fatalf("%s: answer marked incomplete (lost %v)", o.file, r.Lost)
	}
	if !bytes.Equal(r.JSON, want) {
		t.Fatalf("%s differs from dynamo-kv-router 1.6.1:\n got %s\nwant %s", o.file, r.JSON, want)
	}
}
