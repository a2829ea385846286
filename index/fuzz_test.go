package index

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

// FuzzRouterEventJSON checks that every RouterEvent the appenders write decodes with encoding/json into the
// reference's shapes and gives back the same event (u64 values exact).
func FuzzRouterEventJSON(f *testing.F) {
	f.Add(uint64(7), uint64(42), uint32(0), uint8(1), true, uint64(270656378982115943), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add(uint64(7), uint64(43), uint32(0), uint8(2), false, uint64(0), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(uint64(0), uint64(0), uint32(1<<31), uint8(3), false, uint64(0), []byte{})
	f.Add(^uint64(0), ^uint64(0), ^uint32(0), uint8(1), false, ^uint64(0), []byte{})
	f.Fuzz(func(t *testing.T, worker, id uint64, dp uint32, kind uint8, hasParent bool, parent uint64, raw []byte) {
		if len(raw) > 4096 {
			return
		}
		var words []uint64
		for i := 0; i+8 <= len(raw); i += 8 {
			words = append(words, binary.LittleEndian.Uint64(raw[i:]))
		}
		want := Event{ID: id, DpRank: dp}
		var got []byte
		switch kind % 3 {
		case 0:
			want.Kind, want.HasParent = KindStored, hasParent
			if hasParent {
				want.Parent = parent
			}
			for i := 0; i+1 < len(words); i += 2 {
				want.Blocks = append(want.Blocks, Block{words[i], words[i+1]})
			}
			got = AppendStoredJSON(nil, DumpBlocks, worker, id, dp, hasParent, parent, want.Blocks)
			if !slices.Equal(got, appendStoredWords(nil, DumpBlocks, worker, id, dp, hasParent, parent, words[:len(words)&^1])) {
				t.Fatalf("appendStoredWords differs from AppendStoredJSON")
			}
		case 1:
			want.Kind, want.Hashes = KindRemoved, words
			got = AppendRemovedJSON(nil, DumpBlocks, worker, id, dp, words)
		default:
			want.Kind = KindCleared
			got = AppendClearedJSON(nil, DumpBlocks, worker, id, dp)
		}
		w, ev, err := decodeRouterEvent(got)
		if err != nil {
			t.Fatalf("decode %s: %v", got, err)
		}
		if w != worker || ev.ID != want.ID || ev.DpRank != want.DpRank || ev.Kind != want.Kind ||
			ev.HasParent != want.HasParent || ev.Parent != want.Parent || !slices.Equal(ev.Blocks, want.Blocks) ||
			!slices.Equal(ev.Hashes, want.Hashes) {
			t.Fatalf("round trip of %+v gave %+v (worker %d -> %d)", want, ev, worker, w)
		}
	})
}

// FuzzResponseJSON checks the response framings and the Error string escaping.
func FuzzResponseJSON(f *testing.F) {
	f.Add(uint64(10), uint64(20), uint64(3), "kvshm: \"quoted\" \\ \n\t\x00 é \xff")
	f.Add(uint64(0), uint64(0), uint64(0), "")
	f.Fuzz(func(t *testing.T, a, b, c uint64, msg string) {
		if len(msg) > 4096 {
			return
		}
		k, v, err := decodeResponse(AppendTooNewJSON(nil, a, b, c))
		if x, ok := v.(jsTooNew); err != nil || k != RespTooNew || !ok || *x.RequestedStart != a || *x.RequestedEnd != b || x.NewestAvail != c {
			t.Fatalf("TooNew round trip: %v %v %+v", err, k, v)
		}
		k, v, err = decodeResponse(AppendInvalidRangeJSON(nil, a, b))
		if x, ok := v.(jsInvalidRange); err != nil || k != RespInvalidRange || !ok || x.StartID != a || x.EndID != b {
			t.Fatalf("InvalidRange round trip: %v %v %+v", err, k, v)
		}
		js := AppendErrorJSON(nil, msg)
		k, v, err = decodeResponse(js)
		if err != nil || k != RespError {
			t.Fatalf("Error %s: %v", js, err)
		}
		// encoding/json replaces invalid UTF-8 the same way; compare with its own round trip.
		ref, _ := json.Marshal(msg)
		var want string
		_ = json.Unmarshal(ref, &want)
		if v.(string) != want {
			t.Fatalf("Error message %q came back as %q", want, v)
		}
	})
}

// FuzzApplyStoredTokens feeds arbitrary byte vectors (as a hostile FlatBuffer could carry) to the decoder
// path: no panic, errors only from the sentinels, and a consistent index afterwards.
func FuzzApplyStoredTokens(f *testing.F) {
	f.Add(uint32(4), []byte{1, 0, 0, 0, 0, 0, 0, 0}, []byte{0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0}, []byte("lora"), false, true, uint64(1))
	f.Add(uint32(2), []byte{1, 0, 0, 0, 0, 0, 0, 0}, []byte{0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0}, []byte(nil), true, false, uint64(0))
	f.Add(uint32(1), []byte{1, 2, 3}, []byte{1}, []byte(nil), true, false, uint64(0))
	f.Fuzz(func(t *testing.T, bs uint32, hashes, tokens, lora []byte, eagle, hasParent bool, parent uint64) {
		if len(hashes) > 1<<12 || len(tokens) > 1<<14 {
			return
		}
		bs = bs%16 + 1
		ix, err := New(Config{WorkerID: 1, BlockSize: bs, MaxBufferSize: 4})
		if err != nil {
			t.Fatal(err)
		}
		for id := uint64(1); id <= 3; id++ {
			_, err := ix.ApplyStoredTokens(id, uint32(id%2), hasParent, parent, hashes, tokens, lora, eagle)
			if err != nil && !isSentinel(err) {
				t.Fatalf("unexpected error %v", err)
			}
			hasParent, parent = true, binary.LittleEndian.Uint64(append(slices.Clone(hashes), make([]byte, 8)...))
			checkTree(t, ix, fmt.Sprintf("event %d", id))
		}
		st := ix.Stats()
		if st.Buffered+int(st.Rejected) != 3 {
			t.Fatalf("3 events: %d buffered, %d rejected", st.Buffered, st.Rejected)
		}
		if _, err := ix.Recover(t.Context(), nil, nil); err != nil {
			t.Fatal(err)
		}
	})
}

func isSentinel(err error) bool {
	for _, s := range []error{ErrTokenCount, ErrBlockHashBytes, ErrParentNotFound, ErrBlockNotFound,
		ErrInvalidBlockSequence} {
		if errorsIs(err, s) {
			return true
		}
	}
	return false
}
