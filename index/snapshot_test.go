package index

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// residentState is a canonical form of a tree's held, reachable blocks: per dp_rank, block hash -> "parent hash/tokens hash".
func residentState(ix *Indexer) map[string]string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	t := ix.tree
	out := map[string]string{}
	for s, sl := range t.slots {
		for h, n := range sl.lookup {
			if !t.hasWorker(n, s) || !t.isAncestorOrSelf(rootNode, n) { // held and reachable (dumps skip the rest)
				continue
			}
			p := t.nodes[n].parent
			out[fmt.Sprintf("%d/%d", sl.dp, h)] = fmt.Sprintf("%d/%d", t.nodes[p].blockHash, t.nodes[n].tokensHash)
		}
	}
	return out
}

func le(toks []uint32) []byte { return tokensToLE(nil, toks) }

// applySnapshot rebuilds a fresh index from a snapshot's events (what a consumer does after its Cleared).
func applySnapshot(t *testing.T, s *TokenSnapshot, bs uint32) *Indexer {
	t.Helper()
	ix, err := New(Config{WorkerID: 1, BlockSize: bs, MaxBufferSize: 100, KeepTokens: true})
	if err != nil {
		t.Fatal(err)
	}
	id := uint64(0)
	err = s.Events(func(ev *SnapshotEvent) {
		id++
		if _, err := ix.ApplyStoredTokens(id, ev.DpRank, ev.HasParent, ev.Parent, hashesLE(ev.BlockHashes...),
			le(ev.TokenIDs), []byte(ev.LoraName), ev.IsEagle); err != nil {
			t.Errorf("snapshot event %d: %v", id, err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// TestSnapshotRebuildsTheTree: random engine-like streams (chains under resident parents, leaf evictions, LoRA
// and Eagle events, 1..3 ranks, a Cleared now and then); after each step the snapshot's events, applied to an
// empty index, give exactly the original's held blocks (hash, parent, tokens hash) per rank.
func TestSnapshotRebuildsTheTree(t *testing.T) {
	const bs = 4
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		ranks := uint32(1 + seed%3)
		ix, err := New(Config{WorkerID: 1, BlockSize: bs, MaxBufferSize: 100, KeepTokens: true})
		if err != nil {
			t.Fatal(err)
		}
		type blk struct {
			h     uint64
			rank  uint32
			lora  string
			eagle bool
		}
		var res []blk
		next := uint64(1000)
		var lastID uint64
		var applied [3][NumStatuses]uint64
		for step := range 120 {
			id := uint64(step + 1)
			switch r := rng.IntN(10); {
			case r < 6: // store a chain under a resident block or the root
				rank := uint32(rng.IntN(int(ranks)))
				hasParent, parent, lora, eagle := false, uint64(0), "", rng.IntN(4) == 0
				if rng.IntN(5) == 0 {
					lora = "adapter"
				}
				var cands []blk
				for _, b := range res {
					if b.rank == rank {
						cands = append(cands, b)
					}
				}
				if len(cands) > 0 && rng.IntN(4) != 0 {
					p := cands[rng.IntN(len(cands))]
					hasParent, parent, lora, eagle = true, p.h, p.lora, p.eagle
				}
				n := 1 + rng.IntN(4)
				var hs []uint64
				var toks []uint32
				for range n {
					next++
					hs = append(hs, next)
					for range bs {
						toks = append(toks, uint32(rng.IntN(50)))
					}
					res = append(res, blk{h: next, rank: rank, lora: lora, eagle: eagle})
				}
				if eagle {
					toks = append(toks, uint32(rng.IntN(50)))
				}
				if _, err := ix.ApplyStoredTokens(id, rank, hasParent, parent, hashesLE(hs...), le(toks), []byte(lora), eagle); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
			case r < 9 && len(res) > 0: // remove a block (descendants go with it in this model)
				i := rng.IntN(len(res))
				b := res[i]
				if _, err := ix.Apply(&Event{ID: id, DpRank: b.rank, Kind: KindRemoved, Hashes: []uint64{b.h}}); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				res = slices.Delete(res, i, i+1)
			case r == 9:
				if _, err := ix.Apply(&Event{ID: id, Kind: KindCleared}); err != nil {
					t.Fatal(err)
				}
				res = res[:0]
			}
			if ix.Stats().Applied != applied {
				lastID, applied = id, ix.Stats().Applied
			}
			s, err := ix.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if s.ID != lastID || s.HasID != (lastID != 0) {
				t.Fatalf("seed %d step %d: snapshot id %v/%d, want %d", seed, step, s.HasID, s.ID, lastID)
			}
			got, want := residentState(applySnapshot(t, s, bs)), residentState(ix)
			for k, v := range want {
				if got[k] != v {
					t.Fatalf("seed %d step %d: block %s: rebuilt %q, original %q", seed, step, k, got[k], v)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					t.Fatalf("seed %d step %d: rebuilt holds %s, the original does not", seed, step, k)
				}
			}
		}
	}
}

func TestSnapshotErrors(t *testing.T) {
	ix, _ := New(Config{WorkerID: 1, BlockSize: 2})
	if _, err := ix.Snapshot(); !errors.Is(err, ErrNoTokens) {
		t.Fatalf("without KeepTokens: %v, want ErrNoTokens", err)
	}
	ix, _ = New(Config{WorkerID: 1, BlockSize: 2, KeepTokens: true})
	// A block applied through Apply (hashed by the caller, no tokens): the snapshot cannot describe it.
	if _, err := ix.Apply(&Event{ID: 1, Kind: KindStored, Blocks: []Block{{BlockHash: 5, TokensHash: 6}}}); err != nil {
		t.Fatal(err)
	}
	s, err := ix.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Events(func(*SnapshotEvent) {}); !errors.Is(err, ErrTokensUnknown) {
		t.Fatalf("Events: %v, want ErrTokensUnknown", err)
	}
}

// TestSnapshotTokensExact: the exact events of a small tree (chains, Eagle's extra token, a LoRA name).
func TestSnapshotTokensExact(t *testing.T) {
	ix, _ := New(Config{WorkerID: 1, BlockSize: 2, KeepTokens: true})
	mustStore := func(id uint64, hasParent bool, parent uint64, hs []uint64, toks []uint32, lora string, eagle bool) {
		t.Helper()
		if _, err := ix.ApplyStoredTokens(id, 0, hasParent, parent, hashesLE(hs...), le(toks), []byte(lora), eagle); err != nil {
			t.Fatal(err)
		}
	}
	mustStore(1, false, 0, []uint64{11, 12}, []uint32{1, 2, 3, 4}, "", false)
	mustStore(2, true, 12, []uint64{13}, []uint32{5, 6, 7}, "", true)
	mustStore(3, false, 0, []uint64{21}, []uint32{9, 9}, "lo", false)
	s, err := ix.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := s.Events(func(e *SnapshotEvent) {
		got = append(got, fmt.Sprintf("%v %d %v %v %q %v", e.HasParent, e.Parent, e.BlockHashes, e.TokenIDs, e.LoraName, e.IsEagle))
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`false 0 [11 12] [1 2 3 4] "" false`, // one chain 11-12-13, split where the Eagle form begins
		`true 12 [13] [5 6 7] "" true`,
		`false 0 [21] [9 9] "lo" false`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events:\n%q\nwant\n%q", got, want)
	}
}
