package shm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

// Shared ring-image vectors in ../testdata/ring (README.md there describes them). Regenerate with
//
//	go test ./shm -run TestRingVectors -update
//
// The Python tests parse the same files with their own reader.

const vectorDir = "../testdata/ring"

func init() {
	// Another test file of this package may define -update too; share it instead of redefining it.
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite the golden files in testdata")
	}
}

func updateVectors() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

type vectorHeader struct {
	MagicHex          string `json:"magic_hex"`
	Version           uint32 `json:"version"`
	HeaderSize        uint32 `json:"header_size"`
	Capacity          uint64 `json:"capacity"`
	MaxRecord         uint32 `json:"max_record"`
	Flags             uint32 `json:"flags"`
	ProducerPID       uint32 `json:"producer_pid"`
	ProducerStartTime uint64 `json:"producer_start_time"`
	Epoch             uint64 `json:"epoch"`
	WorkerID          uint64 `json:"worker_id"`
	KVBlockSize       uint32 `json:"kv_block_size"`
	MaxBufferSize     uint32 `json:"max_buffer_size"`
	State             uint32 `json:"state"`
	Tail              uint64 `json:"tail"`
	Head              uint64 `json:"head"`
	DroppedEvents     uint64 `json:"dropped_events"`
	DroppedBytes      uint64 `json:"dropped_bytes"`
	LossFirstSeq      uint64 `json:"loss_first_seq"`
	LossLastSeq       uint64 `json:"loss_last_seq"`
	LossPending       uint64 `json:"loss_pending"`
	ConsumerHeartbeat uint64 `json:"consumer_heartbeat"`
}

type vectorRecord struct {
	Pos        uint64 `json:"pos"`
	Index      uint64 `json:"index"`
	Type       uint32 `json:"type"`
	Length     uint32 `json:"length"`
	PayloadHex string `json:"payload_hex"`
	// LOSS records only: the decoded payload.
	FirstSeq *uint64 `json:"first_seq,omitempty"`
	LastSeq  *uint64 `json:"last_seq,omitempty"`
	Count    *uint64 `json:"count,omitempty"`
}

type vectorPadding struct {
	Pos    uint64 `json:"pos"`
	Index  uint64 `json:"index"`
	Length uint32 `json:"length"`
}

type vectorFile struct {
	Description string          `json:"description"`
	File        string          `json:"file"`
	FileSize    int64           `json:"file_size"`
	Header      vectorHeader    `json:"header"`
	Records     []vectorRecord  `json:"records"` // unread records in [head, tail), padding excluded
	Padding     []vectorPadding `json:"padding"` // padding records in [head, tail)
}

var vectorOptions = Options{Capacity: 64 << 10, MaxRecord: 8192, WorkerID: 7, KVBlockSize: 16, MaxBufferSize: 1000}

// ringVectors build each image with the Writer (and a Reader to move the head). Each returns the file bytes.
var ringVectors = []struct {
	name, description string
	build             func(t *testing.T, path string) []byte
}{
	{"basic", "Seven EVENT records (payloads of 0, 1, 7, 8, 9, 100 and 1000 bytes) in two publications, head 0, " +
		"producer closed cleanly (state CLOSED).", func(t *testing.T, path string) []byte {
		w := mustCreate(t, path)
		for i, n := range []int{0, 1, 7, 8, 9, 100, 1000} {
			if !w.Append(TypeEvent, payloadOf(i, n)) {
				t.Fatalf("append %d refused", i)
			}
			if i == 2 {
				w.Publish()
			}
		}
		mustClose(t, w)
		return mustRead(t, path)
	}},
	{"wrap", "Wraps once: 61 of 63 records of 1024 bytes consumed (head 62464), two unread, a 608-byte record, then a " +
		"416-byte PADDING record at index 65120 and a 1008-byte record at index 0 (position 65536), then two small " +
		"records; consumer_heartbeat set; state READY.", func(t *testing.T, path string) []byte {
		w := mustCreate(t, path)
		defer mustClose(t, w)
		r := mustOpen(t, path)
		defer r.Close()
		for i := range 63 {
			mustAppend(t, w, payloadOf(i, 1016))
		}
		w.Publish()
		for range 61 {
			if _, err := r.Next(); err != nil {
				t.Fatal(err)
			}
		}
		r.Release()
		mustAppend(t, w, payloadOf(100, 600))  // ends at 65536-416
		mustAppend(t, w, payloadOf(101, 1000)) // 1008 bytes > 416 left: padding, then index 0
		mustAppend(t, w, payloadOf(102, 50))
		mustAppend(t, w, payloadOf(103, 50))
		w.Publish()
		r.Heartbeat(1_700_000_001_000_000_000)
		return mustRead(t, path)
	}},
	{"loss", "Events seq 1..32 of 2040-byte payloads fill the ring; seq 33 and 34 are dropped (full) and seq 35 " +
		"(9000 bytes) is too large; 30 records are consumed; seq 36 is written behind a LOSS record {33, 35, 3}; " +
		"seq 37 (9000 bytes) is dropped again, so the header shows dropped_events 4, dropped_bytes 22080 and a " +
		"pending loss [37, 37]; state READY.", func(t *testing.T, path string) []byte {
		w := mustCreate(t, path)
		defer mustClose(t, w)
		r := mustOpen(t, path)
		defer r.Close()
		for seq := uint64(1); seq <= 32; seq++ {
			if err := w.WriteEvent(seq, payloadOf(int(seq), 2040)); err != nil {
				t.Fatal(err)
			}
		}
		for _, seq := range []uint64{33, 34} {
			if err := w.WriteEvent(seq, payloadOf(int(seq), 2040)); !errors.Is(err, ErrFull) {
				t.Fatalf("seq %d: %v, want ErrFull", seq, err)
			}
		}
		if err := w.WriteEvent(35, payloadOf(35, 9000)); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("seq 35: %v, want ErrTooLarge", err)
		}
		for range 30 {
			if _, err := r.Next(); err != nil {
				t.Fatal(err)
			}
		}
		r.Release()
		if err := w.WriteEvent(36, payloadOf(36, 100)); err != nil {
			t.Fatal(err)
		}
		if err := w.WriteEvent(37, payloadOf(37, 9000)); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("seq 37: %v, want ErrTooLarge", err)
		}
		return mustRead(t, path)
	}},
}

func mustCreate(t *testing.T, path string) *Writer {
	t.Helper()
	w, err := create(path, vectorOptions, testIdentity)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func mustOpen(t *testing.T, path string) *Reader {
	t.Helper()
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustClose(t *testing.T, w *Writer) {
	t.Helper()
	if err := w.Close(); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatal(err)
	}
}

func mustAppend(t *testing.T, w *Writer, p []byte) {
	t.Helper()
	if !w.Append(TypeEvent, p) {
		t.Fatalf("append of %d bytes refused", len(p))
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// describeImage derives the JSON description of a ring image by walking it with raw little-endian reads (not the
// Reader, which the test then checks against it).
func describeImage(name, description string, img []byte) vectorFile {
	le := binary.LittleEndian
	h := parseHeader(img)
	v := vectorFile{Description: description, File: name + ".ring", FileSize: int64(len(img)),
		Records: []vectorRecord{}, Padding: []vectorPadding{}}
	v.Header = vectorHeader{
		MagicHex: hex.EncodeToString(h.Magic[:]), Version: h.Version, HeaderSize: h.HeaderSize, Capacity: h.Capacity,
		MaxRecord: h.MaxRecord, Flags: h.Flags, ProducerPID: h.ProducerPID, ProducerStartTime: h.ProducerStartTime,
		Epoch: h.Epoch, WorkerID: h.WorkerID, KVBlockSize: h.KVBlockSize, MaxBufferSize: h.MaxBufferSize,
		State: uint32(h.State), Tail: le.Uint64(img[offTail:]), Head: le.Uint64(img[offHead:]),
		DroppedEvents: le.Uint64(img[offDroppedEvents:]), DroppedBytes: le.Uint64(img[offDroppedBytes:]),
		LossFirstSeq: le.Uint64(img[offLossFirstSeq:]), LossLastSeq: le.Uint64(img[offLossLastSeq:]),
		LossPending: le.Uint64(img[offLossPending:]), ConsumerHeartbeat: le.Uint64(img[offHeartbeat:]),
	}
	data := img[HeaderSize:]
	for pos := v.Header.Head; pos < v.Header.Tail; {
		idx := pos & (h.Capacity - 1)
		length, typ := le.Uint32(data[idx:]), le.Uint32(data[idx+4:])
		if typ == TypePadding {
			v.Padding = append(v.Padding, vectorPadding{Pos: pos, Index: idx, Length: length})
			pos += uint64(length)
			continue
		}
		rec := vectorRecord{Pos: pos, Index: idx, Type: typ, Length: length,
			PayloadHex: hex.EncodeToString(data[idx+8 : idx+uint64(length)])}
		if typ == TypeLoss {
			f, l, c := le.Uint64(data[idx+8:]), le.Uint64(data[idx+16:]), le.Uint64(data[idx+24:])
			rec.FirstSeq, rec.LastSeq, rec.Count = &f, &l, &c
		}
		v.Records = append(v.Records, rec)
		pos += align8(uint64(length))
	}
	return v
}

// TestRingVectors regenerates each image with the Writer and requires it to equal the committed bytes (the Writer's
// output is part of the format), then checks the Reader and Inspect against the committed JSON.
func TestRingVectors(t *testing.T) {
	for _, vec := range ringVectors {
		t.Run(vec.name, func(t *testing.T) {
			ringPath := filepath.Join(vectorDir, vec.name+".ring")
			jsonPath := filepath.Join(vectorDir, vec.name+".json")
			img := vec.build(t, filepath.Join(t.TempDir(), vec.name+".ring"))
			desc, err := json.MarshalIndent(describeImage(vec.name, vec.description, img), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			desc = append(desc, '\n')
			if updateVectors() {
				if err := os.WriteFile(ringPath, img, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(jsonPath, desc, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			committed := mustRead(t, ringPath)
			if !bytes.Equal(committed, img) {
				t.Fatalf("%s differs from the Writer's output (run with -update if the change is intended)", ringPath)
			}
			committedJSON := mustRead(t, jsonPath)
			if !bytes.Equal(committedJSON, desc) {
				t.Fatalf("%s differs from the description of the image (run with -update)", jsonPath)
			}
			var want vectorFile
			if err := json.Unmarshal(committedJSON, &want); err != nil {
				t.Fatal(err)
			}
			checkReaderAgainstVector(t, committed, &want)
		})
	}
}

func checkReaderAgainstVector(t *testing.T, img []byte, want *vectorFile) {
	// Open needs a writable file (it may store head): read a copy.
	path := filepath.Join(t.TempDir(), want.File)
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	h, st, err := Inspect(path)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	wh := want.Header
	if h.Capacity != wh.Capacity || h.MaxRecord != wh.MaxRecord || h.Epoch != wh.Epoch || h.WorkerID != wh.WorkerID ||
		uint32(h.State) != wh.State || st.Head != wh.Head || st.Tail != wh.Tail || st.DroppedEvents != wh.DroppedEvents ||
		st.DroppedBytes != wh.DroppedBytes || st.LossPending != (wh.LossPending == 1) || st.ConsumerHeartbeat != wh.ConsumerHeartbeat {
		t.Fatalf("Inspect = %+v %+v, want %+v", h, st, wh)
	}
	r, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer r.Close()
	for i, wr := range want.Records {
		rec, err := r.Next()
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if rec.Pos != wr.Pos || rec.Type != wr.Type || hex.EncodeToString(rec.Payload) != wr.PayloadHex {
			t.Fatalf("record %d = pos %d type %d payload %x, want %+v", i, rec.Pos, rec.Type, rec.Payload, wr)
		}
		if wr.FirstSeq != nil {
			if f, l, c, ok := rec.Loss(); !ok || f != *wr.FirstSeq || l != *wr.LastSeq || c != *wr.Count {
				t.Fatalf("LOSS record %d = [%d,%d] count %d, want %+v", i, f, l, c, wr)
			}
		}
	}
	if _, err := r.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Next after the listed records = %v, want ErrEmpty", err)
	}
}
