package vllmwire

import "github.com/tinylib/msgp/msgp"

// Entries SGLang 0.5.23 declares per event struct, the tag included: BlockStored has 9 fields (block_hashes,
// parent_block_hash, token_ids, block_size, lora_id, medium, cache_salt, session_id, lora_name), so msgspec writes a
// fixmap whatever it omits; BlockRemoved has 2.
const (
	sglangStoredRequired = 6 // type, block_hashes, parent_block_hash, token_ids, block_size, lora_id
	sglangRemovedFixed   = 2 // type, block_hashes
)

// appendSGLangEvent appends one event as SGLang 0.5.23's msgspec structs encode it (FORMAT.md, "SGLang"): a fixmap
// whose first key is "type", then the declared fields in order, the ones SGLang defaults to None (medium,
// cache_salt, session_id, lora_name; BlockRemoved's medium) left out when None; block hashes and the parent as
// signed int64 (the hash's 64-bit pattern, hashSigned). vLLM's fields SGLang does not declare (extra_keys,
// group_idx, kv_cache_spec_*) and bytes hashes (HashBytes, ParentBytes: SGLang's hashes are ints) are ignored.
func appendSGLangEvent(dst []byte, e *Event) []byte {
	switch e.Kind {
	case KindStored:
		n := sglangStoredRequired + b2u(e.HasMedium) + b2u(e.HasCacheSalt) + b2u(e.HasSessionID) + b2u(e.HasLoraName)
		dst = msgp.AppendMapHeader(dst, n)
		dst = appendKeyString(dst, tagKey, "BlockStored")
		dst = appendSignedHashes(msgp.AppendString(dst, "block_hashes"), e.BlockHashes)
		dst = msgp.AppendString(dst, "parent_block_hash")
		if e.HasParent {
			dst = appendInt(dst, hashSigned(e.ParentHash))
		} else {
			dst = msgp.AppendNil(dst)
		}
		dst = appendTokens(msgp.AppendString(dst, "token_ids"), e.TokenIDs, e.IsEagle)
		dst = msgp.AppendUint64(msgp.AppendString(dst, "block_size"), uint64(e.BlockSize))
		dst = msgp.AppendString(dst, "lora_id")
		if e.HasLoraID {
			dst = appendInt(dst, e.LoraID)
		} else {
			dst = msgp.AppendNil(dst)
		}
		dst = appendIfSet(dst, "medium", e.HasMedium, e.Medium)
		dst = appendIfSet(dst, "cache_salt", e.HasCacheSalt, e.CacheSalt)
		dst = appendIfSet(dst, "session_id", e.HasSessionID, e.SessionID)
		dst = appendIfSet(dst, "lora_name", e.HasLoraName, e.LoraName)
	case KindRemoved:
		dst = msgp.AppendMapHeader(dst, sglangRemovedFixed+b2u(e.HasMedium))
		dst = appendKeyString(dst, tagKey, "BlockRemoved")
		dst = appendSignedHashes(msgp.AppendString(dst, "block_hashes"), e.BlockHashes)
		dst = appendIfSet(dst, "medium", e.HasMedium, e.Medium)
	case KindCleared:
		dst = msgp.AppendMapHeader(dst, 1)
		dst = appendKeyString(dst, tagKey, "AllBlocksCleared")
	}
	return dst
}

// hashSigned is the signed int64 SGLang sends for the block hash kvshm keys as h: the same 64 bits. The index keys a
// hash by its 64-bit pattern whatever its sign on the wire, so SGLang's -1 and vLLM's 2**64-1 are one key.
func hashSigned(h uint64) int64 { return int64(h) }

// appendSignedHashes appends block hashes as msgspec encodes SGLang's signed ints: uint forms for >= 0, int forms
// (negative fixint, 0xd0..0xd3) below 0.
func appendSignedHashes(dst []byte, hs []uint64) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(hs)))
	for _, h := range hs {
		dst = appendInt(dst, hashSigned(h))
	}
	return dst
}

// appendIfSet appends key: s when has (an omit_defaults field whose default is None), nothing otherwise.
func appendIfSet(dst []byte, key string, has bool, s string) []byte {
	if !has {
		return dst
	}
	return appendKeyString(dst, key, s)
}

// readHash reads one int block hash as its 64-bit pattern: a uint form as it is, a negative int form (SGLang's
// signed hashes) as its two's complement.
func readHash(p []byte) (uint64, []byte, error) {
	if len(p) > 0 && (p[0] >= 0xe0 || (p[0] >= 0xd0 && p[0] <= 0xd3)) {
		v, rest, err := msgp.ReadInt64Bytes(p)
		return uint64(v), rest, err
	}
	return msgp.ReadUint64Bytes(p)
}
