package vllmwire

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/internal/wirevectors"
)

const vectorsPath = "../testdata/vllmwire/vectors.json"

func loadVectors(t testing.TB) []wirevectors.Vector {
	t.Helper()
	vs, err := wirevectors.Load(vectorsPath, 10)
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
	var err error
	if e.ExtraKeys, err = v.ExtraKeys(); err != nil {
		t.Fatal(err)
	}
	return e
}

// encodeVector encodes a vector's input; a null dp_rank (msgspec writes nil) is appended by hand, as the daemon
// always knows its dp_rank.
func encodeVector(t testing.TB, v wirevectors.Vector, dst []byte) ([]byte, []Event) {
	evs := make([]Event, len(v.Events))
	for i, ve := range v.Events {
		evs[i] = event(t, ve)
	}
	if v.DpRank == nil {
		dst = AppendBatchHeader(dst, v.TS, len(evs))
		for i := range evs {
			dst = AppendEvent(dst, &evs[i])
		}
		return msgp.AppendNil(dst), evs
	}
	return AppendBatch(dst, v.TS, evs, *v.DpRank), evs
}

// TestVectors: every payload vllmwire encodes is byte-identical to msgspec's encoding of vLLM's structs, and
// decodes back to its input.
func TestVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			want, err := v.Payload()
			if err != nil {
				t.Fatal(err)
			}
			got, evs := encodeVector(t, v, nil)
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

// TestVectorsFresh regenerates the vectors with the committed script and the dev venv's msgspec: the committed
// file must be what msgspec produces today (a msgspec upgrade that changes its bytes fails here).
func TestVectorsFresh(t *testing.T) {
	py, err := filepath.Abs("../.venv/bin/python")
	if err == nil {
		_, err = os.Stat(py)
	}
	testenv.Require(t, err, "the dev venv with msgspec", "make venv")
	out, err := exec.Command(py, "../testdata/vllmwire/gen_vectors.py", "-").Output()
	if err != nil {
		t.Fatalf("gen_vectors.py: %v", err)
	}
	committed, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, committed) {
		t.Fatalf("testdata/vllmwire/vectors.json is stale: run %s testdata/vllmwire/gen_vectors.py", py)
	}
}
