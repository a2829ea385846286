package index

import (
	"encoding/binary"
	"slices"
)

// The token store (Config.KeepTokens): every node's token window, so that a snapshot can describe the tree in
// vLLM's wire form (BlockStored carries token ids; the consumer hashes them itself). A node's window is fixed
// while the node lives under its parent (it is found by its tokens hash); store rewrites it for every block it
// sets, so a re-attached or reused node carries the window of its last store. Layout: a flat arena of stride
// block_size+2 u32 per node slot: [n, t_0 .. t_{n-1}], n = block_size, block_size+1 (Eagle: the window overlaps
// the next block by one) or 0 (unknown: a block applied through Apply, without tokens). Non-empty LoRA names,
// rare, live in a map by node. Freed node slots are reused with their arena slot (free zeroes n).
type tokenStore struct {
	words tokenArena
	lora  map[uint32]string
}

func newTokenStore(blockSize uint32) *tokenStore {
	return &tokenStore{words: tokenArena{stride: int(blockSize) + 2}}
}

// tokenChunkSlots is the number of node slots per arena chunk (~140 KiB at block size 32).
const tokenChunkSlots = 1024

// tokenArena is the slot arena in fixed-size chunks of tokenChunkSlots slots, allocated as nodes reach them: it
// grows without ever copying what it holds. (A flat slice regrown by append copied the whole arena, ~136 B per
// block, inside an apply on the drain path: at 100k-200k blocks a 25-50 ms publish stall at every 25% of growth.)
type tokenArena struct {
	stride int
	chunks [][]uint32
}

// slot returns node n's slot (stride words), allocating its chunk (zeroed: unknown windows) when needed.
func (a *tokenArena) slot(n uint32) []uint32 {
	c, i := int(n/tokenChunkSlots), int(n%tokenChunkSlots)
	for len(a.chunks) <= c {
		a.chunks = append(a.chunks, nil) // the chunk headers only: 24 B per 1024 nodes
	}
	if a.chunks[c] == nil {
		a.chunks[c] = make([]uint32, tokenChunkSlots*a.stride)
	}
	return a.chunks[c][i*a.stride : (i+1)*a.stride]
}

// window returns node n's tokens (nil: unknown) in a copy-free view of the arena.
func (a *tokenArena) window(n uint32) []uint32 {
	c, i := int(n/tokenChunkSlots), int(n%tokenChunkSlots)
	if c >= len(a.chunks) || a.chunks[c] == nil {
		return nil
	}
	w := a.chunks[c][i*a.stride : (i+1)*a.stride]
	if w[0] == 0 {
		return nil
	}
	return w[1 : 1+w[0]]
}

// forget marks node n's window unknown.
func (a *tokenArena) forget(n uint32) {
	c, i := int(n/tokenChunkSlots), int(n%tokenChunkSlots)
	if c < len(a.chunks) && a.chunks[c] != nil {
		a.chunks[c][i*a.stride] = 0
	}
}

// clone copies the arena (a Snapshot's own copy).
func (a *tokenArena) clone() tokenArena {
	out := tokenArena{stride: a.stride, chunks: make([][]uint32, len(a.chunks))}
	for i, c := range a.chunks {
		if c != nil {
			out.chunks[i] = slices.Clone(c)
		}
	}
	return out
}

// tokenSrc is the token vector of one Stored event as it sits in the FlatBuffer (u32 little-endian), and the
// event's LoRA name and Eagle flag; window i is block i's.
type tokenSrc struct {
	le    []byte
	bs    int
	eagle bool
	lora  []byte
}

// set records block i of src as node n's window (src nil: unknown).
func (ts *tokenStore) set(n uint32, src *tokenSrc, i int) {
	w := ts.words.slot(n)
	if src == nil {
		w[0] = 0
		delete(ts.lora, n)
		return
	}
	cnt := src.bs
	if src.eagle {
		cnt++
	}
	le := src.le[4*i*src.bs : 4*(i*src.bs+cnt)]
	w[0] = uint32(cnt)
	for j := range cnt {
		w[1+j] = binary.LittleEndian.Uint32(le[4*j:])
	}
	switch {
	case len(src.lora) > 0:
		if ts.lora == nil {
			ts.lora = make(map[uint32]string)
		}
		if ts.lora[n] != string(src.lora) {
			ts.lora[n] = string(src.lora)
		}
	case ts.lora != nil:
		delete(ts.lora, n)
	}
}

// forget marks node n's window unknown (the node is freed).
func (ts *tokenStore) forget(n uint32) {
	ts.words.forget(n)
	if ts.lora != nil {
		delete(ts.lora, n)
	}
}

// window returns node n's tokens (nil: unknown).
func (ts *tokenStore) window(n uint32) []uint32 { return ts.words.window(n) }
