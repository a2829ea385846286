package vllmwire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/kvshm/kvshm/internal/wirevectors"
)

// TestSGLangVectors: every payload WireSGLang encodes is byte-identical to SGLang 0.5.23's own structs encoded by
// msgspec (gen_sglang_vectors.py, run in SGLang's venv), and decodes back to its input, negative hashes as their
// 64-bit patterns.
func TestSGLangVectors(t *testing.T) {
	testVectors(t, WireSGLang.String())
	negative := 0
	for _, v := range loadVectors(t, WireSGLang.String()) {
		for _, e := range v.Events {
			for _, h := range e.BlockHashes {
				if int64(h) < 0 {
					negative++
				}
			}
		}
	}
	if negative < 10 {
		t.Fatalf("only %d negative block hashes in the SGLang vectors: the signed forms are not pinned", negative)
	}
}

// TestSGLangSignedForms: a hash kvshm keys as h goes on SGLang's wire as the signed int64 of the same bits, in
// msgspec's smallest form, and reads back as h; vLLM's layouts send the same key as a uint.
func TestSGLangSignedForms(t *testing.T) {
	for _, c := range []struct {
		key  uint64
		want []byte
	}{
		{0, []byte{0x00}},
		{127, []byte{0x7f}},
		{1<<64 - 1, []byte{0xff}},                          // -1: negative fixint
		{1<<64 - 32, []byte{0xe0}},                         // -32
		{1<<64 - 33, []byte{0xd0, 0xdf}},                   // -33: int8
		{1<<64 - 129, []byte{0xd1, 0xff, 0x7f}},            // -129: int16
		{1 << 63, []byte{0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0}}, // -2**63: int64
		{1<<63 - 1, []byte{0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
	} {
		e := Event{Kind: KindRemoved, BlockHashes: []uint64{c.key}}
		got := WireSGLang.AppendEvent(nil, &e)
		// fixmap(2) "type" "BlockRemoved" "block_hashes" fixarray(1) <hash>
		head := len(got) - len(c.want)
		if !bytes.Equal(got[head:], c.want) || got[head-1] != 0x91 {
			t.Errorf("key %#x: %x, want ...91%x", c.key, got, c.want)
		}
		p := AppendBatchHeader(nil, 1, 1)
		p = AppendBatchTrailer(WireSGLang.AppendEvent(p, &e), 0)
		d, err := Decode(p)
		if err != nil || d.Events[0].BlockHashes[0] != c.key {
			t.Errorf("key %#x: decoded %+v, %v", c.key, d.Events, err)
		}
	}
	if w, err := ParseWire("sglang"); err != nil || w != WireSGLang || w.String() != "sglang" {
		t.Errorf("ParseWire(sglang) = %v, %v", w, err)
	}
}

// TestSGLangOmits: SGLang's BlockStored leaves out medium, cache_salt, session_id and lora_name when None and never
// writes vLLM's own fields; its map header counts what it writes.
func TestSGLangOmits(t *testing.T) {
	e := Event{Kind: KindStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{2}, BlockSize: 1, ExtraKeys: []byte{0x90},
		HasGroupIdx: true, HasKVCacheSpecKind: true, KVCacheSpecKind: "x", HashBytes: []byte{1, 2}}
	got := WireSGLang.AppendEvent(nil, &e)
	if got[0] != 0x86 {
		t.Errorf("header %x, want 86 (six fields written)", got[0])
	}
	for _, k := range []string{"medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "cache_salt"} {
		if bytes.Contains(got, []byte(k)) {
			t.Errorf("%s written: %x", k, got)
		}
	}
	e.HasMedium, e.Medium, e.HasSessionID, e.SessionID = true, "GPU", true, "s"
	if got = WireSGLang.AppendEvent(nil, &e); got[0] != 0x88 {
		t.Errorf("header %x, want 88", got[0])
	}
}

// TestSGLangAllocs: SGLang's layout allocates nothing with a reused buffer, as vLLM's.
func TestSGLangAllocs(t *testing.T) {
	evs := []Event{{Kind: KindStored, BlockHashes: []uint64{1 << 63, 2}, TokenIDs: make([]uint32, 32), BlockSize: 16,
		HasMedium: true, Medium: "GPU", HasCacheSalt: true, CacheSalt: "s"}, {Kind: KindRemoved, BlockHashes: []uint64{3}},
		{Kind: KindCleared}}
	buf := AppendBatchHeader(nil, 2, len(evs))
	encode := func() {
		buf = AppendBatchHeader(buf[:0], 2, len(evs))
		for i := range evs {
			buf = WireSGLang.AppendEvent(buf, &evs[i])
		}
		buf = AppendBatchTrailer(buf, 1)
	}
	encode()
	if n := testing.AllocsPerRun(100, encode); n != 0 {
		t.Fatalf("SGLang's layout allocates %v times per batch with a reused buffer", n)
	}
}

// FuzzDecodeSGLang: what Decode accepts re-encodes in SGLang's layout to a payload that decodes to the same batch,
// once the fields SGLang does not carry are dropped (vLLM's extra_keys, group and spec fields, bytes hashes).
func FuzzDecodeSGLang(f *testing.F) {
	seedVectors(f, WireSGLang.String())
	f.Fuzz(func(t *testing.T, p []byte) {
		b, ok := decodeFuzzed(t, p)
		if !ok {
			return
		}
		for i := range b.Events {
			e := &b.Events[i]
			e.ExtraKeys, e.HasGroupIdx, e.GroupIdx, e.HashBytes, e.ParentBytes = nil, false, 0, nil, nil
			e.HasKVCacheSpecKind, e.KVCacheSpecKind, e.HasSlidingWindow, e.KVCacheSpecSlidingWindow = false, "", false, 0
			if e.Kind != KindStored {
				*e = Event{Kind: e.Kind, BlockHashes: e.BlockHashes, HasMedium: e.HasMedium, Medium: e.Medium}
			}
		}
		b2 := reencode(t, b, WireSGLang)
		for i := range b.Events {
			normalize(&b.Events[i])
			normalize(&b2.Events[i])
			if b.Events[i].Kind == KindCleared {
				b.Events[i] = Event{Kind: KindCleared}
			}
		}
		if b.TS == b.TS && !reflect.DeepEqual(b, b2) { // NaN ts never compares equal
			t.Fatalf("round trip differs:\n%+v\n%+v", b, b2)
		}
	})
}

// reencode encodes a decoded batch again in layout w (a batch without dp_rank ends with msgspec's nil) and decodes
// it; the fuzzers compare the two.
func reencode(t *testing.T, b Batch, w Wire) Batch {
	t.Helper()
	q := AppendBatchHeader(nil, b.TS, len(b.Events))
	for i := range b.Events {
		q = w.AppendEvent(q, &b.Events[i])
	}
	if b.HasDpRank {
		q = AppendBatchTrailer(q, b.DpRank)
	} else {
		q = append(q, 0xc0)
	}
	b2, err := Decode(q)
	if err != nil {
		t.Fatalf("%s: re-encoding %x does not decode: %v", w, q, err)
	}
	return b2
}

// seedVectors adds every vector of a release (a wirevectors.Files name), encoded in its layout, to a fuzzer's
// corpus.
func seedVectors(f *testing.F, release string) {
	w, _ := ParseWire(release)
	if vs, err := wirevectors.Load(vectorsPath(release), 0); err == nil {
		for _, v := range vs {
			p, _ := encodeVector(f, w, v, nil)
			f.Add(p)
		}
	}
}

// decodeFuzzed decodes a fuzzer's input; ok is false for one too large to try or refused (a refusal must wrap
// ErrMalformed).
func decodeFuzzed(t *testing.T, p []byte) (b Batch, ok bool) {
	if len(p) > 1<<16 {
		return b, false
	}
	b, err := Decode(p)
	if err != nil {
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		return b, false
	}
	return b, true
}
