package index

import "encoding/binary"

// The token store (Config.KeepTokens): every node's token window, so that a snapshot can describe the tree in
// vLLM's wire form (BlockStored carries token ids; the consumer hashes them itself). A node's window is fixed
// while the node lives under its parent (it is found by its tokens hash); store rewrites it for every block it
// sets, so a re-attached or reused node carries the window of its last store. Layout: a flat arena of stride
// block_size+2 u32 per node slot: [n, t_0 .. t_{n-1}], n = block_size, block_size+1 (Eagle: the window overlaps
// the next block by one) or 0 (unknown: a block applied through Apply, without tokens). Non-empty LoRA names,
// rare, live in a map by node. Freed node slots are reused with their arena slot (free zeroes n).
type tokenStore struct {
	stride int
	words  []uint32
	lora   map[uint32]string
}

func newTokenStore(blockSize uint32) *tokenStore {
	return &tokenStore{stride: int(blockSize) + 2}
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
	off := int(n) * ts.stride
	if need := off + ts.stride; need > len(ts.words) {
		ts.words = append(ts.words, make([]uint32, need-len(ts.words))...)
	}
	w := ts.words[off : off+ts.stride]
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
	if off := int(n) * ts.stride; off < len(ts.words) {
		ts.words[off] = 0
	}
	if ts.lora != nil {
		delete(ts.lora, n)
	}
}

// window returns node n's tokens (nil: unknown) in a copy-free view of words.
func windowOf(words []uint32, stride int, n uint32) []uint32 {
	off := int(n) * stride
	if off >= len(words) {
		return nil
	}
	cnt := int(words[off])
	if cnt == 0 {
		return nil
	}
	return words[off+1 : off+1+cnt]
}
