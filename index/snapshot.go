package index

import (
	"fmt"
)

// Snapshots (Config.KeepTokens): the tree as vLLM BlockStored events, for a replay reply that the publisher's
// buffer no longer covers (zmqpub, docs/replay-snapshots.md). Snapshot copies, under the read lock, what Events reads (the node
// arena, edge flags, worker sets, token arena and LoRA names) and the last id; Events plans and walks the copy
// outside every lock, so ingest continues meanwhile.

// TokenSnapshot is a consistent copy of the tree with its token windows, as of id ID.
type TokenSnapshot struct {
	// HasID is false when the index has seen no event; ID is then 0. Else ID is the highest id applied or lost
	// (Stats.LastSeenID) when the copy was taken: the snapshot is the state after it.
	HasID bool
	ID    uint64
	// DpRanks are every dp_rank the stream has carried, ascending (a consumer clears each).
	DpRanks []uint32
	// Blocks is the number of resident (dp_rank, block) pairs.
	Blocks int

	ts    treeSnapshot
	words tokenArena
	lora  map[uint32]string
}

// SnapshotEvent is one BlockStored event of a snapshot: blocks parent-first, TokenIDs their windows concatenated
// (block_size per block, plus the last block's extra token for Eagle). Its slices are valid until the callback
// returns.
type SnapshotEvent struct {
	DpRank      uint32
	HasParent   bool
	Parent      uint64
	BlockHashes []uint64
	TokenIDs    []uint32
	LoraName    string
	IsEagle     bool
}

// Snapshot copies the tree and its tokens. ErrNoTokens when the index does not keep tokens.
func (ix *Indexer) Snapshot() (*TokenSnapshot, error) {
	if !ix.cfg.KeepTokens {
		return nil, fmt.Errorf("snapshot of worker %d: %w", ix.cfg.WorkerID, ErrNoTokens)
	}
	ix.mu.RLock()
	s := &TokenSnapshot{HasID: ix.seenAny, ID: ix.lastSeen, ts: ix.snapshotTreeLocked(rankFilter{}),
		words: ix.tree.tok.words.clone()}
	if len(ix.tree.tok.lora) > 0 {
		s.lora = make(map[uint32]string, len(ix.tree.tok.lora))
		for k, v := range ix.tree.tok.lora {
			s.lora[k] = v
		}
	}
	ix.mu.RUnlock()
	s.Blocks = s.ts.blocks
	for _, sl := range s.ts.order {
		s.DpRanks = append(s.DpRanks, s.ts.dps[sl])
	}
	return s, nil
}

// Events calls fn with the snapshot's BlockStored events: Dynamo 1.6.1's dump chains (parents before children for
// every dp_rank), an event split where the LoRA name or the Eagle form changes along a chain, or two Eagle windows do not overlap. It stops at the
// first block whose tokens are unknown (applied without tokens) and returns ErrTokensUnknown.
func (s *TokenSnapshot) Events(fn func(*SnapshotEvent)) error {
	ts := &s.ts
	var ev SnapshotEvent
	var last uint32 // the last block of ev
	flush := func() {
		if len(ev.BlockHashes) == 0 {
			return
		}
		if ev.IsEagle { // the last window's extra token
			w := s.words.window(last)
			ev.TokenIDs = append(ev.TokenIDs, w[len(w)-1])
		}
		fn(&ev)
	}
	for _, e := range ts.planChains() {
		sl := int(e.slot)
		ev.BlockHashes, ev.TokenIDs = ev.BlockHashes[:0], ev.TokenIDs[:0]
		ev.DpRank, ev.HasParent, ev.Parent = ts.dps[sl], e.parent != rootNode, ts.nodes[e.parent].blockHash
		for n, first := e.start, true; ; first = false {
			if !first {
				n = ts.next(n)
				if !e.full && !ts.has(n, sl) {
					break
				}
			}
			w := s.words.window(n)
			if w == nil {
				return fmt.Errorf("snapshot: block %d of dp_rank %d: %w", ts.nodes[n].blockHash, ts.dps[sl], ErrTokensUnknown)
			}
			eagle := len(w) > int(s.words.stride-2)
			lora := s.lora[n]
			// Eagle windows overlap by one token: blocks join an event only where the previous window's extra
			// token is this window's first (an engine's contiguous stream), else the event would change a hash.
			if len(ev.BlockHashes) > 0 && (eagle != ev.IsEagle || lora != ev.LoraName ||
				eagle && s.words.window(last)[s.words.stride-2] != w[0]) {
				flush()
				ev.BlockHashes, ev.TokenIDs = ev.BlockHashes[:0], ev.TokenIDs[:0]
				ev.HasParent, ev.Parent = true, ts.nodes[last].blockHash
			}
			ev.IsEagle, ev.LoraName = eagle, lora
			ev.BlockHashes = append(ev.BlockHashes, ts.nodes[n].blockHash)
			ev.TokenIDs = append(ev.TokenIDs, w[:s.words.stride-2]...)
			last = n
			if n == e.end {
				break
			}
		}
		flush()
	}
	return nil
}

// EnableTokens makes an index that keeps no tokens keep them from now on (a stream that starts publishing): the
// blocks already resident have unknown tokens, so a snapshot is ErrTokensUnknown until they are gone (a Cleared).
// Only the writer goroutine, or its owner while none runs, calls it.
func (ix *Indexer) EnableTokens() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.tree.tok == nil {
		ix.tree.tok = newTokenStore(ix.cfg.BlockSize)
		ix.cfg.KeepTokens = true
	}
}
