package daemon

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
