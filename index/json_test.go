package index

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files (testdata/*.txt, ../testdata/json/*.json)")

// Literal RouterEvent examples (the serde shape of upstream protocols.rs), as in testdata/json/blocks.
const (
	refStored  = `{"worker_id":7,"storage_tier":"device","event":{"event_id":42,"data":{"stored":{"parent_hash":270656378982115943,"start_position":null,"blocks":[{"block_hash":2733357436102908004,"tokens_hash":2825904518766229643,"mm_extra_info":null},{"block_hash":2451106649480522483,"tokens_hash":10358785732907640880,"mm_extra_info":null}]}},"dp_rank":0}}`
	refRemoved = `{"worker_id":7,"storage_tier":"device","event":{"event_id":43,"data":{"removed":{"block_hashes":[18405780835976372970]}},"dp_rank":0}}`
	refCleared = `{"worker_id":7,"storage_tier":"device","event":{"event_id":44,"data":"cleared","dp_rank":0}}`
)

// Shapes mirroring the reference's serde types, for decoding with encoding/json (u64 fields stay exact).
type jsRouterEvent struct {
	WorkerID        uint64       `json:"worker_id"`
	StorageTier     string       `json:"storage_tier"`
	ResidencyDomain *string      `json:"residency_domain,omitempty"` // 1.6.1 wire: "worker"
	Event           jsKvCacheEvt `json:"event"`
}

type jsKvCacheEvt struct {
	EventID uint64          `json:"event_id"`
	Data    json.RawMessage `json:"data"`
	DpRank  uint32          `json:"dp_rank"`
}

type jsStoreData struct {
	ParentHash    *uint64         `json:"parent_hash"`
	StartPosition *uint32         `json:"start_position"`
	Blocks        []jsStoredBlock `json:"blocks"`
}

type jsStoredBlock struct {
	BlockHash   uint64          `json:"block_hash"`
	TokensHash  uint64          `json:"tokens_hash"`
	MmExtraInfo json.RawMessage `json:"mm_extra_info"`
}

type jsRemoveData struct {
	BlockHashes []uint64 `json:"block_hashes"`
}

type jsEventList struct {
	Events      []jsRouterEvent `json:"events"`
	LastEventID uint64          `json:"last_event_id"`
	ResetScope  *string         `json:"reset_scope,omitempty"` // TreeDump, 1.6.1 wire: "all"
}

type jsTooNew struct {
	RequestedStart *uint64 `json:"requested_start"`
	RequestedEnd   *uint64 `json:"requested_end"`
	NewestAvail    uint64  `json:"newest_available"`
}

type jsInvalidRange struct {
	StartID uint64 `json:"start_id"`
	EndID   uint64 `json:"end_id"`
}

// decodedEvent is a RouterEvent decoded strictly into the shapes above and converted back to an Event.
func decodeRouterEvent(b []byte) (worker uint64, ev Event, err error) {
	var re jsRouterEvent
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&re); err != nil {
		return 0, ev, err
	}
	if re.StorageTier != "device" {
		return 0, ev, fmt.Errorf("storage_tier %q", re.StorageTier)
	}
	ev.ID, ev.DpRank = re.Event.EventID, re.Event.DpRank
	raw := re.Event.Data
	if string(raw) == `"cleared"` {
		ev.Kind = KindCleared
		return re.WorkerID, ev, nil
	}
	var tagged map[string]json.RawMessage
	if err := json.Unmarshal(raw, &tagged); err != nil || len(tagged) != 1 {
		return 0, ev, fmt.Errorf("data %s: not externally tagged (%v)", raw, err)
	}
	if s, ok := tagged["stored"]; ok {
		var sd jsStoreData
		d := json.NewDecoder(bytes.NewReader(s))
		d.DisallowUnknownFields()
		if err := d.Decode(&sd); err != nil {
			return 0, ev, err
		}
		if sd.StartPosition != nil {
			return 0, ev, fmt.Errorf("start_position %d, want null", *sd.StartPosition)
		}
		ev.Kind = KindStored
		if sd.ParentHash != nil {
			ev.HasParent, ev.Parent = true, *sd.ParentHash
		}
		for _, b := range sd.Blocks {
			if string(b.MmExtraInfo) != "null" {
				return 0, ev, fmt.Errorf("mm_extra_info %s, want null", b.MmExtraInfo)
			}
			ev.Blocks = append(ev.Blocks, Block{b.BlockHash, b.TokensHash})
		}
		return re.WorkerID, ev, nil
	}
	if r, ok := tagged["removed"]; ok {
		var rd jsRemoveData
		d := json.NewDecoder(bytes.NewReader(r))
		d.DisallowUnknownFields()
		if err := d.Decode(&rd); err != nil {
			return 0, ev, err
		}
		ev.Kind, ev.Hashes = KindRemoved, rd.BlockHashes
		return re.WorkerID, ev, nil
	}
	return 0, ev, fmt.Errorf("data %s: unknown variant", raw)
}

// decodeResponse decodes a WorkerKvQueryResponse strictly and returns its variant and decoded value.
func decodeResponse(b []byte) (RespKind, any, error) {
	var tagged map[string]json.RawMessage
	if err := json.Unmarshal(b, &tagged); err != nil {
		return 0, nil, err
	}
	if len(tagged) != 1 {
		return 0, nil, fmt.Errorf("%d variants", len(tagged))
	}
	strict := func(raw []byte, v any) error {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		return d.Decode(v)
	}
	for k, raw := range tagged {
		switch k {
		case "Events", "TreeDump":
			var l jsEventList
			if err := strict(raw, &l); err != nil {
				return 0, nil, err
			}
			kind := RespEvents
			if k == "TreeDump" {
				kind = RespTreeDump
			}
			return kind, l, nil
		case "TooNew":
			var v jsTooNew
			err := strict(raw, &v)
			return RespTooNew, v, err
		case "InvalidRange":
			var v jsInvalidRange
			err := strict(raw, &v)
			return RespInvalidRange, v, err
		case "Error":
			var s string
			err := json.Unmarshal(raw, &s)
			return RespError, s, err
		}
		return 0, nil, fmt.Errorf("unknown variant %q", k)
	}
	panic("unreachable")
}

func TestRouterEventReferenceExamples(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want string
	}{
		{"stored", AppendStoredJSON(nil, DumpBlocks, 7, 42, 0, true, 270656378982115943, []Block{
			{2733357436102908004, 2825904518766229643}, {2451106649480522483, 10358785732907640880}}), refStored},
		{"removed", AppendRemovedJSON(nil, DumpBlocks, 7, 43, 0, []uint64{18405780835976372970}), refRemoved},
		{"cleared", AppendClearedJSON(nil, DumpBlocks, 7, 44, 0), refCleared},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if string(tc.got) != tc.want {
				t.Fatalf("JSON differs from the literal example:\n got %s\nwant %s", tc.got, tc.want)
			}
			checkGolden(t, "blocks/"+tc.name+".json", tc.got)
		})
	}
}

// goldenResponses builds one response of each variant in the older wire (DumpBlocks) from inputs the daemon can
// reproduce (documented in ../testdata/json/README.md), plus error.json (kvshm's own variant, either shape).
func goldenResponses(t *testing.T) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	u := func(v uint64) *uint64 { return &v }
	must := func(_ ApplyResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	out := map[string][]byte{}
	resp := func(ix *Indexer, start, end *uint64) []byte {
		t.Helper()
		r, err := ix.Recover(ctx, start, end)
		if err != nil {
			t.Fatal(err)
		}
		return r.JSON
	}
	cfg := Config{WorkerID: 7, BlockSize: 4, MaxBufferSize: 10, DumpShape: DumpBlocks}

	// events.json: worker 7, block size 4, max_buffer_size 10.
	ix, _ := New(cfg)
	must(ix.ApplyStoredTokens(1, 0, false, 0, hashesLE(101, 102), toksLE(0, 8), nil, false))
	must(ix.ApplyStoredTokens(2, 0, true, 102, hashesLE(103), toksLE(8, 4), []byte("my-adapter"), false))
	must(ix.Apply(&Event{ID: 3, Kind: KindRemoved, Hashes: []uint64{103}}))
	must(ix.Apply(&Event{ID: 4, Kind: KindCleared}))
	out["blocks/events.json"] = resp(ix, u(2), nil)

	// tree_dump.json, too_new.json, invalid_range.json: worker 7, block size 4, max_buffer_size 10.
	ix, _ = New(cfg)
	must(ix.ApplyStoredTokens(1, 0, false, 0, hashesLE(101, 102), toksLE(0, 8), nil, false))
	must(ix.ApplyStoredTokens(2, 0, true, 101, hashesLE(201), toksLE(100, 4), nil, false))
	must(ix.ApplyStoredTokens(3, 1, false, 0, hashesLE(101), toksLE(0, 4), nil, false))
	out["blocks/tree_dump.json"] = resp(ix, nil, nil)
	out["blocks/too_new.json"] = resp(ix, u(10), u(20))
	out["blocks/invalid_range.json"] = resp(ix, u(5), u(2))

	// error.json: LossError, ids 2..4 lost (the ring was full).
	ix, _ = New(Config{WorkerID: 7, BlockSize: 4, MaxBufferSize: 10, OnLoss: LossError})
	must(ix.ApplyStoredTokens(1, 0, false, 0, hashesLE(101), toksLE(0, 4), nil, false))
	ix.MarkLost(2, 4, "ring full")
	must(ix.ApplyStoredTokens(5, 0, true, 101, hashesLE(102), toksLE(4, 4), nil, false))
	out["error.json"] = resp(ix, nil, nil)
	return out
}

// toksLE returns the u32 little-endian bytes of the tokens lo, lo+1, ..., lo+n-1.
func toksLE(lo, n int) []byte {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(lo + i)
	}
	return tokensToLE(nil, s)
}

func hashesLE(hs ...uint64) []byte {
	var b []byte
	for _, h := range hs {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

func TestGoldenResponses(t *testing.T) {
	wantKind := map[string]RespKind{"blocks/events.json": RespEvents, "blocks/tree_dump.json": RespTreeDump,
		"blocks/too_new.json": RespTooNew, "blocks/invalid_range.json": RespInvalidRange, "error.json": RespError}
	for name, got := range goldenResponses(t) {
		t.Run(name, func(t *testing.T) {
			kind, _, err := decodeResponse(got)
			if err != nil {
				t.Fatalf("decode %s: %v", got, err)
			}
			if kind != wantKind[name] {
				t.Fatalf("variant %v, want %v", kind, wantKind[name])
			}
			checkGolden(t, name, got)
		})
	}
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("..", "testdata", "json", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from golden:\n got %s\nwant %s", name, got, want)
	}
}

func TestJSONStringEscaping(t *testing.T) {
	tests := []struct{ in, want string }{
		{"plain", `"plain"`},
		{`q"b\`, `"q\"b\\"`},
		{"\n\r\t\b\f", `"\n\r\t\b\f"`},
		{"\x00\x1f\x7f", `"\u0000\u001f` + "\x7f" + `"`},
		{"<&>", `"<&>"`},
		{"é\u2028", "\"é\u2028\""},
		{"bad\xffutf8", "\"bad\ufffdutf8\""},
	}
	for _, tc := range tests {
		got := AppendJSONString(nil, tc.in)
		if string(got) != tc.want {
			t.Errorf("AppendJSONString(%q) = %s, want %s", tc.in, got, tc.want)
		}
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Errorf("decode %s: %v", got, err)
		} else if want := strings.ToValidUTF8(tc.in, "\ufffd"); back != want {
			t.Errorf("round trip of %q = %q", tc.in, back)
		}
	}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

// TestParallelDumpEqualsSequential: a dump large enough to be encoded by several goroutines (parallelDumpBlocks)
// is byte for byte the sequential encoding of the same plan: the parts, their commas and their event ids join up.
func TestParallelDumpEqualsSequential(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	ix, _ := New(Config{WorkerID: 3, BlockSize: 4, MaxBufferSize: 100})
	var stored []uint64 // block hashes stored so far, candidates for parents and removals
	next := uint64(1)
	for id := uint64(1); ix.Stats().ResidentBlocks < parallelDumpBlocks+4096; id++ {
		dp := uint32(rng.IntN(3))
		n := 1 + rng.IntN(8)
		hashes := make([]uint64, n)
		for i := range hashes {
			hashes[i], next = next, next+1
		}
		ev := &Event{ID: id, DpRank: dp, Kind: KindStored}
		if len(stored) > 0 && rng.IntN(3) > 0 {
			ev.HasParent, ev.Parent = true, stored[rng.IntN(len(stored))]
		}
		for i, h := range hashes {
			ev.Blocks = append(ev.Blocks, Block{BlockHash: h, TokensHash: rng.Uint64() | uint64(i)})
		}
		_, _ = ix.Apply(ev)
		stored = append(stored, hashes...)
		if rng.IntN(10) == 0 {
			id++
			_, _ = ix.Apply(&Event{ID: id, DpRank: dp, Kind: KindRemoved, Hashes: []uint64{stored[rng.IntN(len(stored))]}})
		}
	}
	snap, msg := ix.buildDump(rankFilter{})
	if msg != "" {
		t.Fatal(msg)
	}
	ix.mu.RLock()
	ts := ix.snapshotTreeLocked(rankFilter{})
	ix.mu.RUnlock()
	evs := ts.planChains()
	misses := dumpSizeMisses.Load()
	got := snap.encode()
	want, _ := appendViewEvents([]byte(jsTreeDumpHead), DumpChains, 3, snap.parts, true, rankFilter{})
	want = appendDumpTail(want, DumpChains, snap.last)
	if !bytes.Equal(got, want) || dumpSizeMisses.Load() != misses {
		t.Fatalf("parallel dump (%d bytes, %d events, size misses %d) differs from the sequential encoding (%d bytes)",
			len(got), snap.events, dumpSizeMisses.Load()-misses, len(want))
	}
	if !json.Valid(got) || snap.events != len(evs) {
		t.Fatalf("dump: valid JSON %v, %d events, want %d", json.Valid(got), snap.events, len(evs))
	}
}

// TestEventJSONLen: the size eventJSONLen computes is what appendViewEvents writes, for every kind, both wires,
// with and without parent, numbers of every digit count.
func TestEventJSONLen(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	num := func() uint64 { return rng.Uint64() >> (rng.Uint64() % 64) }
	for i := range 3000 {
		shape := DumpChains
		if i%2 == 1 {
			shape = DumpBlocks
		}
		h := logHdr{id: num(), parent: num(), dp: uint32(num()), kind: Kind(i % 3), hasParent: i%5 != 0,
			n: uint32(rng.IntN(5))}
		words := make([]uint64, 2*h.n+3)
		for k := range words {
			words[k] = num()
		}
		h.off = 3
		worker := num()
		out, _ := appendViewEvents(nil, shape, worker, []logPart{{hdrs: []logHdr{h}, words: words}}, true, rankFilter{})
		if got := eventJSONLen(shape, worker, &h, words); got != len(out) {
			t.Fatalf("%+v shape %v: eventJSONLen %d, written %d: %s", h, shape, got, len(out), out)
		}
	}
}

// TestDumpCacheCompact: a cached dump larger than dumpJSONKeep holds the blocks' words, not their JSON (~85 bytes a
// block): its heap cost stays under 24 bytes a block. A smaller one keeps its JSON: answers share it.
func TestDumpCacheCompact(t *testing.T) {
	defer func(k int) { dumpJSONKeep = k }(dumpJSONKeep)
	dumpJSONKeep = 1 << 20
	ix, _ := New(Config{WorkerID: 1, BlockSize: 4, MaxBufferSize: 10})
	const blocks = 50_000
	h := uint64(1)
	for id := uint64(1); ix.Stats().ResidentBlocks < blocks; id++ {
		ev := &Event{ID: id, Kind: KindStored}
		for range 256 {
			ev.Blocks = append(ev.Blocks, Block{BlockHash: h<<20 | 1<<63, TokensHash: h * 0x9e3779b97f4a7c15})
			h++
		}
		if _, err := ix.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	func() { // the answer is garbage once this returns
		r, err := ix.Recover(context.Background(), nil, nil)
		if err != nil || r.Kind != RespTreeDump || len(r.JSON) < 80*blocks {
			t.Fatalf("%v %v %d bytes", err, r.Kind, len(r.JSON))
		}
	}()
	cached := heap()
	if ix.cache == nil {
		t.Fatal("dump not cached")
	}
	if per := float64(int64(cached)-int64(before)) / blocks; per > 24 {
		t.Fatalf("the cached dump holds %.1f heap bytes per block, want <= 24", per)
	}
}

func TestDumpCacheKeepsSmallJSON(t *testing.T) {
	ix, _ := New(Config{WorkerID: 1, BlockSize: 4, MaxBufferSize: 10})
	if _, err := ix.Apply(&Event{ID: 1, Kind: KindStored, Blocks: []Block{{BlockHash: 5, TokensHash: 6}}}); err != nil {
		t.Fatal(err)
	}
	a, _ := ix.Recover(context.Background(), nil, nil)
	b, _ := ix.Recover(context.Background(), nil, nil)
	if !b.CacheHit || &a.JSON[0] != &b.JSON[0] {
		t.Fatalf("a small cached dump is encoded per answer (hit %v), want its JSON kept and shared", b.CacheHit)
	}
}
