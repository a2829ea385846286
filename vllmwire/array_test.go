package vllmwire

import (
	"encoding/hex"
	"testing"
)

// TestWireArrayIsMsgspecArrayLike: WireArray's events are byte for byte what msgspec encodes for vLLM 0.32.0's event
// structs declared array_like=True (tag first, every field positional, None where unset). The golden hex was made
// with msgspec 0.32.0's KVCacheEvent field lists (BlockStored 14 fields, BlockRemoved 5) and array_like=True.
func TestWireArrayIsMsgspecArrayLike(t *testing.T) {
	for _, c := range []struct {
		name string
		e    Event
		hex  string
	}{
		{"stored", Event{Kind: KindStored, BlockHashes: []uint64{1, 1<<63 + 5}, HasParent: true, ParentHash: 7,
			TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4, HasMedium: true, Medium: "GPU"},
			"9fab426c6f636b53746f7265649201cf800000000000000507940102030404c0a3475055c0c0c0c0c0c0c0c0"},
		{"stored, every optional field", Event{Kind: KindStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{9},
			BlockSize: 4, HasLoraID: true, LoraID: 3, HasLoraName: true, LoraName: "l", HasGroupIdx: true, GroupIdx: 2,
			HasKVCacheSpecKind: true, KVCacheSpecKind: "full_attention", HasSlidingWindow: true, KVCacheSpecSlidingWindow: 8},
			"9fab426c6f636b53746f7265649101c091090403c0a16cc002ae66756c6c5f617474656e74696f6e08c0c0c0"},
		{"removed", Event{Kind: KindRemoved, BlockHashes: []uint64{1, 2}, HasMedium: true, Medium: "GPU"},
			"96ac426c6f636b52656d6f766564920102a3475055c0c0c0"},
		{"removed with group", Event{Kind: KindRemoved, BlockHashes: []uint64{1}, HasGroupIdx: true, GroupIdx: 5},
			"96ac426c6f636b52656d6f7665649101c005c0c0"},
		{"cleared", Event{Kind: KindCleared}, "91b0416c6c426c6f636b73436c6561726564"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := hex.EncodeToString(WireArray.AppendEvent(nil, &c.e)); got != c.hex {
				t.Fatalf("WireArray.AppendEvent\n got %s\nwant %s", got, c.hex)
			}
		})
	}
}

func TestParseWireArray(t *testing.T) {
	w, err := ParseWire("array")
	if err != nil || w != WireArray || w.String() != "array" {
		t.Fatalf("ParseWire(array) = %v, %v", w, err)
	}
}
