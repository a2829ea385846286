package vllmwire

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// BenchmarkAppendBatch: go test -run '^$' -bench AppendBatch -benchmem ./vllmwire/
func BenchmarkAppendBatch(b *testing.B) {
	for _, nb := range []int{1, 32} {
		b.Run(fmt.Sprintf("blocks=%d", nb), func(b *testing.B) {
			e := Event{Kind: KindStored, BlockSize: 32, HasMedium: true, Medium: "GPU", HasParent: true, ParentHash: 1 << 63}
			for i := range nb {
				e.BlockHashes = append(e.BlockHashes, uint64(i)*0x9e3779b97f4a7c15)
				for j := range 32 {
					e.TokenIDs = append(e.TokenIDs, uint32(i*32+j+100000))
				}
			}
			evs := []Event{e}
			buf := AppendBatch(nil, 1.5, evs, 0)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendBatch(buf[:0], 1.5, evs, 0)
			}
		})
	}
}

// TestAppendBatchAllocs: with a reused buffer of sufficient capacity, encoding allocates nothing.
func TestAppendBatchAllocs(t *testing.T) {
	e := Event{Kind: KindStored, BlockHashes: []uint64{1, 2}, TokenIDs: make([]uint32, 64), BlockSize: 32,
		HasMedium: true, Medium: "GPU", HasLoraName: true, LoraName: "x", ExtraKeys: []byte{0x90}}
	evs := []Event{e, {Kind: KindRemoved, BlockHashes: []uint64{3}}, {Kind: KindCleared}}
	buf := AppendBatch(nil, 2, evs, 1)
	if n := testing.AllocsPerRun(100, func() { buf = AppendBatch(buf[:0], 2, evs, 1) }); n != 0 {
		t.Fatalf("AppendBatch allocates %v times per batch with a reused buffer", n)
	}
}

// TestDecodeRejects: malformed payloads are refused with ErrMalformed.
func TestDecodeRejects(t *testing.T) {
	good := AppendBatch(nil, 1, []Event{{Kind: KindRemoved, BlockHashes: []uint64{1}, HasMedium: true, Medium: "GPU"}}, 0)
	for _, c := range []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"not an array", []byte{0xc0}},
		{"array of 4", []byte{0x94, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0, 0}},
		{"truncated", good[:len(good)-1]},
		{"leftover", append(append([]byte{}, good...), 0)},
		{"unknown tag", AppendBatch(nil, 1, nil, 0)[:10:10]},
		{"event not a map", []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x90, 0}},
		{"unknown key", []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa1, 'x', 0, 0}},
		{"missing fields", []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa4, 't', 'y', 'p', 'e', 0xac,
			'B', 'l', 'o', 'c', 'k', 'R', 'e', 'm', 'o', 'v', 'e', 'd', 0}},
		{"huge count", []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}},
		{"bytes then int hash", removedWith(0x92, 0xc4, 1, 'a', 0x01)},
		{"int then bytes hash", removedWith(0x92, 0x01, 0xc4, 1, 'a')},
		{"bytes hashes of two lengths", removedWith(0x92, 0xc4, 1, 'a', 0xc4, 2, 'b', 'c')},
		{"bytes hash truncated", removedWith(0x91, 0xc4, 9, 'a')},
	} {
		if _, err := Decode(c.p); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Decode(%x) = %v, want ErrMalformed", c.name, c.p, err)
		}
	}
	if _, err := Decode(good); err != nil {
		t.Fatalf("good payload: %v", err)
	}
}

// removedWith is a one-event batch: a BlockRemoved whose block_hashes are the msgpack bytes hashes.
func removedWith(hashes ...byte) []byte {
	p := AppendBatchHeader(nil, 1, 1)
	p = msgp.AppendMapHeader(p, 3)
	p = appendKeyString(p, tagKey, "BlockRemoved")
	p = append(msgp.AppendString(p, "block_hashes"), hashes...)
	p = msgp.AppendNil(msgp.AppendString(p, "medium"))
	return AppendBatchTrailer(p, 0)
}

// FuzzDecode: Decode never panics; what it accepts re-encodes, in every layout, to a payload that decodes to the
// same batch (bytes block hashes included).
func FuzzDecode(f *testing.F) {
	for _, r := range releases {
		seedVectors(f, r)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		b, ok := decodeFuzzed(t, p)
		if !ok {
			return
		}
		for i := range b.Events {
			if b.Events[i].ExtraKeys != nil {
				b.Events[i].ExtraKeys = append([]byte{}, b.Events[i].ExtraKeys...)
			}
			e := &b.Events[i] // SGLang's fields: vLLM's layouts do not carry them (FuzzDecodeSGLang does)
			e.HasCacheSalt, e.CacheSalt, e.HasSessionID, e.SessionID = false, "", false, ""
		}
		for _, w := range wires {
			b2 := reencode(t, b, w)
			if b.TS == b.TS && !reflect.DeepEqual(b, b2) { // NaN ts never compares equal
				t.Fatalf("%s: round trip differs:\n%+v\n%+v", w, b, b2)
			}
		}
	})
}
