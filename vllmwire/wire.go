package vllmwire

import (
	"encoding/binary"
	"fmt"
)

// Wire is a vLLM release's KV-event layout. The releases differ only in the fields BlockStored declares, which
// msgspec counts when it sizes the event's map header (FORMAT.md, "Releases"); the zero value is the default.
type Wire uint8

// The supported layouts, named as a producer asks for them (sock.Publish.Wire, kvshm.ZmqPublish(wire=...)).
const (
	Wire033 Wire = iota // vLLM 0.33.0: BlockStored has 15 fields + the tag, always a map16 header (the default)
	Wire032             // vLLM 0.32.0: BlockStored has 14 fields + the tag (no lookahead_token_ids), a fixmap
	// WireArray is vLLM 0.32.0's event structs encoded array_like: each event an array, the tag first, then every
	// field in declaration order, nil where unset (msgspec omits no field of an array_like struct). It is the
	// layout llm-d-kv-cache's vLLM adapter decodes (positional, fields 1-11 in 0.32.0's order; it refuses the map
	// layouts: "decoding array length"), so a stream published for llm-d's consumer asks for it.
	WireArray
	// WireSGLang is SGLang 0.5.23's KV-event wire (sglang/srt/disaggregation/kv_events.py): vLLM's shape with its
	// own BlockStored (10 entries declared: a fixmap; medium, cache_salt, session_id, lora_name omitted when None),
	// BlockRemoved's medium omitted when None, and block hashes as signed int64 (sglang.go, FORMAT.md "SGLang").
	WireSGLang
	numWires
)

var wireNames = [numWires]string{"0.33", "0.32", "array", "sglang"}

// wireAliases names the releases whose layout is another's, byte for byte. vLLM 0.31.0's kv_events.py is
// 0.32.0's file unchanged (the same event structs and msgspec options), so "0.31" is Wire032; its own vectors
// (vectors_0.31.json, the same cases written from 0.31.0's structs) pin that.
var wireAliases = []struct {
	name string
	wire Wire
}{{"0.31", Wire032}}

// ParseWire returns the layout of a name: "0.33" or "" (the default), "0.32", "array", "sglang", or an alias
// ("0.31"). Anything else is an error wrapping ErrUnknownWire.
func ParseWire(s string) (Wire, error) {
	if s == "" {
		return Wire033, nil
	}
	for w, name := range wireNames {
		if s == name {
			return Wire(w), nil
		}
	}
	known := wireNames[:]
	for _, a := range wireAliases {
		if s == a.name {
			return a.wire, nil
		}
		known = append(known[:len(known):len(known)], a.name)
	}
	return Wire033, fmt.Errorf("%w %q (known: %q)", ErrUnknownWire, s, known)
}

// String returns the layout's name ("0.33", "0.32", "array", "sglang"), or "Wire(n)" for a value that is none.
func (w Wire) String() string {
	if w < numWires {
		return wireNames[w]
	}
	return fmt.Sprintf("Wire(%d)", uint8(w))
}

// storedFields is the number of entries msgspec sizes BlockStored's map header for (fields + the tag); an
// unknown Wire encodes as the default.
func (w Wire) storedFields() int {
	if w == Wire032 {
		return 15
	}
	return 16
}

// HashKey is the index key of a block hash vLLM sends as bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): its last
// 8 bytes as a big-endian integer, fewer bytes zero-extended. It is the int vLLM itself sends for the same hash
// with the variable unset (maybe_convert_block_hash: int.from_bytes(hash, "big") masked to 64 bits), and the rule
// Dynamo's listener applies to bytes hashes since it decodes them (block_hash_bytes_to_u64); Dynamo 1.6.1 refuses
// them (its BlockHashValue is an i64 | u64 untagged enum: the batch fails to decode).
func HashKey(h []byte) uint64 {
	if len(h) >= 8 {
		return binary.BigEndian.Uint64(h[len(h)-8:])
	}
	var b [8]byte
	copy(b[8-len(h):], h)
	return binary.BigEndian.Uint64(b[:])
}
