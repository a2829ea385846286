package vllmwire

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/internal/wirevectors"
)

const vectorsDir = "../testdata/vllmwire/"

// wires is every layout with its vectors file.
var wires = []Wire{Wire033, Wire032}

// releases is every release with its own vectors file (wirevectors.Files), aliases ("0.31") included.
var releases = []string{"0.33", "0.32", "0.31"}

func vectorsPath(release string) string { return vectorsDir + wirevectors.Files[release] }

func loadVectors(t testing.TB, release string) []wirevectors.Vector {
	t.Helper()
	vs, err := wirevectors.Load(vectorsPath(release), 10)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// event converts a vector's event to a vllmwire.Event.
func event(t testing.TB, v wirevectors.Event) Event {
	e := Event{BlockHashes: v.BlockHashes, TokenIDs: v.TokenIDs, IsEagle: v.IsEagle, BlockSize: v.BlockSize}
	switch v.Kind {
	case "stored":
		e.Kind = KindStored
	case "removed":
		e.Kind = KindRemoved
	case "cleared":
		e.Kind = KindCleared
	default:
		t.Fatalf("vector kind %q", v.Kind)
	}
	e.HasParent = v.Parent != nil
	if e.HasParent {
		e.ParentHash = *v.Parent
	}
	if e.HasLoraID = v.LoraID != nil; e.HasLoraID {
		e.LoraID = *v.LoraID
	}
	if e.HasMedium = v.Medium != nil; e.HasMedium {
		e.Medium = *v.Medium
	}
	if e.HasLoraName = v.LoraName != nil; e.HasLoraName {
		e.LoraName = *v.LoraName
	}
	if e.HasGroupIdx = v.GroupIdx != nil; e.HasGroupIdx {
		e.GroupIdx = *v.GroupIdx
	}
	if e.HasKVCacheSpecKind = v.SpecKind != nil; e.HasKVCacheSpecKind {
		e.KVCacheSpecKind = *v.SpecKind
	}
	if e.HasSlidingWindow = v.Window != nil; e.HasSlidingWindow {
		e.KVCacheSpecSlidingWindow = *v.Window
	}
	if e.HasCacheSalt = v.CacheSalt != nil; e.HasCacheSalt {
		e.CacheSalt = *v.CacheSalt
	}
	if e.HasSessionID = v.SessionID != nil; e.HasSessionID {
		e.SessionID = *v.SessionID
	}
	var err error
	if e.ExtraKeys, err = v.ExtraKeys(); err != nil {
		t.Fatal(err)
	}
	if e.HashBytes, err = v.HashBytes(); err != nil {
		t.Fatal(err)
	}
	if e.ParentBytes, err = v.ParentBytes(); err != nil {
		t.Fatal(err)
	}
	return e
}

// encodeVector encodes a vector's input in layout w; a null dp_rank (msgspec writes nil) is appended by hand, as
// the daemon always knows its dp_rank.
func encodeVector(t testing.TB, w Wire, v wirevectors.Vector, dst []byte) ([]byte, []Event) {
	evs := make([]Event, len(v.Events))
	for i, ve := range v.Events {
		evs[i] = event(t, ve)
	}
	dst = AppendBatchHeader(dst, v.TS, len(evs))
	for i := range evs {
		dst = w.AppendEvent(dst, &evs[i])
	}
	if v.DpRank == nil {
		return msgp.AppendNil(dst), evs
	}
	return AppendBatchTrailer(dst, *v.DpRank), evs
}

// TestVectors: every payload vllmwire encodes, in each release's layout (ParseWire of its name), is
// byte-identical to msgspec's encoding of that release's structs, and decodes back to its input.
func TestVectors(t *testing.T) {
	for _, r := range releases {
		t.Run(r, func(t *testing.T) { testVectors(t, r) })
	}
}

func testVectors(t *testing.T, release string) {
	w, err := ParseWire(release)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range loadVectors(t, release) {
		t.Run(v.Name, func(t *testing.T) {
			want, err := v.Payload()
			if err != nil {
				t.Fatal(err)
			}
			got, evs := encodeVector(t, w, v, nil)
			if !bytes.Equal(got, want) {
				t.Fatalf("encoding differs from msgspec's:\n got %x\nwant %x", got, want)
			}
			b, err := Decode(want)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if b.TS != v.TS || b.HasDpRank != (v.DpRank != nil) || (v.DpRank != nil && b.DpRank != *v.DpRank) {
				t.Errorf("decoded ts/dp_rank %v/%v/%v, want %v/%v", b.TS, b.HasDpRank, b.DpRank, v.TS, v.DpRank)
			}
			for i := range evs {
				normalize(&evs[i])
				normalize(&b.Events[i])
			}
			if len(evs) == 0 {
				evs = []Event{}
			}
			if !reflect.DeepEqual(b.Events, evs) {
				t.Errorf("decoded events differ:\n got %+v\nwant %+v", b.Events, evs)
			}
		})
	}
}

// normalize clears what a kind does not carry on the wire and makes empty slices comparable.
func normalize(e *Event) {
	switch e.Kind {
	case KindRemoved:
		*e = Event{Kind: e.Kind, BlockHashes: e.BlockHashes, HasMedium: e.HasMedium, Medium: e.Medium,
			HasGroupIdx: e.HasGroupIdx, GroupIdx: e.GroupIdx}
	case KindCleared:
		*e = Event{Kind: e.Kind}
	}
	if len(e.BlockHashes) == 0 {
		e.BlockHashes = nil
	}
	if len(e.TokenIDs) == 0 {
		e.TokenIDs = nil
	}
}

// TestVectorsFresh regenerates each release's vectors with the committed script and the dev venv's msgspec: the
// committed files must be what msgspec produces today (a msgspec upgrade that changes its bytes, or a struct
// changed in vllm_structs.py, fails here).
func TestVectorsFresh(t *testing.T) {
	py, err := filepath.Abs("../.venv/bin/python")
	if err == nil {
		_, err = os.Stat(py)
	}
	testenv.Require(t, err, "the dev venv with msgspec", "make venv")
	for _, r := range releases {
		out, err := exec.Command(py, "../testdata/vllmwire/gen_vectors.py", "--wire", r, "-").Output()
		if err != nil {
			t.Fatalf("gen_vectors.py --wire %s: %v", r, err)
		}
		committed, err := os.ReadFile(vectorsPath(r))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, committed) {
			t.Errorf("%s is stale: run %s testdata/vllmwire/gen_vectors.py --wire %s", vectorsPath(r), py, r)
		}
	}
}

// TestWires: the two layouts differ exactly in BlockStored's map header (msgspec sizes it for the struct's field
// count: 16 entries take a map16, 15 a fixmap), and ParseWire knows their names.
func TestWires(t *testing.T) {
	a, b := loadVectors(t, "0.33"), loadVectors(t, "0.32")
	if len(a) != len(b) {
		t.Fatalf("%d vectors for 0.33, %d for 0.32: want the same cases", len(a), len(b))
	}
	differ := 0
	for i := range a {
		if a[i].Name != b[i].Name {
			t.Fatalf("case %d: %q vs %q", i, a[i].Name, b[i].Name)
		}
		if a[i].PayloadHex != b[i].PayloadHex {
			differ++
		}
	}
	if differ == 0 {
		t.Fatal("the 0.32 and 0.33 vectors are identical: the layouts are not pinned apart")
	}
	e := Event{Kind: KindStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{2}, BlockSize: 1}
	if got := Wire033.AppendEvent(nil, &e)[:3]; !bytes.Equal(got, []byte{0xde, 0, 8}) {
		t.Errorf("0.33 BlockStored header %x, want de0008", got)
	}
	if got := Wire032.AppendEvent(nil, &e)[0]; got != 0x88 {
		t.Errorf("0.32 BlockStored header %x, want 88", got)
	}
	for _, c := range []struct {
		in   string
		want Wire
		err  bool
	}{{"", Wire033, false}, {"0.33", Wire033, false}, {"0.32", Wire032, false}, {"0.31", Wire032, false}, {"0.30", 0, true},
		{"0.33.0", 0, true}} {
		w, err := ParseWire(c.in)
		if (err != nil) != c.err || (!c.err && w != c.want) || (c.err && !errors.Is(err, ErrUnknownWire)) {
			t.Errorf("ParseWire(%q) = %v, %v", c.in, w, err)
		}
	}
}

// TestHashKey: bytes hashes index under their last 8 bytes, big-endian, zero-extended (vLLM's int form).
func TestHashKey(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		want uint64
	}{
		{nil, 0},
		{[]byte{1, 2}, 0x0102},
		{[]byte{9, 1, 2, 3, 4, 5, 6, 7, 8}, 0x0102030405060708},
		{bytes.Repeat([]byte{0xff}, 32), 1<<64 - 1},
	} {
		if got := HashKey(c.in); got != c.want {
			t.Errorf("HashKey(%x) = %#x, want %#x", c.in, got, c.want)
		}
	}
}
