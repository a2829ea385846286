package sock

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func frameBytes(length uint32, ver, kind byte, status uint16, body []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, length)
	b = append(b, ver, kind)
	b = binary.LittleEndian.AppendUint16(b, status)
	return append(b, body...)
}

func TestReadFrame(t *testing.T) {
	tests := []struct {
		name    string
		in      []byte
		max     uint32
		wantErr error
		want    Frame
	}{
		{"health empty body", frameBytes(4, 1, 7, 0, nil), 64, nil, Frame{Version: 1, Kind: KindHealth}},
		{"body", frameBytes(6, 1, 3, 0, []byte("{}")), 64, nil, Frame{Version: 1, Kind: KindEvents, Body: []byte("{}")}},
		{"error status", frameBytes(6, 1, 3, 1, []byte("{}")), 64, nil, Frame{Version: 1, Kind: KindEvents, Status: StatusError, Body: []byte("{}")}},
		{"at cap", frameBytes(8, 1, 3, 0, []byte("abcd")), 8, nil, Frame{Version: 1, Kind: KindEvents, Body: []byte("abcd")}},
		{"over cap", frameBytes(9, 1, 3, 0, []byte("abcde")), 8, ErrFrameTooLarge, Frame{Version: 1, Kind: KindEvents}},
		{"huge length", frameBytes(0xFFFFFFFF, 1, 3, 0, nil), 1 << 20, ErrFrameTooLarge, Frame{Version: 1, Kind: KindEvents}},
		{"length below header", frameBytes(3, 1, 3, 0, nil), 64, ErrFrameTooShort, Frame{}},
		{"length zero", frameBytes(0, 1, 3, 0, nil), 64, ErrFrameTooShort, Frame{}},
		{"wrong version", frameBytes(4, 2, 7, 0, nil), 64, ErrUnsupportedVersion, Frame{Version: 2, Kind: KindHealth}},
		{"version zero", frameBytes(4, 0, 7, 0, nil), 64, ErrUnsupportedVersion, Frame{Version: 0, Kind: KindHealth}},
		{"empty stream", nil, 64, io.EOF, Frame{}},
		{"truncated length", []byte{4, 0}, 64, io.ErrUnexpectedEOF, Frame{}},
		{"truncated header", []byte{4, 0, 0, 0, 1}, 64, io.ErrUnexpectedEOF, Frame{}},
		{"truncated body", frameBytes(10, 1, 3, 0, []byte("abc")), 64, io.ErrUnexpectedEOF, Frame{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, _, err := ReadFrame(bytes.NewReader(tt.in), tt.max, nil)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("ReadFrame error = %v, want %v", err, tt.wantErr)
			}
			if f.Version != tt.want.Version || f.Kind != tt.want.Kind || f.Status != tt.want.Status || !bytes.Equal(f.Body, tt.want.Body) {
				t.Fatalf("ReadFrame = %+v, want %+v", f, tt.want)
			}
		})
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 4095, 4096, 100 << 10} {
		body := bytes.Repeat([]byte{'x'}, n)
		var buf bytes.Buffer
		if err := WriteFrame(&buf, KindDump, StatusError, body); err != nil {
			t.Fatalf("WriteFrame(%d bytes): %v", n, err)
		}
		if buf.Len() != HeaderSize+n {
			t.Fatalf("WriteFrame(%d bytes) wrote %d bytes, want %d", n, buf.Len(), HeaderSize+n)
		}
		f, _, err := ReadFrame(bufio.NewReader(&buf), MaxResponse, nil)
		if err != nil || f.Kind != KindDump || f.Status != StatusError || !bytes.Equal(f.Body, body) {
			t.Fatalf("round trip of %d bytes: frame %v/%v/%d bytes, err %v", n, f.Kind, f.Status, len(f.Body), err)
		}
	}
}

func TestReadFrameReusesBuffer(t *testing.T) {
	buf := make([]byte, 0, 64)
	f, got, err := ReadFrame(bytes.NewReader(frameBytes(6, 1, 3, 0, []byte("{}"))), 64, buf)
	if err != nil {
		t.Fatal(err)
	}
	if &got[:1][0] != &buf[:1][0] || &f.Body[0] != &buf[:1][0] {
		t.Fatal("ReadFrame allocated although the buffer was large enough")
	}
}

func TestDecodeStrict(t *testing.T) {
	tests := []struct {
		body string
		ok   bool
	}{
		{``, true},
		{`{}`, true},
		{` {"worker_id":18446744073709551615,"start":1,"end":null} `, true},
		{`{"worker_id":null}`, true},
		{`{"start_event_id":1}`, false},
		{`{"start":-1}`, false},
		{`{"start":1.5}`, false},
		{`{"start":18446744073709551616}`, false},
		{`{} {}`, false},
		{`{}]`, false},
		{`[]`, false},
		{`{"start":"1"}`, false},
	}
	for _, tt := range tests {
		var r EventsRequest
		err := DecodeStrict([]byte(tt.body), &r)
		if (err == nil) != tt.ok {
			t.Errorf("DecodeStrict(%q) error = %v, want ok=%v", tt.body, err, tt.ok)
		}
	}
	var r EventsRequest
	if err := DecodeStrict([]byte(`{"worker_id":18446744073709551615}`), &r); err != nil || *r.WorkerID != 1<<64-1 {
		t.Fatalf("u64 worker id not exact: %v %v", r.WorkerID, err)
	}
}

// FuzzReadFrame: no panic, errors only from the documented set, and a successful frame re-encodes to exactly the
// bytes it was read from.
func FuzzReadFrame(f *testing.F) {
	f.Add(frameBytes(4, 1, 7, 0, nil))
	f.Add(frameBytes(6, 1, 3, 0, []byte("{}")))
	f.Add(frameBytes(0xFFFFFFFF, 1, 3, 0, nil))
	f.Add(frameBytes(3, 1, 3, 0, nil))
	f.Add(frameBytes(4, 9, 3, 0, nil))
	f.Add(append(frameBytes(6, 1, 5, 0, []byte("{}")), frameBytes(4, 1, 7, 0, nil)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 1<<16 {
			return
		}
		r := bytes.NewReader(in)
		var buf []byte
		for {
			off := len(in) - r.Len()
			fr, nb, err := ReadFrame(r, 1<<12, buf)
			buf = nb
			if err != nil {
				switch {
				case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, ErrFrameTooLarge),
					errors.Is(err, ErrFrameTooShort), errors.Is(err, ErrUnsupportedVersion):
				default:
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			var out bytes.Buffer
			if err := WriteFrame(&out, fr.Kind, fr.Status, fr.Body); err != nil {
				t.Fatal(err)
			}
			end := len(in) - r.Len()
			if !bytes.Equal(out.Bytes(), in[off:end]) {
				t.Fatalf("re-encoded frame %x differs from input %x", out.Bytes(), in[off:end])
			}
		}
	})
}
