package fbs

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/fbs/kvevent"
)

// go test ./proto/fbs -run TestVectors -update rewrites testdata/events from vectorCases.
var update = flag.Bool("update", false, "rewrite the shared event vectors in testdata/events")

const vectorDir = "../../testdata/events"

func seqTokens(n int, start uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = start + uint32(i)
	}
	return t
}

func seqHashes(n int, start uint64, step uint64) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = start + uint64(i)*step
	}
	return h
}

// vectorCases are the shared vectors (testdata/events/<name>.json + .bin). Each covers one encoding rule.
var vectorCases = []struct {
	name string
	ev   EventSpec
	// loraEmpty writes "lora_name": "" instead of null for an absent name (both mean the base model).
	loraEmpty bool
}{
	// A chain from the root: no parent_hash field.
	{name: "stored_root", ev: EventSpec{Seq: 7, DpRank: 1, Kind: KindStored,
		BlockHashes: []uint64{0x1111, 0x2222}, TokenIDs: seqTokens(8, 100)}},
	// A chain extending a parent.
	{name: "stored_parent", ev: EventSpec{Seq: 8, DpRank: 1, Kind: KindStored, HasParent: true, ParentHash: 0x2222,
		BlockHashes: []uint64{0x3333}, TokenIDs: seqTokens(4, 200)}},
	// A present parent equal to 0 is still written (null default).
	{name: "stored_parent_zero", ev: EventSpec{Seq: 9, Kind: KindStored, HasParent: true, ParentHash: 0,
		BlockHashes: []uint64{5}, TokenIDs: seqTokens(4, 1)}},
	// A LoRA name with non-ASCII bytes (UTF-8), and lengths that need string padding.
	{name: "stored_lora", ev: EventSpec{Seq: 10, DpRank: 2, Kind: KindStored, HasParent: true, ParentHash: 42,
		BlockHashes: []uint64{0xdead, 0xbeef, 0xf00d}, TokenIDs: seqTokens(12, 7), LoraName: "sql-adapter-é"}},
	{name: "stored_lora_len4", ev: EventSpec{Seq: 11, Kind: KindStored,
		BlockHashes: []uint64{1}, TokenIDs: seqTokens(2, 1), LoraName: "abcd"}},
	// Eagle windows: n*bs+1 tokens.
	{name: "stored_eagle", ev: EventSpec{Seq: 12, Kind: KindStored, BlockHashes: []uint64{77, 78},
		TokenIDs: seqTokens(9, 1000), IsEagle: true}},
	// seq 0 and dp_rank 0 are defaults and not written.
	{name: "stored_defaults", ev: EventSpec{Kind: KindStored, BlockHashes: []uint64{1}, TokenIDs: seqTokens(4, 0)}},
	// Values at and above 2^63 (never through float64 or signed types).
	{name: "stored_large", ev: EventSpec{Seq: math.MaxUint64, DpRank: math.MaxUint32, Kind: KindStored, HasParent: true,
		ParentHash: 1 << 63, BlockHashes: []uint64{1 << 63, math.MaxUint64, 0x8000000000000001},
		TokenIDs: []uint32{math.MaxUint32, 0, 1 << 31, 5, 6, 7}, LoraName: "L", IsEagle: true}},
	// Empty vectors are still written; an empty LoRA name is absent.
	{name: "stored_empty", ev: EventSpec{Seq: 3, Kind: KindStored, BlockHashes: []uint64{}, TokenIDs: []uint32{}},
		loraEmpty: true},
	// An odd token count (the u64 vector after it needs alignment padding).
	{name: "stored_odd_tokens", ev: EventSpec{Seq: 13, Kind: KindStored, BlockHashes: []uint64{9},
		TokenIDs: seqTokens(3, 3)}},
	// The benchmark shape: 32 blocks × 32 tokens with a parent.
	{name: "stored_32x32", ev: EventSpec{Seq: 1 << 40, DpRank: 3, Kind: KindStored, HasParent: true,
		ParentHash: 0xfedcba9876543210, BlockHashes: seqHashes(32, 0x9e3779b97f4a7c15, 0x9e3779b97f4a7c15),
		TokenIDs: seqTokens(32*32, 50000)}},
	{name: "removed", ev: EventSpec{Seq: 20, DpRank: 1, Kind: KindRemoved, BlockHashes: []uint64{0x3333, 1 << 63}}},
	{name: "removed_empty", ev: EventSpec{Seq: 21, Kind: KindRemoved, BlockHashes: []uint64{}}},
	{name: "removed_defaults", ev: EventSpec{Kind: KindRemoved, BlockHashes: []uint64{1}}},
	{name: "removed_32", ev: EventSpec{Seq: 22, DpRank: 7, Kind: KindRemoved, BlockHashes: seqHashes(32, 1, 3)}},
	{name: "cleared", ev: EventSpec{Seq: 30, DpRank: 1, Kind: KindCleared}},
	{name: "cleared_defaults", ev: EventSpec{Kind: KindCleared}},
	{name: "cleared_large", ev: EventSpec{Seq: math.MaxUint64, DpRank: math.MaxUint32, Kind: KindCleared}},
}

// vectorJSON is the shared JSON input shape of testdata/events (<name>.json beside <name>.bin; read by this test and
// pybind/tests/test_encode.py).
type vectorJSON struct {
	Seq         uint64   `json:"seq"`
	DpRank      uint32   `json:"dp_rank"`
	Kind        string   `json:"kind"`
	ParentHash  *uint64  `json:"parent_hash"`
	BlockHashes []uint64 `json:"block_hashes"`
	TokenIDs    []uint32 `json:"token_ids"`
	LoraName    *string  `json:"lora_name"`
	IsEagle     bool     `json:"is_eagle"`
}

func toJSON(ev *EventSpec, loraEmpty bool) vectorJSON {
	j := vectorJSON{Seq: ev.Seq, DpRank: ev.DpRank, Kind: ev.Kind.String(), IsEagle: ev.IsEagle,
		BlockHashes: append([]uint64{}, ev.BlockHashes...), TokenIDs: append([]uint32{}, ev.TokenIDs...)}
	if ev.HasParent {
		p := ev.ParentHash
		j.ParentHash = &p
	}
	if ev.LoraName != "" || loraEmpty {
		l := ev.LoraName
		j.LoraName = &l
	}
	return j
}

func fromJSON(t *testing.T, j vectorJSON) EventSpec {
	t.Helper()
	ev := EventSpec{Seq: j.Seq, DpRank: j.DpRank, BlockHashes: j.BlockHashes, TokenIDs: j.TokenIDs,
		IsEagle: j.IsEagle}
	switch j.Kind {
	case "stored":
		ev.Kind = KindStored
	case "removed":
		ev.Kind = KindRemoved
	case "cleared":
		ev.Kind = KindCleared
	default:
		t.Fatalf("unknown kind %q", j.Kind)
	}
	if j.ParentHash != nil {
		ev.HasParent, ev.ParentHash = true, *j.ParentHash
	}
	if j.LoraName != nil {
		ev.LoraName = *j.LoraName
	}
	return ev
}

// checkView asserts that v carries exactly ev's values.
func checkView(t testing.TB, ev *EventSpec, v *EventView) {
	t.Helper()
	if v.Seq != ev.Seq || v.DpRank != ev.DpRank || v.Kind != ev.Kind {
		t.Fatalf("seq/dp/kind = %d/%d/%v, want %d/%d/%v", v.Seq, v.DpRank, v.Kind, ev.Seq, ev.DpRank, ev.Kind)
	}
	wantHashes := ev.BlockHashes
	if ev.Kind == KindCleared {
		wantHashes = nil
	}
	if v.NumBlocks() != len(wantHashes) {
		t.Fatalf("NumBlocks = %d, want %d", v.NumBlocks(), len(wantHashes))
	}
	for i, h := range wantHashes {
		if got := v.BlockHash(i); got != h {
			t.Fatalf("BlockHash(%d) = %#x, want %#x", i, got, h)
		}
	}
	if ev.Kind != KindStored {
		if v.HasParent || v.NumTokens() != 0 || len(v.LoraName) != 0 || v.IsEagle {
			t.Fatalf("%v event carries stored fields: %+v", ev.Kind, v)
		}
		return
	}
	if v.HasParent != ev.HasParent || v.ParentHash != ev.ParentHash {
		t.Fatalf("parent = %v/%#x, want %v/%#x", v.HasParent, v.ParentHash, ev.HasParent, ev.ParentHash)
	}
	if v.NumTokens() != len(ev.TokenIDs) {
		t.Fatalf("NumTokens = %d, want %d", v.NumTokens(), len(ev.TokenIDs))
	}
	for i, tok := range ev.TokenIDs {
		if got := v.TokenID(i); got != tok {
			t.Fatalf("TokenID(%d) = %d, want %d", i, got, tok)
		}
	}
	if string(v.LoraName) != ev.LoraName || v.IsEagle != ev.IsEagle {
		t.Fatalf("lora/eagle = %q/%v, want %q/%v", v.LoraName, v.IsEagle, ev.LoraName, ev.IsEagle)
	}
}

// checkOfficial reads p with the generated accessors and compares with v (both must agree on valid input).
func checkOfficial(t testing.TB, p []byte, v *EventView) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("official accessors panicked on a payload Decode accepted: %v\n%x", r, p)
		}
	}()
	e := kvevent.GetRootAsEvent(p, 0)
	if e.Seq() != v.Seq || e.DpRank() != v.DpRank || Kind(e.DataType()) != v.Kind {
		t.Fatalf("official seq/dp/kind %d/%d/%d != view %d/%d/%d", e.Seq(), e.DpRank(), e.DataType(),
			v.Seq, v.DpRank, v.Kind)
	}
	var tab flatbuffers.Table
	if !e.Data(&tab) {
		t.Fatalf("official reader finds no data")
	}
	switch v.Kind {
	case KindStored:
		var s kvevent.Stored
		s.Init(tab.Bytes, tab.Pos)
		if ph := s.ParentHash(); (ph != nil) != v.HasParent || ph != nil && *ph != v.ParentHash {
			t.Fatalf("official parent %v != view %v/%#x", ph, v.HasParent, v.ParentHash)
		}
		if s.BlockHashesLength() != v.NumBlocks() || s.TokenIdsLength() != v.NumTokens() {
			t.Fatalf("official lengths %d/%d != view %d/%d", s.BlockHashesLength(), s.TokenIdsLength(),
				v.NumBlocks(), v.NumTokens())
		}
		for i := 0; i < v.NumBlocks(); i++ {
			if s.BlockHashes(i) != v.BlockHash(i) {
				t.Fatalf("official hash %d differs", i)
			}
		}
		for i := 0; i < v.NumTokens(); i++ {
			if s.TokenIds(i) != v.TokenID(i) {
				t.Fatalf("official token %d differs", i)
			}
		}
		if !bytes.Equal(s.LoraName(), v.LoraName) || s.IsEagle() != v.IsEagle {
			t.Fatalf("official lora/eagle %q/%v != view %q/%v", s.LoraName(), s.IsEagle(), v.LoraName, v.IsEagle)
		}
	case KindRemoved:
		var r kvevent.Removed
		r.Init(tab.Bytes, tab.Pos)
		if r.BlockHashesLength() != v.NumBlocks() {
			t.Fatalf("official length %d != view %d", r.BlockHashesLength(), v.NumBlocks())
		}
		for i := 0; i < v.NumBlocks(); i++ {
			if r.BlockHashes(i) != v.BlockHash(i) {
				t.Fatalf("official hash %d differs", i)
			}
		}
	}
}

// TestVectors checks Build against the committed shared vectors (or rewrites them with -update), and Decode
// plus the official reader on every .bin.
func TestVectors(t *testing.T) {
	if *update {
		if err := os.MkdirAll(vectorDir, 0o755); err != nil {
			t.Fatal(err)
		}
		b := flatbuffers.NewBuilder(0)
		for _, c := range vectorCases {
			js, err := json.Marshal(toJSON(&c.ev, c.loraEmpty))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(vectorDir, c.name+".json"), append(js, '\n'), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(vectorDir, c.name+".bin"), Build(b, &c.ev), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	files, err := filepath.Glob(filepath.Join(vectorDir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(files))
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".json"))
	}
	want := make([]string, 0, len(vectorCases))
	for _, c := range vectorCases {
		want = append(want, c.name)
	}
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Fatalf("testdata/events holds %v, want %v (run go test ./proto/fbs -run TestVectors -update)", names, want)
	}
	b := flatbuffers.NewBuilder(64) // a different initial size must not change the bytes
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(vectorDir, name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var j vectorJSON
			if err := json.Unmarshal(raw, &j); err != nil {
				t.Fatal(err)
			}
			ev := fromJSON(t, j)
			bin, err := os.ReadFile(filepath.Join(vectorDir, name+".bin"))
			if err != nil {
				t.Fatal(err)
			}
			if got := Build(b, &ev); !bytes.Equal(got, bin) {
				t.Fatalf("Build differs from %s.bin:\n got %x\nwant %x", name, got, bin)
			}
			var v EventView
			if err := Decode(bin, &v); err != nil {
				t.Fatalf("Decode(%s.bin): %v", name, err)
			}
			checkView(t, &ev, &v)
			checkOfficial(t, bin, &v)
		})
	}
}

// fieldLayout locates the bytes of a built payload that the malformed cases corrupt.
type fieldLayout struct {
	root, rootVT   int // Event table and vtable
	data, dataVT   int // Stored/Removed/Cleared table and vtable
	dataTypePos    int // the union type byte
	dataFieldPos   int // the uoffset to the data table
	hashesFieldPos int // Stored/Removed: uoffset to block_hashes
	tokensFieldPos int // Stored: uoffset to token_ids
	loraFieldPos   int
	eaglePos       int
}

func layoutOf(t *testing.T, p []byte) fieldLayout {
	t.Helper()
	var l fieldLayout
	l.root = int(binary.LittleEndian.Uint32(p))
	l.rootVT = l.root - int(int32(binary.LittleEndian.Uint32(p[l.root:])))
	slot := func(tab, vt, i int) int {
		vtSize := int(binary.LittleEndian.Uint16(p[vt:]))
		if 4+2*i >= vtSize {
			return 0
		}
		off := int(binary.LittleEndian.Uint16(p[vt+4+2*i:]))
		if off == 0 {
			return 0
		}
		return tab + off
	}
	l.dataTypePos = slot(l.root, l.rootVT, slotEventDataType)
	l.dataFieldPos = slot(l.root, l.rootVT, slotEventData)
	l.data = l.dataFieldPos + int(binary.LittleEndian.Uint32(p[l.dataFieldPos:]))
	l.dataVT = l.data - int(int32(binary.LittleEndian.Uint32(p[l.data:])))
	switch Kind(p[l.dataTypePos]) {
	case KindStored:
		l.hashesFieldPos = slot(l.data, l.dataVT, slotStoredHashes)
		l.tokensFieldPos = slot(l.data, l.dataVT, slotStoredTokens)
		l.loraFieldPos = slot(l.data, l.dataVT, slotStoredLora)
		l.eaglePos = slot(l.data, l.dataVT, slotStoredEagle)
	case KindRemoved:
		l.hashesFieldPos = slot(l.data, l.dataVT, slotRemovedHashes)
	}
	return l
}

func put16(p []byte, at, v int) { binary.LittleEndian.PutUint16(p[at:], uint16(v)) }
func put32(p []byte, at int, v uint32) {
	binary.LittleEndian.PutUint32(p[at:], v)
}
func get32(p []byte, at int) uint32 { return binary.LittleEndian.Uint32(p[at:]) }

// TestDecodeMalformed corrupts valid payloads one rule at a time; each must fail with its reason.
func TestDecodeMalformed(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	full := EventSpec{Seq: 5, DpRank: 1, Kind: KindStored, HasParent: true, ParentHash: 9,
		BlockHashes: []uint64{1, 2}, TokenIDs: seqTokens(8, 1), LoraName: "lora", IsEagle: true}
	plain := EventSpec{Seq: 5, DpRank: 1, Kind: KindStored, BlockHashes: []uint64{1, 2}, TokenIDs: seqTokens(8, 1)}
	removed := EventSpec{Seq: 6, Kind: KindRemoved, BlockHashes: []uint64{1, 2}}
	cleared := EventSpec{Seq: 6, DpRank: 2, Kind: KindCleared}

	cases := []struct {
		name   string
		ev     *EventSpec
		mutate func(p []byte, l fieldLayout) []byte
		reason string // "" = must still decode
	}{
		{"empty", &plain, func(p []byte, _ fieldLayout) []byte { return nil }, reasonShort},
		{"15 bytes", &plain, func(p []byte, _ fieldLayout) []byte { return p[:15] }, reasonShort},
		{"identifier", &plain, func(p []byte, _ fieldLayout) []byte { p[7] = 'X'; return p }, reasonIdentifier},
		{"root inside header", &plain, func(p []byte, _ fieldLayout) []byte { put32(p, 0, 4); return p }, reasonRootOffset},
		{"root past end", &plain, func(p []byte, _ fieldLayout) []byte { put32(p, 0, uint32(len(p))); return p }, reasonRootOffset},
		{"root huge", &plain, func(p []byte, _ fieldLayout) []byte { put32(p, 0, math.MaxUint32); return p }, reasonRootOffset},
		{"root misaligned", &plain, func(p []byte, _ fieldLayout) []byte { put32(p, 0, 10); return p }, reasonTableAlign},
		{"vtable before buffer", &plain, func(p []byte, l fieldLayout) []byte {
			put32(p, l.root, uint32(l.root+2)) // vtable at -2
			return p
		}, reasonVtableBounds},
		{"vtable past end", &plain, func(p []byte, l fieldLayout) []byte {
			put32(p, l.root, uint32(int32(l.root-len(p)))) // vtable at len(p)
			return p
		}, reasonVtableBounds},
		{"vtable odd", &plain, func(p []byte, l fieldLayout) []byte {
			put32(p, l.root, get32(p, l.root)+1)
			return p
		}, reasonVtableBounds},
		{"vtable size 3", &plain, func(p []byte, l fieldLayout) []byte { put16(p, l.rootVT, 3); return p }, reasonVtableSize},
		{"vtable size 2", &plain, func(p []byte, l fieldLayout) []byte { put16(p, l.rootVT, 2); return p }, reasonVtableSize},
		{"vtable size past end", &plain, func(p []byte, l fieldLayout) []byte { put16(p, l.rootVT, 0xfffe); return p }, reasonVtableSize},
		{"table size 2", &plain, func(p []byte, l fieldLayout) []byte { put16(p, l.rootVT+2, 2); return p }, reasonTableSize},
		{"table size past end", &plain, func(p []byte, l fieldLayout) []byte { put16(p, l.rootVT+2, 0xffff); return p }, reasonTableSize},
		{"seq outside table", &plain, func(p []byte, l fieldLayout) []byte {
			put16(p, l.rootVT+4, int(binary.LittleEndian.Uint16(p[l.rootVT+2:]))-4)
			return p
		}, reasonFieldBounds},
		{"field overlaps vtable offset", &plain, func(p []byte, l fieldLayout) []byte {
			put16(p, l.rootVT+4+2*slotEventDataType, 2)
			return p
		}, reasonFieldBounds},
		{"dp_rank misaligned", &plain, func(p []byte, l fieldLayout) []byte { put16(p, l.rootVT+6, 6); return p }, reasonFieldAlign},
		{"data type NONE", &plain, func(p []byte, l fieldLayout) []byte { p[l.dataTypePos] = 0; return p }, reasonTypeWithNoData},
		{"data type absent", &plain, func(p []byte, l fieldLayout) []byte {
			put16(p, l.rootVT+4+2*slotEventDataType, 0)
			return p
		}, reasonTypeWithNoData},
		{"data type unknown", &plain, func(p []byte, l fieldLayout) []byte { p[l.dataTypePos] = 4; return p }, reasonUnknownType},
		{"data missing", &plain, func(p []byte, l fieldLayout) []byte {
			put16(p, l.rootVT+4+2*slotEventData, 0)
			return p
		}, reasonDataMissing},
		{"data past end", &plain, func(p []byte, l fieldLayout) []byte {
			put32(p, l.dataFieldPos, uint32(len(p)-l.dataFieldPos))
			return p
		}, reasonTableBounds},
		{"data offset wraps", &plain, func(p []byte, l fieldLayout) []byte {
			put32(p, l.dataFieldPos, math.MaxUint32-3)
			return p
		}, reasonTableBounds},
		{"stored read as removed is fine", &plain, func(p []byte, l fieldLayout) []byte {
			p[l.dataTypePos] = byte(KindRemoved) // Removed's slot 0 is Stored's parent: absent here
			return p
		}, ""},
		{"stored read as cleared", &plain, func(p []byte, l fieldLayout) []byte {
			// A Cleared table with fields this schema does not know reads as a Cleared from a newer schema,
			// so the vectors are not treated as leftover bytes.
			p[l.dataTypePos] = byte(KindCleared)
			return p
		}, ""},
		{"hashes count huge", &plain, func(p []byte, l fieldLayout) []byte {
			at := l.hashesFieldPos + int(get32(p, l.hashesFieldPos))
			put32(p, at, math.MaxUint32)
			return p
		}, reasonVectorBounds},
		{"tokens count one too many", &plain, func(p []byte, l fieldLayout) []byte {
			at := l.tokensFieldPos + int(get32(p, l.tokensFieldPos))
			put32(p, at, get32(p, at)+1)
			return p
		}, reasonVectorBounds},
		{"tokens offset misaligned", &plain, func(p []byte, l fieldLayout) []byte {
			put32(p, l.tokensFieldPos, get32(p, l.tokensFieldPos)+2)
			return p
		}, reasonVectorAlign},
		{"hashes data not 8-aligned", &plain, func(p []byte, l fieldLayout) []byte {
			put32(p, l.hashesFieldPos, get32(p, l.hashesFieldPos)-4) // length word moves to the pad slot
			return p
		}, reasonVectorAlign},
		{"tokens offset past end", &plain, func(p []byte, l fieldLayout) []byte {
			put32(p, l.tokensFieldPos, uint32(len(p)-l.tokensFieldPos))
			return p
		}, reasonVectorBounds},
		{"lora missing NUL", &full, func(p []byte, l fieldLayout) []byte {
			at := l.loraFieldPos + int(get32(p, l.loraFieldPos))
			p[at+4+4] = 'x'
			return p
		}, reasonStringNUL},
		{"lora length huge", &full, func(p []byte, l fieldLayout) []byte {
			at := l.loraFieldPos + int(get32(p, l.loraFieldPos))
			put32(p, at, math.MaxUint32)
			return p
		}, reasonStringBounds},
		{"lora NUL past end", &full, func(p []byte, l fieldLayout) []byte {
			at := l.loraFieldPos + int(get32(p, l.loraFieldPos))
			put32(p, at, uint32(len(p)-at-4))
			return p
		}, reasonStringBounds},
		{"lora offset past end", &full, func(p []byte, l fieldLayout) []byte {
			put32(p, l.loraFieldPos, uint32(len(p)-l.loraFieldPos))
			return p
		}, reasonStringBounds},
		{"is_eagle 2", &full, func(p []byte, l fieldLayout) []byte { p[l.eaglePos] = 2; return p }, reasonBool},
		{"removed hashes huge", &removed, func(p []byte, l fieldLayout) []byte {
			at := l.hashesFieldPos + int(get32(p, l.hashesFieldPos))
			put32(p, at, 1<<29)
			return p
		}, reasonVectorBounds},
		{"cleared vtable size 0", &cleared, func(p []byte, l fieldLayout) []byte { put16(p, l.dataVT, 0); return p }, reasonVtableSize},
		{"trailing 8 bytes", &plain, func(p []byte, _ fieldLayout) []byte { return append(p, make([]byte, 8)...) }, reasonTrailing},
		{"trailing 4 bytes on unpadded buffer", &plain, func(p []byte, _ fieldLayout) []byte {
			return append(p, 0, 0, 0, 0)
		}, ""},
		{"cleared trailing 8 bytes", &cleared, func(p []byte, _ fieldLayout) []byte { return append(p, make([]byte, 8)...) }, reasonTrailing},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := slices.Clone(Build(b, c.ev))
			p = c.mutate(p, layoutOf(t, p))
			var v EventView
			err := Decode(p, &v)
			if c.reason == "" {
				if err != nil {
					t.Fatalf("Decode: %v, want success", err)
				}
				checkOfficial(t, p, &v)
				return
			}
			var me *MalformedError
			if !errors.As(err, &me) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode error = %v, want *MalformedError wrapping ErrMalformed (%q)", err, c.reason)
			}
			if me.Reason != c.reason {
				t.Fatalf("Decode reason = %q (at %d), want %q", me.Reason, me.Offset, c.reason)
			}
			if v.Kind != 0 || v.BlockHashes != nil || v.Seq != 0 {
				t.Fatalf("view not zeroed after error: %+v", v)
			}
		})
	}
}

// buildStoredWithExtraField builds a Stored event as a newer schema might: a sixth field (u32 in slot 5) and a
// vector kvshm does not know, created first so it lies after everything kvshm reads.
func buildStoredWithExtraField() []byte {
	b := flatbuffers.NewBuilder(0)
	b.StartVector(4, 3, 4)
	for i := 3; i > 0; i-- {
		b.PrependUint32(uint32(i))
	}
	extra := b.EndVector(3)
	kvevent.StoredStartTokenIdsVector(b, 4)
	for i := 4; i > 0; i-- {
		b.PrependUint32(uint32(i))
	}
	tokens := b.EndVector(4)
	kvevent.StoredStartBlockHashesVector(b, 1)
	b.PrependUint64(99)
	hashes := b.EndVector(1)
	b.StartObject(6)
	kvevent.StoredAddBlockHashes(b, hashes)
	kvevent.StoredAddTokenIds(b, tokens)
	b.PrependUOffsetTSlot(5, extra, 0)
	data := b.EndObject()
	kvevent.EventStart(b)
	kvevent.EventAddSeq(b, 1)
	kvevent.EventAddDataType(b, kvevent.EventDataStored)
	kvevent.EventAddData(b, data)
	kvevent.FinishEventBuffer(b, kvevent.EventEnd(b))
	return b.FinishedBytes()
}

func TestDecodeForwardCompatible(t *testing.T) {
	p := buildStoredWithExtraField()
	var v EventView
	if err := Decode(p, &v); err != nil {
		t.Fatalf("Decode of an event with a field from a newer schema: %v", err)
	}
	checkView(t, &EventSpec{Seq: 1, Kind: KindStored, BlockHashes: []uint64{99}, TokenIDs: []uint32{1, 2, 3, 4}}, &v)
}

func TestBuildUnknownKindPanics(t *testing.T) {
	defer func() {
		if r := recover(); r == nil {
			t.Fatal("Build with kind 9 did not panic")
		}
	}()
	Build(flatbuffers.NewBuilder(0), &EventSpec{Kind: 9})
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{KindStored: "stored", KindRemoved: "removed", KindCleared: "cleared", 0: "kind(0)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
}

func TestDecodeAllocatesNothing(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	ev := EventSpec{Seq: 1, Kind: KindStored, HasParent: true, BlockHashes: seqHashes(32, 1, 1),
		TokenIDs: seqTokens(32*32, 1), LoraName: "x", IsEagle: true}
	p := slices.Clone(Build(b, &ev))
	var v EventView
	if n := testing.AllocsPerRun(100, func() {
		if err := Decode(p, &v); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Decode allocates %v times per call, want 0", n)
	}
}

// randomSpec draws an event exercising every optional part.
func randomSpec(r *rand.Rand) EventSpec {
	ev := EventSpec{Kind: Kind(1 + r.IntN(3))}
	if r.IntN(4) != 0 {
		ev.Seq = r.Uint64() >> r.IntN(64)
	}
	if r.IntN(3) != 0 {
		ev.DpRank = r.Uint32() >> r.IntN(32)
	}
	if ev.Kind == KindCleared {
		return ev
	}
	ev.BlockHashes = make([]uint64, r.IntN(40))
	for i := range ev.BlockHashes {
		ev.BlockHashes[i] = r.Uint64()
	}
	if ev.Kind == KindRemoved {
		return ev
	}
	ev.TokenIDs = make([]uint32, r.IntN(300))
	for i := range ev.TokenIDs {
		ev.TokenIDs[i] = r.Uint32()
	}
	ev.HasParent = r.IntN(2) == 0
	if ev.HasParent {
		ev.ParentHash = r.Uint64()
	}
	if r.IntN(2) == 0 {
		ev.LoraName = strings.Repeat("x", r.IntN(12))
	}
	ev.IsEagle = r.IntN(2) == 0
	return ev
}

// TestRoundTripRandom builds random events and decodes them (seed printed for replay).
func TestRoundTripRandom(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	b := flatbuffers.NewBuilder(0)
	for i := 0; i < 500; i++ {
		ev := randomSpec(r)
		p := Build(b, &ev)
		var v EventView
		if err := Decode(p, &v); err != nil {
			t.Fatalf("seed %d event %d: Decode: %v (%+v)", seed, i, err, ev)
		}
		checkView(t, &ev, &v)
		checkOfficial(t, p, &v)
	}
}

func specFromView(v *EventView) EventSpec {
	ev := EventSpec{Seq: v.Seq, DpRank: v.DpRank, Kind: v.Kind, HasParent: v.HasParent, ParentHash: v.ParentHash,
		LoraName: string(v.LoraName), IsEagle: v.IsEagle}
	for i := 0; i < v.NumBlocks(); i++ {
		ev.BlockHashes = append(ev.BlockHashes, v.BlockHash(i))
	}
	for i := 0; i < v.NumTokens(); i++ {
		ev.TokenIDs = append(ev.TokenIDs, v.TokenID(i))
	}
	return ev
}

// FuzzDecode: arbitrary payloads never panic; an accepted payload reads the same through the official
// accessors, and re-encoding its view with Build decodes to the same view.
func FuzzDecode(f *testing.F) {
	b := flatbuffers.NewBuilder(0)
	for _, c := range vectorCases {
		f.Add(slices.Clone(Build(b, &c.ev)))
	}
	f.Add(buildStoredWithExtraField())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) > 1<<16 {
			return
		}
		var v EventView
		if err := Decode(p, &v); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		checkOfficial(t, p, &v)
		ev := specFromView(&v)
		q := Build(b, &ev)
		var w EventView
		if err := Decode(q, &w); err != nil {
			t.Fatalf("re-encoded view does not decode: %v", err)
		}
		checkView(t, &ev, &w)
	})
}

// FuzzRoundTrip: Build→Decode returns the built values for any field combination.
func FuzzRoundTrip(f *testing.F) {
	f.Add(uint64(0), uint32(0), uint8(1), true, uint64(1<<63), []byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{1, 0, 0, 0}, "", false)
	f.Add(uint64(math.MaxUint64), uint32(7), uint8(2), false, uint64(0), []byte{}, []byte{}, "lora", true)
	f.Add(uint64(3), uint32(1), uint8(3), false, uint64(0), []byte{}, []byte{}, "", false)
	b := flatbuffers.NewBuilder(0)
	f.Fuzz(func(t *testing.T, seq uint64, dp uint32, kind uint8, hasParent bool, parent uint64, hashes, tokens []byte,
		lora string, eagle bool) {
		ev := EventSpec{Seq: seq, DpRank: dp, Kind: Kind(1 + kind%3)}
		if ev.Kind != KindCleared {
			for i := 0; i+8 <= len(hashes); i += 8 {
				ev.BlockHashes = append(ev.BlockHashes, binary.LittleEndian.Uint64(hashes[i:]))
			}
		}
		if ev.Kind == KindStored {
			for i := 0; i+4 <= len(tokens); i += 4 {
				ev.TokenIDs = append(ev.TokenIDs, binary.LittleEndian.Uint32(tokens[i:]))
			}
			ev.HasParent, ev.ParentHash, ev.LoraName, ev.IsEagle = hasParent, parent, lora, eagle
			if !hasParent {
				ev.ParentHash = 0
			}
			if strings.IndexByte(lora, 0) >= 0 {
				ev.LoraName = "" // a NUL inside would still decode; keep the comparison simple
			}
		}
		p := Build(b, &ev)
		var v EventView
		if err := Decode(p, &v); err != nil {
			t.Fatalf("Decode(Build(%+v)): %v", ev, err)
		}
		checkView(t, &ev, &v)
	})
}

var sinkView EventView

// go test ./proto/fbs -run '^$' -bench . -benchtime 200ms
func BenchmarkDecode(b *testing.B) {
	for _, blocks := range []int{1, 32} {
		ev := EventSpec{Seq: 1, Kind: KindStored, HasParent: true, ParentHash: 1,
			BlockHashes: seqHashes(blocks, 1, 1), TokenIDs: seqTokens(blocks*32, 1)}
		p := slices.Clone(Build(flatbuffers.NewBuilder(0), &ev))
		b.Run(fmt.Sprintf("kind=stored/blocks=%d", blocks), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				if err := Decode(p, &sinkView); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkBuild(b *testing.B) {
	ev := EventSpec{Seq: 1, Kind: KindStored, HasParent: true, ParentHash: 1,
		BlockHashes: seqHashes(32, 1, 1), TokenIDs: seqTokens(32*32, 1)}
	fb := flatbuffers.NewBuilder(8192)
	b.Run("kind=stored/blocks=32", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(Build(fb, &ev))))
		for b.Loop() {
			Build(fb, &ev)
		}
	})
}
