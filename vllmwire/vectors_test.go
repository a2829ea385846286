package vllmwire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/tinylib/msgp/msgp"

	"github.com/kvshm/kvshm/internal/testenv"
)

const vectorsPath = "../testdata/vllmwire/vectors.json"

type vectorEvent struct {
	Kind         string   `json:"kind"`
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
	ExtraKeysHex *string  `json:"extra_keys_hex"`
}

type vector struct {
	Name       string        `json:"name"`
	TS         float64       `json:"ts"`
	DpRank     *int64        `json:"dp_rank"`
	Events     []vectorEvent `json:"events"`
	PayloadHex string        `json:"payload_hex"`
}

type vectorFile struct {
	Msgspec string   `json:"msgspec"`
	Vectors []vector `json:"vectors"`
}

func loadVectors(t testing.TB, data []byte) []vector {
	t.Helper()
	var f vectorFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatalf("parse vectors: %v", err)
	}
	if len(f.Vectors) < 10 {
		t.Fatalf("only %d vectors", len(f.Vectors))
	}
	return f.Vectors
}

func (v vectorEvent) event(t testing.TB) Event {
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
	if v.Parent != nil {
		e.HasParent, e.ParentHash = true, *v.Parent
	}
	if v.LoraID != nil {
		e.HasLoraID, e.LoraID = true, *v.LoraID
	}
	if v.Medium != nil {
		e.HasMedium, e.Medium = true, *v.Medium
	}
	if v.LoraName != nil {
		e.HasLoraName, e.LoraName = true, *v.LoraName
	}
	if v.GroupIdx != nil {
		e.HasGroupIdx, e.GroupIdx = true, *v.GroupIdx
	}
	if v.SpecKind != nil {
		e.HasKVCacheSpecKind, e.KVCacheSpecKind = true, *v.SpecKind
	}
	if v.Window != nil {
		e.HasSlidingWindow, e.KVCacheSpecSlidingWindow = true, *v.Window
	}
	if v.ExtraKeysHex != nil {
		b, err := hex.DecodeString(*v.ExtraKeysHex)
		if err != nil {
			t.Fatal(err)
		}
		e.ExtraKeys = b
	}
	return e
}

// encodeVector encodes a vector's input; a null dp_rank (msgspec writes nil) is appended by hand, as the daemon
// always knows its dp_rank.
func encodeVector(t testing.TB, v vector, dst []byte) ([]byte, []Event) {
	evs := make([]Event, len(v.Events))
	for i, ve := range v.Events {
		evs[i] = ve.event(t)
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
	data, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range loadVectors(t, data) {
		t.Run(v.Name, func(t *testing.T) {
			want, err := hex.DecodeString(v.PayloadHex)
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
