package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

// rawBatch lays out a BATCH payload by hand: ts, count, flags, then each sub as given (header + payload, padded to
// 8 unless it is the last). It does not check anything, so tests can build invalid batches.
func rawBatch(ts float64, count uint32, subs ...[]byte) []byte {
	le := binary.LittleEndian
	p := le.AppendUint64(nil, math.Float64bits(ts))
	p = le.AppendUint32(p, count)
	p = le.AppendUint32(p, 0)
	for i, s := range subs {
		p = append(p, s...)
		if i+1 < len(subs) {
			for len(p)%8 != 0 {
				p = append(p, 0)
			}
		}
	}
	return p
}

func rawSub(typ uint32, payload []byte) []byte {
	le := binary.LittleEndian
	s := le.AppendUint32(nil, uint32(8+len(payload)))
	s = le.AppendUint32(s, typ)
	return append(s, payload...)
}

func TestBatchParse(t *testing.T) {
	ev1, ev2, meta := []byte("event-one"), []byte("event-two-xx"), []byte("meta")
	le := binary.LittleEndian
	cases := []struct {
		name    string
		payload []byte
		want    []Sub  // nil: malformed
		reason  string // for malformed
	}{
		{"one event", rawBatch(1.5, 1, rawSub(SubEvent, ev1)), []Sub{{SubEvent, ev1}}, ""},
		{"meta then event", rawBatch(2, 2, rawSub(SubMeta, meta), rawSub(SubEvent, ev1)),
			[]Sub{{SubMeta, meta}, {SubEvent, ev1}}, ""},
		{"events and metas", rawBatch(0, 4, rawSub(SubEvent, ev1), rawSub(SubMeta, meta), rawSub(SubEvent, ev2),
			rawSub(SubEvent, nil)), []Sub{{SubEvent, ev1}, {SubMeta, meta}, {SubEvent, ev2}, {SubEvent, []byte{}}}, ""},
		{"flags ignored", func() []byte {
			p := rawBatch(0, 1, rawSub(SubEvent, ev1))
			le.PutUint32(p[12:], 7)
			return p
		}(), []Sub{{SubEvent, ev1}}, ""},
		{"empty payload", nil, nil, "shorter than the batch header"},
		{"15 bytes", make([]byte, 15), nil, "shorter than the batch header"},
		{"count 0", rawBatch(0, 0), nil, "count 0"},
		{"count 0 with subs", rawBatch(0, 0, rawSub(SubEvent, ev1)), nil, "count 0"},
		{"count beyond the bytes", rawBatch(0, 1<<30, rawSub(SubEvent, ev1)), nil, "cannot fit"},
		{"count one too many", rawBatch(0, 2, rawSub(SubEvent, ev1)), nil, "past the payload"},
		{"count one too few", rawBatch(0, 1, rawSub(SubEvent, ev1), rawSub(SubEvent, ev2)), nil, "after the last"},
		{"sub length below header", rawBatch(0, 1, []byte{4, 0, 0, 0, 1, 0, 0, 0}), nil, "outside [8"},
		{"sub length past payload", func() []byte {
			p := rawBatch(0, 1, rawSub(SubEvent, ev1))
			le.PutUint32(p[16:], uint32(len(p)))
			return p
		}(), nil, "outside [8"},
		{"sub length huge", func() []byte {
			p := rawBatch(0, 1, rawSub(SubEvent, ev1))
			le.PutUint32(p[16:], math.MaxUint32)
			return p
		}(), nil, "outside [8"},
		{"last sub padded", append(rawBatch(0, 1, rawSub(SubEvent, ev1)), 0, 0, 0, 0, 0, 0, 0), nil, "after the last"},
		{"padded sub runs past the payload", rawBatch(0, 2, rawSub(SubEvent, ev1), []byte{0}), nil, "past the payload"},
		{"unknown sub type", rawBatch(0, 1, rawSub(2, ev1)), nil, "unknown type"},
		{"sub type BATCH", rawBatch(0, 1, rawSub(TypeBatch, ev1)), nil, "unknown type"},
		{"meta last", rawBatch(0, 2, rawSub(SubEvent, ev1), rawSub(SubMeta, meta)), nil, "META is the last"},
		{"meta only", rawBatch(0, 1, rawSub(SubMeta, meta)), nil, "META is the last"},
		{"meta after meta", rawBatch(0, 3, rawSub(SubMeta, meta), rawSub(SubMeta, meta), rawSub(SubEvent, ev1)), nil,
			"META follows a META"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := Record{Type: TypeBatch, Payload: c.payload}.Batch()
			if c.want == nil {
				if !errors.Is(err, ErrMalformedBatch) || !strings.Contains(err.Error(), c.reason) {
					t.Fatalf("Batch = %v, want ErrMalformedBatch with %q", err, c.reason)
				}
				if len(b.Subs) != 0 || b.TS != 0 {
					t.Fatalf("batch not empty on error: %+v", b)
				}
				return
			}
			if err != nil {
				t.Fatalf("Batch: %v", err)
			}
			if ts := math.Float64frombits(le.Uint64(c.payload)); b.TS != ts {
				t.Fatalf("TS = %v, want %v", b.TS, ts)
			}
			checkSubsEqual(t, b.Subs, c.want)
			if again, err := AppendBatch(nil, b.TS, b.Subs); err != nil || !bytes.Equal(again[16:], c.payload[16:]) {
				t.Fatalf("AppendBatch(parsed) = %x, %v; want the parsed payload %x", again, err, c.payload)
			}
		})
	}
	if _, err := (Record{Type: TypeEvent, Payload: rawBatch(0, 1, rawSub(SubEvent, ev1))}).Batch(); !errors.Is(err, ErrMalformedBatch) {
		t.Fatalf("Batch of an EVENT record = %v, want ErrMalformedBatch", err)
	}
}

func checkSubsEqual(t testing.TB, got, want []Sub) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d subs, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Type != want[i].Type || !bytes.Equal(got[i].Payload, want[i].Payload) {
			t.Fatalf("sub %d = %d %q, want %d %q", i, got[i].Type, got[i].Payload, want[i].Type, want[i].Payload)
		}
	}
}

func TestAppendBatchRejects(t *testing.T) {
	ev, meta := Sub{SubEvent, []byte("e")}, Sub{SubMeta, []byte("m")}
	for name, subs := range map[string][]Sub{
		"empty":        nil,
		"unknown type": {{Type: TypeLoss, Payload: []byte("x")}},
		"meta last":    {ev, meta},
		"meta meta":    {meta, meta, ev},
	} {
		dst := []byte("keep")
		got, err := AppendBatch(dst, 0, subs)
		if !errors.Is(err, ErrMalformedBatch) || string(got) != "keep" {
			t.Errorf("%s: AppendBatch = %q, %v; want dst unchanged and ErrMalformedBatch", name, got, err)
		}
	}
	if n := BatchSize([]Sub{meta, ev}); n != 16+16+9 {
		t.Fatalf("BatchSize = %d, want 41", n)
	}
}

func TestParseBatchAllocatesNothing(t *testing.T) {
	p, err := AppendBatch(nil, 3, []Sub{{SubMeta, []byte("m")}, {SubEvent, []byte("e1")}, {SubEvent, []byte("e2")}})
	if err != nil {
		t.Fatal(err)
	}
	rec := Record{Type: TypeBatch, Payload: p}
	b := Batch{Subs: make([]Sub, 0, 4)}
	if n := testing.AllocsPerRun(100, func() {
		if err := rec.ParseBatch(&b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("ParseBatch allocates %v times per call, want 0", n)
	}
}

// TestWriteBatchThroughRing writes batches (and events) through a real ring, across the wrap, and reads them back
// with Next and Batch; then a full ring refuses a batch without writing, and a pending loss is reported by a LOSS
// record published with the next batch.
func TestWriteBatchThroughRing(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity, MaxRecord: 4096})
	var want [][]Sub
	for i := range 200 { // 200 × ~400 bytes: several laps of 64 KiB
		subs := []Sub{{SubMeta, payloadOf(i, i%13)}, {SubEvent, payloadOf(i+1, 100+i%50)}, {SubEvent, payloadOf(i+2, 3)}}
		ok, err := w.WriteBatch(float64(i), subs)
		if err != nil || !ok {
			t.Fatalf("WriteBatch %d = %v, %v", i, ok, err)
		}
		want = append(want, subs)
		if i%7 == 0 {
			if err := w.WriteEvent(uint64(i), payloadOf(i, 24)); err != nil {
				t.Fatal(err)
			}
			want = append(want, nil)
		}
		if i%5 == 4 {
			recs := drain(t, r)
			if len(recs) != len(want) {
				t.Fatalf("read %d records, want %d", len(recs), len(want))
			}
			for j, rec := range recs {
				if want[j] == nil {
					if rec.Type != TypeEvent {
						t.Fatalf("record %d type %d, want EVENT", j, rec.Type)
					}
					continue
				}
				b, err := rec.Batch()
				if err != nil {
					t.Fatalf("record %d: %v", j, err)
				}
				checkSubsEqual(t, b.Subs, want[j])
			}
			want = want[:0]
		}
	}
	// A batch over max_record is refused whole, nothing counted.
	if ok, err := w.WriteBatch(0, []Sub{{SubEvent, make([]byte, 4096)}}); ok || err != nil {
		t.Fatalf("WriteBatch over max_record = %v, %v; want false, nil", ok, err)
	}
	if ok, err := w.WriteBatch(0, nil); ok || !errors.Is(err, ErrMalformedBatch) {
		t.Fatalf("WriteBatch(nil) = %v, %v; want ErrMalformedBatch", ok, err)
	}
	// Fill the ring, count a drop, free it, and check the LOSS record precedes the next batch.
	big := []Sub{{SubEvent, make([]byte, 2000)}}
	for {
		ok, err := w.WriteBatch(1, big)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
	}
	w.CountDrop(77, 2000)
	if st := w.Stats(); st.DroppedEvents != 1 {
		t.Fatalf("dropped %d, want 1", st.DroppedEvents)
	}
	drain(t, r)
	if ok, err := w.WriteBatch(2, []Sub{{SubEvent, []byte("after")}}); !ok || err != nil {
		t.Fatalf("WriteBatch after drain = %v, %v", ok, err)
	}
	recs := drain(t, r)
	if len(recs) != 2 {
		t.Fatalf("%d records after the loss, want LOSS + BATCH", len(recs))
	}
	if first, last, count, ok := recs[0].Loss(); !ok || first != 77 || last != 77 || count != 1 {
		t.Fatalf("LOSS = %d %d %d %v", first, last, count, ok)
	}
	if b, err := recs[1].Batch(); err != nil || b.TS != 2 || string(b.Subs[0].Payload) != "after" {
		t.Fatalf("batch after the loss = %+v, %v", b, err)
	}
	w.Close()
	if _, err := w.WriteBatch(0, big); !errors.Is(err, ErrClosed) {
		t.Fatalf("WriteBatch after Close = %v, want ErrClosed", err)
	}
}

// FuzzBatch: arbitrary BATCH payloads never panic; an accepted payload's subs lie inside it, follow the rules,
// and AppendBatch of them reproduces the payload (up to the ignored flags and the padding bytes' contents).
func FuzzBatch(f *testing.F) {
	f.Add(rawBatch(1, 1, rawSub(SubEvent, []byte("e"))))
	f.Add(rawBatch(0, 2, rawSub(SubMeta, []byte("meta")), rawSub(SubEvent, []byte("event"))))
	f.Add(rawBatch(0, 3, rawSub(SubEvent, nil), rawSub(SubMeta, nil), rawSub(SubEvent, make([]byte, 17))))
	f.Add(rawBatch(0, 2, rawSub(SubMeta, nil)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := Record{Type: TypeBatch, Payload: p}.Batch()
		if err != nil {
			if !errors.Is(err, ErrMalformedBatch) {
				t.Fatalf("error %v does not wrap ErrMalformedBatch", err)
			}
			return
		}
		if len(b.Subs) == 0 || b.Subs[len(b.Subs)-1].Type != SubEvent {
			t.Fatalf("accepted batch ends with %+v", b.Subs)
		}
		for i, s := range b.Subs {
			if s.Type == SubMeta && b.Subs[i+1].Type != SubEvent {
				t.Fatalf("META %d not followed by an EVENT", i)
			}
		}
		q, err := AppendBatch(nil, b.TS, b.Subs)
		if err != nil {
			t.Fatalf("AppendBatch of an accepted batch: %v", err)
		}
		if len(q) != len(p) || BatchSize(b.Subs) != uint64(len(p)) {
			t.Fatalf("re-encoded %d bytes (BatchSize %d), parsed %d", len(q), BatchSize(b.Subs), len(p))
		}
		c, err := Record{Type: TypeBatch, Payload: q}.Batch()
		if err != nil {
			t.Fatalf("re-encoded batch does not parse: %v", err)
		}
		checkSubsEqual(t, c.Subs, b.Subs)
	})
}
