package vllmwire

import (
	"github.com/tinylib/msgp/msgp"
)

// Kind is an event's variant, named by its msgspec tag on the wire.
type Kind uint8

// The event kinds, with the tags vLLM's structs carry.
const (
	KindStored  Kind = 1 // "BlockStored"
	KindRemoved Kind = 2 // "BlockRemoved"
	KindCleared Kind = 3 // "AllBlocksCleared"
)

// Tag returns the msgspec tag of the kind ("BlockStored", ...), or "" for an unknown kind.
func (k Kind) Tag() string {
	switch k {
	case KindStored:
		return "BlockStored"
	case KindRemoved:
		return "BlockRemoved"
	case KindCleared:
		return "AllBlocksCleared"
	}
	return ""
}

// Event is one vLLM KV-cache event. The Has* flags say whether an optional field is present; an absent field is
// msgspec's None. Which fields each kind carries on the wire is in FORMAT.md; fields a kind does not carry are
// ignored by the encoder.
type Event struct {
	Kind        Kind
	BlockHashes []uint64 // Stored, Removed: encoded as msgpack uint, or the keys of HashBytes
	// HashBytes, when not nil, holds the block hashes as vLLM's bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0),
	// concatenated, len(HashBytes)/len(BlockHashes) bytes each; they go on the wire as msgpack bin, and
	// BlockHashes holds their keys (HashKey). The caller keeps the length a multiple of len(BlockHashes).
	HashBytes []byte
	// Stored only.
	HasParent   bool
	ParentHash  uint64
	ParentBytes []byte   // when not nil (and HasParent), the parent hash as bytes: sent as bin, ParentHash its key
	TokenIDs    []uint32 // for Eagle, the chain's stream of blocks × block_size + 1 tokens (windows overlap by one)
	IsEagle     bool     // token_ids go on the wire as [token, next] pairs (Dynamo's Eagle form)
	BlockSize   uint32
	HasLoraID   bool
	LoraID      int64
	HasLoraName bool
	LoraName    string
	// ExtraKeys is the msgpack encoding of vLLM's extra_keys value, appended as it is; nil means None.
	ExtraKeys                []byte
	HasKVCacheSpecKind       bool
	KVCacheSpecKind          string
	HasSlidingWindow         bool
	KVCacheSpecSlidingWindow uint32
	// Stored, Removed.
	HasMedium   bool
	Medium      string
	HasGroupIdx bool
	GroupIdx    uint32
	// SGLang's BlockStored only (WireSGLang; the vLLM layouts ignore them): the storing request's salt and session.
	HasCacheSalt bool
	CacheSalt    string
	HasSessionID bool
	SessionID    string
}

// Wire-format constants: never change without changing FORMAT.md and the shared vectors.
const (
	tagKey        = "type"
	batchArrayLen = 3 // [ts, events, data_parallel_rank]
)

// AppendBatchHeader appends the head of a batch of n events: the 3-array header, ts and the events' array header.
// The n events (AppendEvent) and then AppendBatchTrailer must follow.
func AppendBatchHeader(dst []byte, ts float64, n int) []byte {
	dst = msgp.AppendArrayHeader(dst, batchArrayLen)
	dst = msgp.AppendFloat64(dst, ts)
	return msgp.AppendArrayHeader(dst, uint32(n))
}

// AppendBatchTrailer appends the batch's data_parallel_rank, its last element.
func AppendBatchTrailer(dst []byte, dpRank int64) []byte {
	return appendInt(dst, dpRank)
}

// AppendBatch appends the msgpack of a whole KVEventBatch: [ts, [events...], dp_rank]. It allocates only when
// dst lacks capacity.
func AppendBatch(dst []byte, ts float64, events []Event, dpRank int64) []byte {
	dst = AppendBatchHeader(dst, ts, len(events))
	for i := range events {
		dst = AppendEvent(dst, &events[i])
	}
	return AppendBatchTrailer(dst, dpRank)
}

// AppendEvent appends one event in the default layout (Wire033): Wire033.AppendEvent.
func AppendEvent(dst []byte, e *Event) []byte { return Wire033.AppendEvent(dst, e) }

// AppendEvent appends one event as msgspec encodes the release's tagged struct: a map whose first key is "type",
// then the struct's fields in declaration order, the fields with a None default omitted when None
// (omit_defaults). WireArray appends the same fields as an array (appendArrayEvent), WireSGLang SGLang's structs
// (appendSGLangEvent). An unknown kind appends nothing.
func (w Wire) AppendEvent(dst []byte, e *Event) []byte {
	switch w {
	case WireArray:
		return appendArrayEvent(dst, e)
	case WireSGLang:
		return appendSGLangEvent(dst, e)
	}
	switch e.Kind {
	case KindStored:
		n := uint32(8) // type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name
		n += b2u(e.ExtraKeys != nil) + b2u(e.HasGroupIdx) + b2u(e.HasKVCacheSpecKind) + b2u(e.HasSlidingWindow)
		// msgspec sizes a struct's map header for all its fields, whatever it omits: 16 entries (0.33.0) take a
		// map16, 15 (0.32.0) a fixmap.
		if w.storedFields() > 15 {
			dst = append(dst, 0xde, 0, byte(n))
		} else {
			dst = append(dst, 0x80|byte(n))
		}
		dst = appendKeyString(dst, tagKey, "BlockStored")
		dst = appendHashes(msgp.AppendString(dst, "block_hashes"), e.BlockHashes, e.HashBytes)
		dst = appendParent(msgp.AppendString(dst, "parent_block_hash"), e)
		dst = appendTokens(msgp.AppendString(dst, "token_ids"), e.TokenIDs, e.IsEagle)
		dst = msgp.AppendUint64(msgp.AppendString(dst, "block_size"), uint64(e.BlockSize))
		dst = msgp.AppendString(dst, "lora_id")
		if e.HasLoraID {
			dst = appendInt(dst, e.LoraID)
		} else {
			dst = msgp.AppendNil(dst)
		}
		dst = appendOptString(msgp.AppendString(dst, "medium"), e.HasMedium, e.Medium)
		dst = appendOptString(msgp.AppendString(dst, "lora_name"), e.HasLoraName, e.LoraName)
		if e.ExtraKeys != nil {
			dst = append(msgp.AppendString(dst, "extra_keys"), e.ExtraKeys...)
		}
		if e.HasGroupIdx {
			dst = msgp.AppendUint64(msgp.AppendString(dst, "group_idx"), uint64(e.GroupIdx))
		}
		if e.HasKVCacheSpecKind {
			dst = appendKeyString(dst, "kv_cache_spec_kind", e.KVCacheSpecKind)
		}
		if e.HasSlidingWindow {
			dst = msgp.AppendUint64(msgp.AppendString(dst, "kv_cache_spec_sliding_window"), uint64(e.KVCacheSpecSlidingWindow))
		}
	case KindRemoved:
		dst = msgp.AppendMapHeader(dst, 3+b2u(e.HasGroupIdx))
		dst = appendKeyString(dst, tagKey, "BlockRemoved")
		dst = appendHashes(msgp.AppendString(dst, "block_hashes"), e.BlockHashes, e.HashBytes)
		dst = appendOptString(msgp.AppendString(dst, "medium"), e.HasMedium, e.Medium)
		if e.HasGroupIdx {
			dst = msgp.AppendUint64(msgp.AppendString(dst, "group_idx"), uint64(e.GroupIdx))
		}
	case KindCleared:
		dst = msgp.AppendMapHeader(dst, 1)
		dst = appendKeyString(dst, tagKey, "AllBlocksCleared")
	}
	return dst
}

// Array lengths of WireArray's events: the tag and vLLM 0.32.0's fields (BlockStored 14, BlockRemoved 5).
const (
	arrayStoredLen  = 15
	arrayRemovedLen = 6
)

// appendArrayEvent appends one event in the WireArray layout: [tag, fields...], 0.32.0's fields in declaration
// order, nil for each one unset (locality, ownership and session_id, which kvshm does not carry, always nil).
func appendArrayEvent(dst []byte, e *Event) []byte {
	switch e.Kind {
	case KindStored:
		dst = msgp.AppendString(msgp.AppendArrayHeader(dst, arrayStoredLen), "BlockStored")
		dst = appendHashes(dst, e.BlockHashes, e.HashBytes)
		dst = appendParent(dst, e)
		dst = appendTokens(dst, e.TokenIDs, e.IsEagle)
		dst = msgp.AppendUint64(dst, uint64(e.BlockSize))
		if e.HasLoraID {
			dst = appendInt(dst, e.LoraID)
		} else {
			dst = msgp.AppendNil(dst)
		}
		dst = appendOptString(dst, e.HasMedium, e.Medium)
		dst = appendOptString(dst, e.HasLoraName, e.LoraName)
		if e.ExtraKeys != nil {
			dst = append(dst, e.ExtraKeys...)
		} else {
			dst = msgp.AppendNil(dst)
		}
		dst = appendOptUint(dst, e.HasGroupIdx, uint64(e.GroupIdx))
		dst = appendOptString(dst, e.HasKVCacheSpecKind, e.KVCacheSpecKind)
		dst = appendOptUint(dst, e.HasSlidingWindow, uint64(e.KVCacheSpecSlidingWindow))
		dst = msgp.AppendNil(msgp.AppendNil(msgp.AppendNil(dst))) // locality, ownership, session_id
	case KindRemoved:
		dst = msgp.AppendString(msgp.AppendArrayHeader(dst, arrayRemovedLen), "BlockRemoved")
		dst = appendHashes(dst, e.BlockHashes, e.HashBytes)
		dst = appendOptString(dst, e.HasMedium, e.Medium)
		dst = appendOptUint(dst, e.HasGroupIdx, uint64(e.GroupIdx))
		dst = msgp.AppendNil(msgp.AppendNil(dst)) // locality, ownership
	case KindCleared:
		dst = msgp.AppendString(msgp.AppendArrayHeader(dst, 1), "AllBlocksCleared")
	}
	return dst
}

func appendOptUint(dst []byte, has bool, v uint64) []byte {
	if !has {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendUint64(dst, v)
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// appendInt appends v as msgspec encodes a Python int: the uint forms for v >= 0, the int forms below 0.
func appendInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return msgp.AppendUint64(dst, uint64(v))
	}
	return msgp.AppendInt64(dst, v)
}

func appendKeyString(dst []byte, key, val string) []byte {
	return msgp.AppendString(msgp.AppendString(dst, key), val)
}

func appendOptString(dst []byte, has bool, s string) []byte {
	if !has {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendString(dst, s)
}

// appendHashes appends block_hashes: uints, or with hb the bin strings it holds (len(hb)/len(hs) bytes each).
func appendHashes(dst []byte, hs []uint64, hb []byte) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(hs)))
	if hb != nil && len(hs) > 0 {
		size := len(hb) / len(hs)
		for i := range hs {
			dst = msgp.AppendBytes(dst, hb[i*size:(i+1)*size])
		}
		return dst
	}
	for _, h := range hs {
		dst = msgp.AppendUint64(dst, h)
	}
	return dst
}

// appendTokens appends token_ids. Plain: an array of uints. Eagle: kvshm holds the chain's token stream s
// (nblocks × block_size + 1 tokens: block b's window is s[b*bs : b*bs+bs+1], windows overlapping by one token, as
// index.AppendBlockHashes hashes them); the wire carries it as the pairs [s[i], s[i+1]], which Dynamo's
// normalize_token_ids turns back into s with is_eagle set. Fewer than 2 tokens have no pair: sent plain.
func appendTokens(dst []byte, toks []uint32, eagle bool) []byte {
	if !eagle || len(toks) < 2 {
		dst = msgp.AppendArrayHeader(dst, uint32(len(toks)))
		for _, t := range toks {
			dst = msgp.AppendUint64(dst, uint64(t))
		}
		return dst
	}
	dst = msgp.AppendArrayHeader(dst, uint32(len(toks)-1))
	for i := 1; i < len(toks); i++ {
		dst = msgp.AppendArrayHeader(dst, 2)
		dst = msgp.AppendUint64(msgp.AppendUint64(dst, uint64(toks[i-1])), uint64(toks[i]))
	}
	return dst
}

// appendParent appends a BlockStored's parent_block_hash: its bytes or int as the engine gave it, nil without one.
func appendParent(dst []byte, e *Event) []byte {
	switch {
	case e.HasParent && e.ParentBytes != nil:
		return msgp.AppendBytes(dst, e.ParentBytes)
	case e.HasParent:
		return msgp.AppendUint64(dst, e.ParentHash)
	}
	return msgp.AppendNil(dst)
}
