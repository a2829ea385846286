package shm_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
)

// The shared BATCH vectors (testdata/batch, written by the Python encoder: pybind/tests/test_batch.py) pin the
// cross-language contract: the Go parser reads the Python bytes into the events the JSON describes, and the Go
// writer (fbs.Build, fbs.BuildMeta, shm.AppendBatch) produces the same bytes from the same inputs.

type vecEvent struct {
	Type            string            `json:"type"`
	BlockHashes     []json.Number     `json:"block_hashes"`
	ParentBlockHash *json.Number      `json:"parent_block_hash"`
	TokenIDs        []json.RawMessage `json:"token_ids"`
	BlockSize       *uint32           `json:"block_size"`
	LoraID          *int64            `json:"lora_id"`
	Medium          *string           `json:"medium"`
	LoraName        *string           `json:"lora_name"`
	ExtraKeys       *string           `json:"extra_keys_msgpack"` // hex of msgspec's msgpack
	GroupIdx        *uint32           `json:"group_idx"`
	Kind            *string           `json:"kv_cache_spec_kind"`
	Window          *uint32           `json:"kv_cache_spec_sliding_window"`
	HashBytes       *string           `json:"block_hash_bytes_hex"` // bytes block hashes, concatenated (hex)
	ParentBytes     *string           `json:"parent_bytes_hex"`
}

type vecBatch struct {
	Seq         json.Number `json:"seq"`
	DpRank      uint32      `json:"dp_rank"`
	TS          float64     `json:"ts"`
	KVBlockSize uint32      `json:"kv_block_size"`
	Events      []vecEvent  `json:"events"`
	Record      string      `json:"record"`
}

func u64(t *testing.T, n json.Number) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(string(n), 10, 64)
	if err != nil {
		t.Fatalf("u64 %q: %v", n, err)
	}
	return v
}

// expected returns the sub-records the batch's events must give: an optional META, then the EVENT.
func expected(t *testing.T, b *vecBatch) []shm.Sub {
	t.Helper()
	var subs []shm.Sub
	bld := flatbuffers.NewBuilder(0)
	seq := u64(t, b.Seq)
	for _, e := range b.Events {
		ev := fbs.EventSpec{Seq: seq, DpRank: b.DpRank}
		var m fbs.MetaSpec
		if e.Medium != nil {
			m.HasMedium, m.Medium = true, *e.Medium
		}
		if e.GroupIdx != nil {
			m.HasGroupIdx, m.GroupIdx = true, *e.GroupIdx
		}
		for _, x := range []struct {
			hex *string
			dst *[]byte
		}{{e.HashBytes, &m.HashBytes}, {e.ParentBytes, &m.ParentBytes}} {
			if x.hex != nil {
				b, err := hex.DecodeString(*x.hex)
				if err != nil {
					t.Fatal(err)
				}
				*x.dst = append([]byte{}, b...)
			}
		}
		switch e.Type {
		case "BlockStored":
			ev.Kind = fbs.KindStored
			for _, h := range e.BlockHashes {
				ev.BlockHashes = append(ev.BlockHashes, u64(t, h))
			}
			if e.ParentBlockHash != nil {
				ev.HasParent, ev.ParentHash = true, u64(t, *e.ParentBlockHash)
			}
			for i, raw := range e.TokenIDs {
				var pair [2]uint32
				if raw[0] == '[' { // Eagle's bigram form: firsts, then the last second
					if err := json.Unmarshal(raw, &pair); err != nil {
						t.Fatal(err)
					}
					ev.IsEagle = true
					ev.TokenIDs = append(ev.TokenIDs, pair[0])
					if i == len(e.TokenIDs)-1 {
						ev.TokenIDs = append(ev.TokenIDs, pair[1])
					}
					continue
				}
				var tok uint32
				if err := json.Unmarshal(raw, &tok); err != nil {
					t.Fatal(err)
				}
				ev.TokenIDs = append(ev.TokenIDs, tok)
			}
			if e.LoraName != nil {
				ev.LoraName = *e.LoraName
			}
			if e.LoraID != nil {
				m.HasLoraID, m.LoraID = true, *e.LoraID
			}
			if e.BlockSize != nil && *e.BlockSize != b.KVBlockSize {
				m.HasBlockSize, m.BlockSize = true, *e.BlockSize
			}
			if e.ExtraKeys != nil {
				x, err := hex.DecodeString(*e.ExtraKeys)
				if err != nil {
					t.Fatal(err)
				}
				m.ExtraKeys = x
			}
			if e.Kind != nil {
				m.HasKind, m.Kind = true, *e.Kind
			}
			if e.Window != nil {
				m.HasSlidingWindow, m.SlidingWindow = true, *e.Window
			}
		case "BlockRemoved":
			ev.Kind = fbs.KindRemoved
			for _, h := range e.BlockHashes {
				ev.BlockHashes = append(ev.BlockHashes, u64(t, h))
			}
		case "AllBlocksCleared": // never a META
			ev.Kind = fbs.KindCleared
			subs = append(subs, shm.Sub{Type: shm.SubEvent, Payload: bytes.Clone(fbs.Build(bld, &ev))})
			continue
		default:
			t.Fatalf("event type %q", e.Type)
		}
		// No META stands for the defaults (medium "GPU", nothing else); anything else, medium None included, has one.
		if !(m.HasMedium && m.Medium == "GPU") || m.HasLoraID || m.HasBlockSize || m.ExtraKeys != nil || m.HasGroupIdx ||
			m.HasKind || m.HasSlidingWindow || m.HashBytes != nil || m.ParentBytes != nil {
			subs = append(subs, shm.Sub{Type: shm.SubMeta, Payload: bytes.Clone(fbs.BuildMeta(bld, &m))})
		}
		subs = append(subs, shm.Sub{Type: shm.SubEvent, Payload: bytes.Clone(fbs.Build(bld, &ev))})
	}
	return subs
}

func TestBatchVectors(t *testing.T) {
	paths, err := filepath.Glob("../testdata/batch/*.json")
	if err != nil || len(paths) < 5 {
		t.Fatalf("shared vectors: %v (%d files)", err, len(paths))
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.UseNumber()
			var b vecBatch
			if err := dec.Decode(&b); err != nil {
				t.Fatal(err)
			}
			rec, err := hex.DecodeString(b.Record)
			if err != nil {
				t.Fatal(err)
			}
			le := binary.LittleEndian
			if int(le.Uint32(rec)) != len(rec) || le.Uint32(rec[4:]) != shm.TypeBatch {
				t.Fatalf("record header %x", rec[:8])
			}
			want := expected(t, &b)
			// The Go writer gives the same bytes.
			payload, err := shm.AppendBatch(nil, b.TS, want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(payload, rec[8:]) {
				t.Fatalf("Go writer differs from the Python record\n go %x\n py %x", payload, rec[8:])
			}
			// The Go parser reads the Python bytes, and every sub-record decodes to what the JSON says.
			got, err := shm.Record{Type: shm.TypeBatch, Payload: rec[8:]}.Batch()
			if err != nil {
				t.Fatal(err)
			}
			if got.TS != b.TS || len(got.Subs) != len(want) {
				t.Fatalf("ts %v, %d subs; want %v, %d", got.TS, len(got.Subs), b.TS, len(want))
			}
			for i, s := range got.Subs {
				if s.Type != want[i].Type || !bytes.Equal(s.Payload, want[i].Payload) {
					t.Fatalf("sub %d: type %d %x, want %d %x", i, s.Type, s.Payload, want[i].Type, want[i].Payload)
				}
				switch s.Type {
				case shm.SubEvent:
					var v fbs.EventView
					if err := fbs.Decode(s.Payload, &v); err != nil || v.Seq != u64(t, b.Seq) || v.DpRank != b.DpRank {
						t.Fatalf("sub %d: %v seq %d dp %d", i, err, v.Seq, v.DpRank)
					}
				case shm.SubMeta:
					var m fbs.MetaView
					if err := fbs.DecodeMeta(s.Payload, &m); err != nil {
						t.Fatalf("sub %d: %v", i, err)
					}
				}
			}
		})
	}
}
