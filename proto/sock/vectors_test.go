package sock

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"reflect"
	"testing"
)

// protocolVectors is the shared file read by this test and by pybind/tests/test_client.py.
const protocolVectors = "../../testdata/protocol/frames.json"

var update = flag.Bool("update", false, "rewrite "+protocolVectors)

func u32p(v uint32) *uint32 { return &v }

func u64p(v uint64) *uint64 { return &v }

// frameVector is one frame of testdata/protocol/frames.json (documented in testdata/protocol/README.md).
type frameVector struct {
	Name      string `json:"name"`
	Direction string `json:"direction"` // "request" or "reply"
	Hex       string `json:"hex"`       // the whole frame
	Length    uint32 `json:"length"`    // the length field
	Version   uint8  `json:"version"`
	Kind      uint8  `json:"kind"`
	KindName  string `json:"kind_name"`
	Status    uint16 `json:"status"`
	Body      string `json:"body"`                 // the body bytes as text (JSON)
	Method    string `json:"method,omitempty"`     // request: the typed client call whose arguments are the body's fields
	ReadError string `json:"read_error,omitempty"` // the frame must be refused: unsupported_version or too_short
	ErrorCode string `json:"error_code,omitempty"` // error reply: its code
	ErrorMsg  string `json:"error_message,omitempty"`
}

type vectorFile struct {
	Comment string        `json:"comment"`
	Frames  []frameVector `json:"frames"`
}

// vectorSources are the inputs of the generated file: each request body is the JSON encoding of the request type
// the Go Client sends (field order = struct order, as the Python client writes them too).
func vectorSources(t *testing.T) []frameVector {
	t.Helper()
	mj := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	lora := "adapter-a"
	replayEP := "tcp://*:5568"
	reqs := []struct {
		name, method string
		kind         Kind
		body         any
	}{
		{"attach request", "attach", KindAttach, AttachRequest{RingPath: "/dev/shm/kvshm-7.ring", WorkerID: 7, KVBlockSize: 32, MaxBufferSize: 10000}},
		{"attach request, per-rank stream (dp_rank)", "attach", KindAttach, AttachRequest{RingPath: "/dev/shm/kvshm-7-r1.ring", WorkerID: 7, KVBlockSize: 32, MaxBufferSize: 10000, DpRank: u32p(1)}},
		{"attach request, ZMQ publishing (publish)", "attach", KindAttach, AttachRequest{RingPath: "/dev/shm/kvshm-7-r1.ring", WorkerID: 7, KVBlockSize: 16, MaxBufferSize: 10000, DpRank: u32p(1),
			Publish: &Publish{Endpoint: "tcp://*:5558", ReplayEndpoint: &replayEP, Topic: "kv", HWM: 100000, BufferSteps: 10000}}},
		{"attach request, ZMQ publishing without replay", "attach", KindAttach, AttachRequest{RingPath: "/dev/shm/kvshm-7.ring", WorkerID: 7, KVBlockSize: 16, MaxBufferSize: 10000,
			Publish: &Publish{Endpoint: "ipc:///run/kv.sock", HWM: 0, BufferSteps: 0}}},
		{"detach request", "detach", KindDetach, WorkerRequest{WorkerID: u64p(7)}},
		{"events request", "events", KindEvents, EventsRequest{WorkerID: u64p(7), Start: u64p(2), End: nil}},
		{"events request, u64 max ids", "events", KindEvents, EventsRequest{WorkerID: u64p(1<<64 - 1), Start: u64p(1<<64 - 1), End: u64p(1<<64 - 1)}},
		{"events request, dp_rank (per-rank stream or rank view)", "events", KindEvents, EventsRequest{WorkerID: u64p(7), Start: u64p(0), End: u64p(9), DpRank: u32p(4294967295)}},
		{"dump request, only stream", "dump", KindDump, WorkerRequest{}},
		{"stats request, every stream", "stats", KindStats, WorkerRequest{}},
		{"match request", "match", KindMatch, MatchRequest{WorkerID: u64p(7), Tokens: []uint32{1, 2, 3, 4294967295}, LoraName: &lora, IsEagle: true}},
		{"match request, base model", "match", KindMatch, MatchRequest{Tokens: []uint32{5}}},
		{"health request", "health", KindHealth, struct{}{}},
		{"forget request", "", KindForget, WorkerRequest{WorkerID: u64p(7)}},
	}
	var out []frameVector
	for _, r := range reqs {
		out = append(out, frameVector{Name: r.name, Direction: "request", Version: Version, Kind: uint8(r.kind), Body: mj(r.body), Method: r.method})
	}
	reply := func(name string, k Kind, st Status, body string) frameVector {
		return frameVector{Name: name, Direction: "reply", Version: Version, Kind: uint8(k), Status: uint16(st), Body: body}
	}
	out = append(out,
		reply("health OK reply", KindHealth, StatusOK, mj(HealthReply{Status: "ok", Version: "1.2.3", Streams: 2})),
		reply("stats OK reply, a per-rank stream with a loss", KindStats, StatusOK, mj(StatsReply{Streams: []StreamStats{{
			WorkerID: 7, DpRank: u32p(1), KVBlockSize: 32, MaxBufferSize: 10000, RingPath: "/dev/shm/kvshm-7-r1.ring", Epoch: 1, StreamEpoch: 1,
			ProducerAlive: true, ProducerPID: 4242, Attached: true, FirstEventID: u64p(0), LastEventID: u64p(99), Buffered: 98, ResidentBlocks: 12,
			Tainted: true, Incomplete: true, TaintReason: "event ids 80..81 were lost (producer dropped 2 events (ring full))",
			LostRanges: []LostRange{{First: 80, Last: 81, Reason: "producer dropped 2 events (ring full)"}}, LostEvents: 2, TokenMismatches: 3,
			EventsReceived: 98, RingCapacity: 1 << 26, DroppedEvents: 2, DroppedBytes: 900,
		}}})),
		reply("attach OK reply (batches, publishing)", KindAttach, StatusOK, mj(AttachReply{WorkerID: 7, Epoch: 3, StreamEpoch: 1, Batches: true, Publishing: true})),
		reply("stats OK reply, a published stream", KindStats, StatusOK, mj(StatsReply{Streams: []StreamStats{{
			WorkerID: 7, KVBlockSize: 16, MaxBufferSize: 10000, RingPath: "/dev/shm/kvshm-7.ring", Epoch: 1, StreamEpoch: 1,
			ProducerAlive: true, ProducerPID: 4242, Attached: true, FirstEventID: u64p(0), LastEventID: u64p(9), Buffered: 10,
			EventsReceived: 12, EventsNotIndexed: 2, RingCapacity: 1 << 26,
			Zmq: &ZmqStats{Published: 10, Dropped: 1, ReplayRequests: 2, BadReplayRequests: 1, Replayed: 7, Endpoint: "tcp://*:5558", ReplayEndpoint: &replayEP},
		}}})),
		reply("events OK reply", KindEvents, StatusOK, `{"Events":{"events":[{"worker_id":7,"storage_tier":"device","event":{"event_id":3,"data":"cleared","dp_rank":0}}],"last_event_id":3}}`),
		reply("detach OK reply (empty object)", KindDetach, StatusOK, `{}`),
	)
	e := reply("dump error reply", KindDump, StatusError, string(EncodeErrorBody(CodeNotFound, "no stream for worker_id 9 (0 attached)")))
	e.ErrorCode, e.ErrorMsg = CodeNotFound, "no stream for worker_id 9 (0 attached)"
	out = append(out, e)
	e = reply("refusal at accept (kind 0)", 0, StatusError, string(EncodeErrorBody(CodeBusy, "connection limit 1024 reached; retry later")))
	e.ErrorCode, e.ErrorMsg = CodeBusy, "connection limit 1024 reached; retry later"
	out = append(out, e)
	bad := reply("bad version", KindHealth, StatusOK, `{}`)
	bad.Version, bad.ReadError = 2, CodeUnsupportedVersion
	out = append(out, bad)
	short := frameVector{Name: "length below the header", Direction: "reply", Version: Version, Kind: uint8(KindHealth), Length: 2, ReadError: "too_short"}
	out = append(out, short)
	for i := range out {
		v := &out[i]
		v.KindName = Kind(v.Kind).String()
		if v.Kind == 0 {
			v.KindName = ""
		}
		if v.Length == 0 {
			v.Length = uint32(len(v.Body)) + lengthCounted
		}
		b := AppendHeader(nil, Kind(v.Kind), Status(v.Status), len(v.Body))
		b[0], b[1], b[2], b[3] = byte(v.Length), byte(v.Length>>8), byte(v.Length>>16), byte(v.Length>>24)
		b[4] = v.Version
		v.Hex = hex.EncodeToString(append(b, v.Body...))
	}
	return out
}

// TestProtocolVectors: the daemon's frame codec decodes every shared vector to exactly its fields, encodes them
// back to exactly its bytes, refuses the bad ones with the named error, and the request bodies are what the Go
// Client marshals and what the strict request decoder accepts. -update rewrites the file.
func TestProtocolVectors(t *testing.T) {
	if *update {
		b, err := json.MarshalIndent(vectorFile{
			Comment: "kvshm socket protocol frames (see README.md here and proto/sock/PROTOCOL.md); generated by go test ./proto/sock -run TestProtocolVectors -update",
			Frames:  vectorSources(t),
		}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(protocolVectors, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(protocolVectors)
	if err != nil {
		t.Fatal(err)
	}
	var file vectorFile
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("%s: %v", protocolVectors, err)
	}
	if want := vectorSources(t); !reflect.DeepEqual(file.Frames, want) {
		t.Fatalf("%s is stale: rerun with -update", protocolVectors)
	}
	kinds := map[Kind]bool{}
	for _, v := range file.Frames {
		t.Run(v.Name, func(t *testing.T) {
			in, err := hex.DecodeString(v.Hex)
			if err != nil {
				t.Fatal(err)
			}
			f, _, err := ReadFrame(bytes.NewReader(in), MaxResponse, nil)
			switch v.ReadError {
			case CodeUnsupportedVersion:
				if !errors.Is(err, ErrUnsupportedVersion) || f.Version != v.Version || f.Kind != Kind(v.Kind) {
					t.Fatalf("ReadFrame = %+v, %v; want ErrUnsupportedVersion with the header fields", f, err)
				}
				return
			case "too_short":
				if !errors.Is(err, ErrFrameTooShort) {
					t.Fatalf("ReadFrame error = %v, want ErrFrameTooShort", err)
				}
				return
			case "":
			default:
				t.Fatalf("unknown read_error %q", v.ReadError)
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.Version != v.Version || f.Kind != Kind(v.Kind) || f.Status != Status(v.Status) || string(f.Body) != v.Body || uint32(len(in)-4) != v.Length {
				t.Fatalf("decoded %+v (length %d), want %+v", f, len(in)-4, v)
			}
			var out bytes.Buffer
			if err := WriteFrame(&out, f.Kind, f.Status, []byte(v.Body)); err != nil || !bytes.Equal(out.Bytes(), in) {
				t.Fatalf("WriteFrame = %x, %v; want %s", out.Bytes(), err, v.Hex)
			}
			if v.Status == uint16(StatusError) {
				re := remoteError(f.Kind, f.Body)
				if re.Code != v.ErrorCode || re.Message != v.ErrorMsg {
					t.Fatalf("error reply decoded as %+v, want code %s message %q", re, v.ErrorCode, v.ErrorMsg)
				}
			}
			if v.Direction == "request" {
				kinds[f.Kind] = true
				if !f.Kind.Known() {
					t.Fatalf("request kind %d is not a known kind", f.Kind)
				}
				checkRequestBody(t, f.Kind, f.Body)
			}
		})
	}
	for k := KindAttach; k.Known(); k++ {
		if !kinds[k] {
			t.Errorf("no request vector of kind %s", k)
		}
	}
}

// checkRequestBody: the strict decoder accepts the body and re-marshalling its request type gives the same bytes.
func checkRequestBody(t *testing.T, k Kind, body []byte) {
	t.Helper()
	var v any
	switch k {
	case KindAttach:
		v = &AttachRequest{}
	case KindDetach, KindDump, KindStats, KindForget:
		v = &WorkerRequest{}
	case KindEvents:
		v = &EventsRequest{}
	case KindMatch:
		v = &MatchRequest{}
	case KindHealth:
		v = &struct{}{}
	}
	if err := DecodeStrict(body, v); err != nil {
		t.Fatalf("strict decode of %s: %v", body, err)
	}
	again, err := json.Marshal(v)
	if err != nil || !bytes.Equal(again, body) {
		t.Fatalf("re-marshalled body %s, want %s", again, body)
	}
}
