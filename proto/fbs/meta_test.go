package fbs

import (
	"bytes"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/fbs/kvevent"
)

// metaCases cover each optional field alone, all of them, and the common vLLM case (medium "GPU" only).
var metaCases = []struct {
	name string
	m    MetaSpec
}{
	{"empty", MetaSpec{}},
	{"gpu", MetaSpec{HasMedium: true, Medium: "GPU"}},
	{"empty medium", MetaSpec{HasMedium: true}},
	{"lora id", MetaSpec{HasLoraID: true, LoraID: -7}},
	{"lora id 0", MetaSpec{HasLoraID: true}},
	{"block size", MetaSpec{HasBlockSize: true, BlockSize: 64}},
	{"extra keys", MetaSpec{ExtraKeys: []byte{0x91, 0xa1, 'x'}}},
	{"extra keys empty", MetaSpec{ExtraKeys: []byte{}}},
	{"group", MetaSpec{HasGroupIdx: true, GroupIdx: 3}},
	{"kind", MetaSpec{HasKind: true, Kind: "sliding_window"}},
	{"window", MetaSpec{HasSlidingWindow: true, SlidingWindow: 4096}},
	{"hash bytes", MetaSpec{HashBytes: bytes.Repeat([]byte{0xab}, 64)}},
	{"hash bytes empty", MetaSpec{HashBytes: []byte{}}},
	{"parent bytes", MetaSpec{ParentBytes: []byte{1, 2, 3}}},
	{"cache salt", MetaSpec{HasCacheSalt: true, CacheSalt: "salt"}},
	{"session", MetaSpec{HasSessionID: true, SessionID: "sess-ä"}},
	{"empty salt and session", MetaSpec{HasCacheSalt: true, HasSessionID: true}},
	{"all", MetaSpec{HasMedium: true, Medium: "CPU", HasLoraID: true, LoraID: 1 << 40, HasBlockSize: true,
		BlockSize: 16, ExtraKeys: []byte{1, 2, 3, 4, 5}, HasGroupIdx: true, GroupIdx: 1, HasKind: true,
		Kind: "full_attention", HasSlidingWindow: true, SlidingWindow: 128, HashBytes: []byte{7, 7},
		ParentBytes: []byte{9}, HasCacheSalt: true, CacheSalt: "s", HasSessionID: true, SessionID: "id"}},
}

func checkMetaView(t testing.TB, m *MetaSpec, v *MetaView) {
	t.Helper()
	if v.HasMedium != m.HasMedium || string(v.Medium) != m.Medium ||
		v.HasLoraID != m.HasLoraID || v.LoraID != m.LoraID ||
		v.HasBlockSize != m.HasBlockSize || v.BlockSize != m.BlockSize ||
		(v.ExtraKeys == nil) != (m.ExtraKeys == nil) || !bytes.Equal(v.ExtraKeys, m.ExtraKeys) ||
		v.HasGroupIdx != m.HasGroupIdx || v.GroupIdx != m.GroupIdx ||
		v.HasKind != m.HasKind || string(v.Kind) != m.Kind ||
		v.HasSlidingWindow != m.HasSlidingWindow || v.SlidingWindow != m.SlidingWindow ||
		(v.HashBytes == nil) != (m.HashBytes == nil) || !bytes.Equal(v.HashBytes, m.HashBytes) ||
		(v.ParentBytes == nil) != (m.ParentBytes == nil) || !bytes.Equal(v.ParentBytes, m.ParentBytes) ||
		v.HasCacheSalt != m.HasCacheSalt || string(v.CacheSalt) != m.CacheSalt ||
		v.HasSessionID != m.HasSessionID || string(v.SessionID) != m.SessionID {
		t.Fatalf("view %+v != spec %+v", *v, *m)
	}
}

// checkMetaOfficial compares a view with the generated accessors.
func checkMetaOfficial(t testing.TB, p []byte, v *MetaView) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("official accessors panicked on a payload DecodeMeta accepted: %v\n%x", r, p)
		}
	}()
	o := kvevent.GetRootAsMeta(p, 0)
	u32 := func(x *uint32, has bool, want uint32) bool { return (x != nil) == has && (x == nil || *x == want) }
	if !bytes.Equal(o.Medium(), v.Medium) || !bytes.Equal(o.KvCacheSpecKind(), v.Kind) ||
		o.ExtraKeysLength() != len(v.ExtraKeys) || !bytes.Equal(o.ExtraKeysBytes(), v.ExtraKeys) ||
		!u32(o.BlockSize(), v.HasBlockSize, v.BlockSize) || !u32(o.GroupIdx(), v.HasGroupIdx, v.GroupIdx) ||
		!u32(o.KvCacheSpecSlidingWindow(), v.HasSlidingWindow, v.SlidingWindow) ||
		!bytes.Equal(o.BlockHashBytesBytes(), v.HashBytes) || !bytes.Equal(o.ParentHashBytesBytes(), v.ParentBytes) ||
		!bytes.Equal(o.CacheSalt(), v.CacheSalt) || !bytes.Equal(o.SessionId(), v.SessionID) {
		t.Fatalf("official accessors disagree with view %+v", *v)
	}
	if l := o.LoraId(); (l != nil) != v.HasLoraID || l != nil && *l != v.LoraID {
		t.Fatalf("official lora_id %v != view %v/%d", l, v.HasLoraID, v.LoraID)
	}
}

func TestMetaRoundTrip(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	for _, c := range metaCases {
		t.Run(c.name, func(t *testing.T) {
			p := BuildMeta(b, &c.m)
			var v MetaView
			if err := DecodeMeta(p, &v); err != nil {
				t.Fatalf("DecodeMeta: %v (%x)", err, p)
			}
			checkMetaView(t, &c.m, &v)
			checkMetaOfficial(t, p, &v)
		})
	}
}

func TestDecodeMetaMalformed(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	all := slices.Clone(BuildMeta(b, &metaCases[len(metaCases)-1].m))
	gpu := slices.Clone(BuildMeta(b, &MetaSpec{HasMedium: true, Medium: "GPU"}))
	rootOf := func(p []byte) int { return int(get32(p, 0)) }
	vtOf := func(p []byte) int { r := rootOf(p); return r - int(int32(get32(p, r))) }
	cases := []struct {
		name   string
		base   []byte
		mutate func(p []byte) []byte
		reason string
	}{
		{"empty", gpu, func(p []byte) []byte { return nil }, reasonShort},
		{"11 bytes", gpu, func(p []byte) []byte { return p[:11] }, reasonShort},
		{"root inside header", gpu, func(p []byte) []byte { put32(p, 0, 0); return p }, reasonRootOffset},
		{"root past end", gpu, func(p []byte) []byte { put32(p, 0, uint32(len(p))); return p }, reasonRootOffset},
		{"root misaligned", gpu, func(p []byte) []byte { put32(p, 0, 6); return p }, reasonTableAlign},
		{"vtable size 3", gpu, func(p []byte) []byte { put16(p, vtOf(p), 3); return p }, reasonVtableSize},
		{"table size past end", gpu, func(p []byte) []byte { put16(p, vtOf(p)+2, 0xffff); return p }, reasonTableSize},
		{"medium outside table", gpu, func(p []byte) []byte {
			put16(p, vtOf(p)+4, int(get32(p, vtOf(p)+2)&0xffff))
			return p
		}, reasonFieldBounds},
		{"medium string past end", gpu, func(p []byte) []byte {
			at := rootOf(p) + int(p[vtOf(p)+4])
			put32(p, at, uint32(len(p)))
			return p
		}, reasonStringBounds},
		{"medium not NUL-terminated", gpu, func(p []byte) []byte {
			at := rootOf(p) + int(p[vtOf(p)+4])
			s := at + int(get32(p, at))
			p[s+4+3] = 'x'
			return p
		}, reasonStringNUL},
		{"lora id misaligned", all, func(p []byte) []byte {
			put16(p, vtOf(p)+4+2*slotMetaLoraID, 6)
			return p
		}, reasonFieldAlign},
		{"extra keys vector past end", all, func(p []byte) []byte {
			at := rootOf(p) + int(get32(p, vtOf(p)+4+2*slotMetaExtraKeys)&0xffff)
			s := at + int(get32(p, at))
			put32(p, s, uint32(len(p)))
			return p
		}, reasonVectorBounds},
		{"trailing bytes", gpu, func(p []byte) []byte { return append(p, make([]byte, 16)...) }, reasonTrailing},
		{"padding tolerated", gpu, func(p []byte) []byte { return append(p, make([]byte, 4)...) }, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.mutate(slices.Clone(c.base))
			var v MetaView
			err := DecodeMeta(p, &v)
			if c.reason == "" {
				if err != nil {
					t.Fatalf("DecodeMeta: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrMalformedMeta) || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("DecodeMeta = %v, want ErrMalformedMeta: %s", err, c.reason)
			}
			if !reflect.DeepEqual(v, MetaView{}) {
				t.Fatalf("view not zeroed on error: %+v", v)
			}
		})
	}
}

func TestDecodeMetaAllocatesNothing(t *testing.T) {
	p := slices.Clone(BuildMeta(flatbuffers.NewBuilder(0), &metaCases[len(metaCases)-1].m))
	var v MetaView
	if n := testing.AllocsPerRun(100, func() {
		if err := DecodeMeta(p, &v); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("DecodeMeta allocates %v times per call, want 0", n)
	}
}

func specFromMetaView(v *MetaView) MetaSpec {
	m := MetaSpec{HasMedium: v.HasMedium, Medium: string(v.Medium), HasLoraID: v.HasLoraID, LoraID: v.LoraID,
		HasBlockSize: v.HasBlockSize, BlockSize: v.BlockSize, HasGroupIdx: v.HasGroupIdx, GroupIdx: v.GroupIdx,
		HasKind: v.HasKind, Kind: string(v.Kind), HasSlidingWindow: v.HasSlidingWindow, SlidingWindow: v.SlidingWindow,
		HasCacheSalt: v.HasCacheSalt, CacheSalt: string(v.CacheSalt), HasSessionID: v.HasSessionID,
		SessionID: string(v.SessionID)}
	clone := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		return append([]byte{}, b...) // present and empty stays non-nil
	}
	m.ExtraKeys, m.HashBytes, m.ParentBytes = clone(v.ExtraKeys), clone(v.HashBytes), clone(v.ParentBytes)
	return m
}

// FuzzDecodeMeta: arbitrary payloads never panic; an accepted payload reads the same through the official
// accessors, and re-encoding its view with BuildMeta decodes to the same view.
func FuzzDecodeMeta(f *testing.F) {
	b := flatbuffers.NewBuilder(0)
	for _, c := range metaCases {
		f.Add(slices.Clone(BuildMeta(b, &c.m)))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		if len(p) > 1<<16 {
			return
		}
		var v MetaView
		if err := DecodeMeta(p, &v); err != nil {
			if !errors.Is(err, ErrMalformedMeta) {
				t.Fatalf("error %v does not wrap ErrMalformedMeta", err)
			}
			return
		}
		checkMetaOfficial(t, p, &v)
		m := specFromMetaView(&v)
		var w MetaView
		if err := DecodeMeta(BuildMeta(b, &m), &w); err != nil {
			t.Fatalf("re-encoded view does not decode: %v", err)
		}
		checkMetaView(t, &m, &w)
	})
}

// FuzzMetaRoundTrip: BuildMeta→DecodeMeta returns the built values for any field combination.
func FuzzMetaRoundTrip(f *testing.F) {
	f.Add(uint8(0xff), "GPU", int64(-1), uint32(16), []byte{0x90}, uint32(1), "full_attention", uint32(4))
	f.Add(uint8(0), "", int64(0), uint32(0), []byte(nil), uint32(0), "", uint32(0))
	b := flatbuffers.NewBuilder(0)
	f.Fuzz(func(t *testing.T, has uint8, medium string, lora int64, bs uint32, extra []byte, group uint32,
		kind string, window uint32) {
		if strings.IndexByte(medium, 0) >= 0 || strings.IndexByte(kind, 0) >= 0 {
			return // a NUL inside a string still decodes; keep the comparison simple
		}
		m := MetaSpec{HasMedium: has&1 != 0, HasLoraID: has&2 != 0, HasBlockSize: has&4 != 0,
			HasGroupIdx: has&8 != 0, HasKind: has&16 != 0, HasSlidingWindow: has&32 != 0}
		if m.HasMedium {
			m.Medium = medium
		}
		if m.HasLoraID {
			m.LoraID = lora
		}
		if m.HasBlockSize {
			m.BlockSize = bs
		}
		if has&64 != 0 {
			m.ExtraKeys = append([]byte{}, extra...)
		}
		if has&128 != 0 { // the hash and parent bytes: the extra bytes split in two
			m.HashBytes, m.ParentBytes = append([]byte{}, extra[:len(extra)/2]...), append([]byte{}, extra[len(extra)/2:]...)
		}
		if m.HasGroupIdx {
			m.GroupIdx = group
		}
		if m.HasKind {
			m.Kind = kind
		}
		if m.HasSlidingWindow {
			m.SlidingWindow = window
		}
		p := BuildMeta(b, &m)
		var v MetaView
		if err := DecodeMeta(p, &v); err != nil {
			t.Fatalf("DecodeMeta(BuildMeta(%+v)): %v", m, err)
		}
		checkMetaView(t, &m, &v)
	})
}
