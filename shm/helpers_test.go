package shm

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
)

// testIdentity pins the producer identity so that ring images are reproducible.
var testIdentity = identity{pid: 4242, startTime: 123456789, epoch: 1_700_000_000_000_000_000}

// newTestRing creates a ring in a temporary directory and opens its consumer. Both are closed by t.Cleanup.
func newTestRing(t testing.TB, o Options) (*Writer, *Reader, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.ring")
	w, err := create(path, o, testIdentity)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	r, err := Open(path)
	if err != nil {
		w.Close()
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		r.Close()
		w.Close()
	})
	return w, r, path
}

// payloadOf returns n deterministic bytes identifying record i.
func payloadOf(i, n int) []byte {
	p := make([]byte, n)
	for j := range p {
		p[j] = byte(i*31 + j*7 + n)
	}
	return p
}

// drain reads every published record and releases them.
func drain(t testing.TB, r *Reader) []Record {
	t.Helper()
	var out []Record
	for {
		rec, err := r.Next()
		if errors.Is(err, ErrEmpty) {
			r.Release()
			return out
		}
		if err != nil {
			t.Fatalf("Next after %d records: %v", len(out), err)
		}
		rec.Payload = append([]byte(nil), rec.Payload...) // keep past Release
		out = append(out, rec)
	}
}

// advanceTo moves an empty ring's head and tail to pos (pos multiple of 8, first lap or any lap) by writing and
// draining records that never need padding.
func advanceTo(t testing.TB, w *Writer, r *Reader, pos uint64) {
	t.Helper()
	for {
		tail := w.tail
		if tail == pos {
			return
		}
		if tail > pos {
			t.Fatalf("advanceTo: tail %d already past %d", tail, pos)
		}
		n := min(pos-tail, w.maxRecord, w.capacity-(tail&w.mask))
		if !w.Append(TypeEvent, make([]byte, n-RecordHeaderSize)) {
			t.Fatalf("advanceTo: append of %d bytes at %d refused", n, tail)
		}
		w.Publish()
		drain(t, r)
	}
}

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
