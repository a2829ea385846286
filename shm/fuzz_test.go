package shm

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// fuzzBases are valid ring images (the shared vectors: wrap + padding, LOSS + pending loss, basic) that the fuzz
// input mutates.
var (
	fuzzBasesOnce sync.Once
	fuzzBases     [][]byte
)

func loadFuzzBases(t testing.TB) [][]byte {
	fuzzBasesOnce.Do(func() {
		for _, name := range []string{"wrap", "loss", "basic"} {
			b, err := os.ReadFile(filepath.Join(vectorDir, name+".ring"))
			if err != nil {
				t.Fatalf("read fuzz base: %v", err)
			}
			fuzzBases = append(fuzzBases, b)
		}
	})
	return fuzzBases
}

// applyPatches mutates a copy of a base image. The input is a base selector byte followed by 4-byte patches
// [sel][lo][hi][value]: an even sel patches the header's shared words and static fields (offsets below 0x208), an
// odd sel patches the data area (sel>>1 supplies the high bits of the offset).
func applyPatches(bases [][]byte, in []byte) []byte {
	var sel byte
	if len(in) > 0 {
		sel, in = in[0], in[1:]
	}
	m := append([]byte(nil), bases[int(sel)%len(bases)]...)
	capacity := uint64(len(m) - HeaderSize)
	for ; len(in) >= 4; in = in[4:] {
		off := uint64(in[1]) | uint64(in[2])<<8
		if in[0]&1 == 0 {
			m[off%(offHeartbeat+8)] = in[3]
		} else {
			off |= uint64(in[0]>>1) << 16
			m[HeaderSize+off%capacity] = in[3]
		}
	}
	return m
}

// FuzzReaderRecords mutates the header and data area of valid ring images and drains them: validation must
// return typed errors only (ErrMagic, ErrVersion, ErrHeader, ErrNotReady, *CorruptionError), never panic and never
// hand out a record that violates the format. Out-of-bounds reads would panic (the image is a heap slice of
// exactly the file size).
func FuzzReaderRecords(f *testing.F) {
	bases := loadFuzzBases(f)
	for sel := range byte(len(bases)) {
		f.Add([]byte{sel}) // unmodified
	}
	for _, seed := range [][]byte{
		{0, 0x00, 0x80, 0x00, 0x01},                         // header: tail low byte, unaligned
		{0, 0x00, 0x00, 0x01, 0xFF},                         // header: head low byte
		{0, 0x00, 0x82, 0x00, 0x10},                         // header: tail far ahead
		{2, 0x00, 0x08, 0x00, 0x02},                         // header: version 2
		{0, 0x00, 0x10, 0x00, 0x01, 0x00, 0x18, 0x00, 0x01}, // header: capacity, max_record
		{0, 0x00, 0x48, 0x00, 0x00},                         // header: state INIT
		{1, 0x01, 0x00, 0xF0, 0x00},                         // loss image: length of the first unread record
		{1, 0x01, 0x00, 0x00, 0x28},                         // loss image: LOSS record of 40 bytes
		{0, 0x01, 0x64, 0xFE, 0x00},                         // wrap image: padding type
		{0, 0x01, 0x60, 0xFE, 0x08, 0x01, 0x61, 0xFE, 0x00}, // wrap image: padding length 8
		{0, 0x01, 0x04, 0xF4, 0xFF, 0x01, 0x05, 0xF4, 0xFF, 0x01, 0x06, 0xF4, 0xFF, 0x01, 0x07, 0xF4, 0xFF}, // wrap image: PADDING type mid-ring
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 4*64+1 {
			return
		}
		m := applyPatches(bases, in)
		r, err := newReader(m, nil)
		if err != nil {
			if !errors.Is(err, ErrMagic) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrHeader) &&
				!errors.Is(err, ErrNotReady) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("newReader: untyped error %v", err)
			}
			return
		}
		_ = r.Header()
		corrupt := 0
		for i := 0; i < 10000; i++ {
			before := r.pos
			rec, err := r.Next()
			var ce *CorruptionError
			switch {
			case err == nil:
				if rec.Type != TypeEvent && rec.Type != TypeLoss {
					t.Fatalf("Next returned type %#x", rec.Type)
				}
				if uint64(len(rec.Payload))+RecordHeaderSize > r.maxRecord || rec.Pos < before || rec.Pos+8 > r.tail {
					t.Fatalf("record at %d of %d bytes outside [%d, %d) or over max_record %d",
						rec.Pos, len(rec.Payload), before, r.tail, r.maxRecord)
				}
				if rec.Type == TypeLoss {
					if _, _, _, ok := rec.Loss(); !ok {
						t.Fatalf("LOSS record with %d payload bytes", len(rec.Payload))
					}
				}
				if i%7 == 0 {
					r.Release()
				}
			case errors.Is(err, ErrEmpty):
				r.Release()
				_ = r.Stats()
				return
			case errors.As(err, &ce) && errors.Is(err, ErrCorrupt):
				if ce.Pos != r.pos {
					t.Fatalf("corruption reported at %d, read position %d", ce.Pos, r.pos)
				}
				if corrupt++; corrupt > 2 {
					return // the tail word itself is invalid: nothing to repair
				}
				r.SkipToTail()
			default:
				t.Fatalf("Next: untyped error %v", err)
			}
		}
		t.Fatalf("Next did not reach the tail in 10000 calls")
	})
}
