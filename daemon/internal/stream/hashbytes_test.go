package stream

import (
	"bytes"
	"errors"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/vllmwire"
)

// FuzzCheckHashBytes: any META bytes against any event never panic, and checkHashBytes accepts exactly the bytes
// whose keys are the event's (one length for all, a parent's only with a parent).
func FuzzCheckHashBytes(f *testing.F) {
	f.Add(uint8(2), []byte{1, 2, 3, 4}, true, []byte{9}, true, false)
	f.Add(uint8(0), []byte{}, true, []byte(nil), false, false)
	f.Add(uint8(3), bytes.Repeat([]byte{7}, 96), true, bytes.Repeat([]byte{7}, 32), true, true)
	b := flatbuffers.NewBuilder(0)
	f.Fuzz(func(t *testing.T, n uint8, hb []byte, hasHB bool, pb []byte, hasParent, removed bool) {
		nb := int(n % 8)
		ev := fbs.EventSpec{Kind: fbs.KindStored, HasParent: hasParent}
		if removed {
			ev.Kind = fbs.KindRemoved
		}
		m := fbs.MetaSpec{ParentBytes: pb}
		if hasHB {
			m.HashBytes = append([]byte{}, hb...)
		}
		// The keys the bytes would give, when they split evenly; otherwise arbitrary ones.
		size := 0
		if nb > 0 {
			size = len(hb) / nb
		}
		for i := range nb {
			ev.BlockHashes = append(ev.BlockHashes, vllmwire.HashKey(hb[i*size:(i+1)*size]))
		}
		if hasParent {
			ev.ParentHash = vllmwire.HashKey(pb)
		}
		var v fbs.EventView
		if err := fbs.Decode(bytes.Clone(fbs.Build(b, &ev)), &v); err != nil {
			t.Fatal(err)
		}
		var mv fbs.MetaView
		if err := fbs.DecodeMeta(bytes.Clone(fbs.BuildMeta(b, &m)), &mv); err != nil {
			t.Fatal(err)
		}
		err := checkHashBytes(&v, &mv)
		wantOK := (!hasHB || nb == 0 && len(hb) == 0 || nb > 0 && len(hb)%nb == 0) &&
			(pb == nil || hasParent && !removed)
		if (err == nil) != wantOK || err != nil && !errors.Is(err, errBatch) {
			t.Fatalf("n=%d hb=%d has=%v pb=%v parent=%v removed=%v: %v, want ok=%v", nb, len(hb), hasHB, pb,
				hasParent, removed, err, wantOK)
		}
	})
}

// TestCheckHashBytes: the bytes block hashes a META gives must be the bytes of the event's keys; anything else
// makes the batch malformed.
func TestCheckHashBytes(t *testing.T) {
	b := flatbuffers.NewBuilder(0)
	h1, h2 := bytes.Repeat([]byte{1}, 32), append(bytes.Repeat([]byte{2}, 24), 9, 8, 7, 6, 5, 4, 3, 2)
	k1, k2 := vllmwire.HashKey(h1), vllmwire.HashKey(h2)
	stored := fbs.EventSpec{Kind: fbs.KindStored, BlockHashes: []uint64{k1, k2}, HasParent: true, ParentHash: k1,
		TokenIDs: make([]uint32, 8)}
	root := fbs.EventSpec{Kind: fbs.KindStored, BlockHashes: []uint64{k1}, TokenIDs: make([]uint32, 4)}
	removed := fbs.EventSpec{Kind: fbs.KindRemoved, BlockHashes: []uint64{k2}}
	empty := fbs.EventSpec{Kind: fbs.KindRemoved}
	cleared := fbs.EventSpec{Kind: fbs.KindCleared}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, c := range []struct {
		name string
		ev   fbs.EventSpec
		m    fbs.MetaSpec
		ok   bool
	}{
		{"no bytes", stored, fbs.MetaSpec{}, true},
		{"stored", stored, fbs.MetaSpec{HashBytes: cat(h1, h2), ParentBytes: h1}, true},
		{"removed", removed, fbs.MetaSpec{HashBytes: h2}, true},
		{"no blocks", empty, fbs.MetaSpec{HashBytes: []byte{}}, true},
		{"short hashes", removed, fbs.MetaSpec{HashBytes: []byte{0x2}}, false},
		{"swapped", stored, fbs.MetaSpec{HashBytes: cat(h2, h1)}, false},
		{"length not a multiple", stored, fbs.MetaSpec{HashBytes: cat(h1, h2[1:])}, false},
		{"bytes without blocks", empty, fbs.MetaSpec{HashBytes: h1}, false},
		{"cleared", cleared, fbs.MetaSpec{HashBytes: []byte{}}, false},
		{"parent key differs", stored, fbs.MetaSpec{ParentBytes: h2}, false},
		{"parent bytes without parent", root, fbs.MetaSpec{ParentBytes: h1}, false},
		{"parent bytes on removed", removed, fbs.MetaSpec{ParentBytes: h2}, false},
	} {
		var v fbs.EventView
		if err := fbs.Decode(bytes.Clone(fbs.Build(b, &c.ev)), &v); err != nil {
			t.Fatal(err)
		}
		var m fbs.MetaView
		if err := fbs.DecodeMeta(bytes.Clone(fbs.BuildMeta(b, &c.m)), &m); err != nil {
			t.Fatal(err)
		}
		if err := checkHashBytes(&v, &m); (err == nil) != c.ok || err != nil && !errors.Is(err, errBatch) {
			t.Errorf("%s: %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
