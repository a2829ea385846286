// Package wirevectors reads testdata/vllmwire/vectors.json (vLLM 0.33.0), vectors_0.32.json (vLLM 0.32.0) and
// vectors_sglang.json (SGLang 0.5.23): KV-event batches, each with the payload msgspec encodes for it with that
// release's structs (testdata/vllmwire/gen_vectors.py writes the vLLM files from testdata/vllmwire/vllm_structs.py,
// both with the same cases; gen_sglang_vectors.py writes SGLang's with SGLang's own structs, in its venv).
// The tests of vllmwire check their encoder against the payloads byte for byte, the daemon's tests send the same
// batches through the ring; this package imports neither, so both can use it.
package wirevectors

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
)

// Event is one event of a vector, in kvshm's terms (token_ids in kvshm's layout; nil pointers are msgspec's None).
type Event struct {
	Kind         string   `json:"kind"` // "stored", "removed", "cleared"
	BlockHashes  []uint64 `json:"block_hashes"`
	TokenIDs     []uint32 `json:"token_ids"`
	IsEagle      bool     `json:"is_eagle"`
	BlockSize    uint32   `json:"block_size"`
	Parent       *uint64  `json:"parent"`
	LoraID       *int64   `json:"lora_id"`
	Medium       *string  `json:"medium"`
	LoraName     *string  `json:"lora_name"`
	GroupIdx     *uint32  `json:"group_idx"`
	SpecKind     *string  `json:"kv_cache_spec_kind"`
	Window       *uint32  `json:"kv_cache_spec_sliding_window"`
	ExtraKeysHex *string  `json:"extra_keys_hex"` // msgspec's encoding of extra_keys
	// Bytes block hashes (vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): the event's hashes concatenated (all
	// one length) and the parent's; BlockHashes and Parent then hold their index keys.
	HashBytesHex   *string `json:"block_hash_bytes_hex"`
	ParentBytesHex *string `json:"parent_bytes_hex"`
	// SGLang's BlockStored only (vectors_sglang.json).
	CacheSalt *string `json:"cache_salt"`
	SessionID *string `json:"session_id"`
}

// Files maps a wire (vllmwire's name: a vLLM release, an alias such as "0.31", or "sglang") to its vectors file
// under testdata/vllmwire.
var Files = map[string]string{"0.33": "vectors.json", "0.32": "vectors_0.32.json", "0.31": "vectors_0.31.json",
	"sglang": "vectors_sglang.json"}

// HashBytes returns the concatenated bytes block hashes (nil: the hashes are ints).
func (e Event) HashBytes() ([]byte, error) { return optHex(e.HashBytesHex) }

// ParentBytes returns the parent hash's bytes (nil: an int or None).
func (e Event) ParentBytes() ([]byte, error) { return optHex(e.ParentBytesHex) }

func optHex(s *string) ([]byte, error) {
	if s == nil {
		return nil, nil
	}
	b, err := hex.DecodeString(*s)
	if b == nil && err == nil {
		b = []byte{}
	}
	return b, err
}

// ExtraKeys returns the msgpack bytes of extra_keys (nil for None).
func (e Event) ExtraKeys() ([]byte, error) { return optHex(e.ExtraKeysHex) }

// Vector is one batch and msgspec's payload for it.
type Vector struct {
	Name       string  `json:"name"`
	TS         float64 `json:"ts"`
	DpRank     *int64  `json:"dp_rank"`
	Events     []Event `json:"events"`
	PayloadHex string  `json:"payload_hex"`
}

// Payload returns msgspec's encoding of the batch.
func (v Vector) Payload() ([]byte, error) { return hex.DecodeString(v.PayloadHex) }

// Load reads a vectors file; it fails on a file that is not one, or that holds fewer than min vectors.
func Load(path string, min int) ([]Vector, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f struct {
		Vectors []Vector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(f.Vectors) < min {
		return nil, fmt.Errorf("%s: %d vectors, want at least %d", path, len(f.Vectors), min)
	}
	return f.Vectors, nil
}
