package sock

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
)

// Request and reply bodies (JSON). Wire format: field names never change; new optional fields may be added.
// Request decoding is strict: unknown fields, keys in another case, duplicate keys, null and trailing data are
// bad_request (a misspelled "start" must not silently turn an events query into a dump).

// AttachRequest is the body of an ATTACH request.
type AttachRequest struct {
	RingPath      string `json:"ring_path"`
	WorkerID      uint64 `json:"worker_id"`
	KVBlockSize   uint32 `json:"kv_block_size"`
	MaxBufferSize uint32 `json:"max_buffer_size"`
	// DpRank, when given, makes the stream one rank's (one producer per attention-DP rank with its own seq space,
	// as vLLM runs); omitted, the stream is the worker's ALL stream (one producer for every rank, as TensorRT-LLM
	// runs). Streams are keyed by (worker_id, scope): a second live producer for the same key is a conflict.
	DpRank *uint32 `json:"dp_rank,omitempty"`
	// Publish, when given, makes kvshmd publish the stream on ZMQ in vLLM's wire format (package zmqpub); null or
	// omitted, it does not publish.
	Publish *Publish `json:"publish,omitempty"`
}

// Publish is ATTACH's ZMQ publishing request: vLLM's KVEventsConfig fields (the dp_rank port offset already
// applied by the producer). Every field is required; replay_endpoint may be null (no replay socket).
type Publish struct {
	Endpoint       string  `json:"endpoint"`
	ReplayEndpoint *string `json:"replay_endpoint"`
	Topic          string  `json:"topic"`
	HWM            int     `json:"hwm"`
	BufferSteps    int     `json:"buffer_steps"`
	// Wire is the vLLM release whose KV-event structs the payloads follow: "0.33" (vLLM 0.33.0; the default when
	// omitted), "0.32" (vLLM 0.32.0, whose BlockStored has one field less), "0.31" (vLLM 0.31.0: 0.32.0's layout),
	// "array" (0.32.0's events encoded array_like, the layout llm-d-kv-cache decodes; vllmwire.WireArray) or
	// "sglang" (SGLang 0.5.23's wire, vllmwire.WireSGLang). Other values are bad_request.
	Wire string `json:"wire,omitempty"`
}

// AttachReply is the body of an ATTACH reply.
type AttachReply struct {
	WorkerID    uint64 `json:"worker_id"`
	Epoch       uint64 `json:"epoch"`
	StreamEpoch uint32 `json:"stream_epoch"`
	Resumed     bool   `json:"resumed"`
	Head        uint64 `json:"head"`
	// Restored is true when the index was restored from the checkpoint a gracefully stopped daemon wrote for this
	// ring epoch and head (--state-dir): nothing was lost. Resumed without Restored means unknown history.
	Restored bool `json:"restored"`
	// Batches is true: this daemon understands BATCH ring records (older daemons omit it; a producer then writes
	// single EVENT records).
	Batches bool `json:"batches"`
	// Publishing is true when the stream is published on ZMQ (ATTACH asked for it and the sockets are up).
	Publishing bool `json:"publishing"`
}

// WorkerRequest is the body of DETACH, DUMP, STATS and FORGET requests (worker_id may be null, except for DETACH
// and FORGET). DpRank selects a stream as in EventsRequest (DETACH, FORGET: the per-rank stream of exactly that
// rank; omitted, the worker's ALL stream or its only stream).
type WorkerRequest struct {
	WorkerID *uint64 `json:"worker_id"`
	DpRank   *uint32 `json:"dp_rank,omitempty"`
}

// EventsRequest is the body of an EVENTS request. DpRank selects the per-rank stream of that rank, or else the
// rank view of the worker's ALL stream (Indexer.RecoverRank).
type EventsRequest struct {
	WorkerID *uint64 `json:"worker_id"`
	Start    *uint64 `json:"start"`
	End      *uint64 `json:"end"`
	DpRank   *uint32 `json:"dp_rank,omitempty"`
}

// MatchRequest is the body of a MATCH request. DpRank selects the stream as in EventsRequest (the scores of an
// ALL stream cover all its ranks).
type MatchRequest struct {
	WorkerID *uint64  `json:"worker_id"`
	Tokens   []uint32 `json:"tokens"`
	LoraName *string  `json:"lora_name"`
	IsEagle  bool     `json:"is_eagle"`
	DpRank   *uint32  `json:"dp_rank,omitempty"`
}

// MatchScore is one overlap score in a MATCH reply.
type MatchScore struct {
	WorkerID uint64 `json:"worker_id"`
	DpRank   uint32 `json:"dp_rank"`
	Blocks   uint32 `json:"blocks"`
}

// MatchReply is the body of a MATCH reply.
type MatchReply struct {
	Scores []MatchScore `json:"scores"`
}

// HealthReply is the body of a HEALTH reply.
type HealthReply struct {
	Status  string `json:"status"`
	Version string `json:"version"`
	Streams int    `json:"streams"`
}

// LostRange is a closed range of event ids known to be lost. Unknown marks a point where the history is unknown
// (first is then the first id after it, and last = first-1).
type LostRange struct {
	First   uint64 `json:"first"`
	Last    uint64 `json:"last"`
	Unknown bool   `json:"unknown,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// StreamStats is one stream in a STATS reply.
type StreamStats struct {
	WorkerID uint64 `json:"worker_id"`
	// DpRank is the stream's scope: its rank for a per-rank stream, null for an ALL stream.
	DpRank        *uint32 `json:"dp_rank"`
	KVBlockSize   uint32  `json:"kv_block_size"`
	MaxBufferSize uint32  `json:"max_buffer_size"`
	RingPath      string  `json:"ring_path"`
	Epoch         uint64  `json:"epoch"`
	StreamEpoch   uint32  `json:"stream_epoch"`
	Resets        uint64  `json:"resets"`
	ProducerAlive bool    `json:"producer_alive"`
	ProducerPID   uint32  `json:"producer_pid"`
	Attached      bool    `json:"attached"`

	FirstEventID   *uint64 `json:"first_event_id"`
	LastEventID    *uint64 `json:"last_event_id"`
	Buffered       int     `json:"buffered"`
	ResidentBlocks int     `json:"resident_blocks"`
	Tainted        bool    `json:"tainted"`
	// Incomplete is Tainted under the name the loss reporting uses: answers that need the lost events are
	// incomplete (--on-loss=best-effort) or Error (--on-loss=error) until a Cleared re-bases the stream.
	Incomplete  bool        `json:"incomplete"`
	TaintReason string      `json:"taint_reason,omitempty"`
	LostRanges  []LostRange `json:"lost_ranges"`
	// Missing are the losses an incomplete answer misses (since the last Cleared), unknown history included.
	Missing    []LostRange `json:"missing"`
	LostEvents uint64      `json:"lost_events"`
	IDResets   uint64      `json:"id_resets"`
	// TokenMismatches counts Stored events whose token count was not blocks × block_size (applied as Dynamo
	// applies them: only complete windows, zipped with the block hashes).
	TokenMismatches uint64 `json:"token_mismatches"`

	EventsReceived  uint64  `json:"events_received"`
	CorruptRecords  uint64  `json:"corrupt_records"`
	MalformedEvents uint64  `json:"malformed_events"`
	RingHead        uint64  `json:"ring_head"`
	RingTail        uint64  `json:"ring_tail"`
	RingUsedBytes   uint64  `json:"ring_used_bytes"`
	RingCapacity    uint64  `json:"ring_capacity_bytes"`
	RingFill        float64 `json:"ring_fill_ratio"`
	DroppedEvents   uint64  `json:"dropped_events"`
	DroppedBytes    uint64  `json:"dropped_bytes"`
	LossPending     bool    `json:"loss_pending"`
	DumpBuilds      uint64  `json:"dump_builds"`
	DumpCacheHits   uint64  `json:"dump_cache_hits"`
	// EventsNotIndexed counts the events applied to ZMQ only (not device-tier main attention; kvshm_events_not_indexed_total).
	EventsNotIndexed uint64 `json:"events_not_indexed"`
	// Zmq is present when the stream is published on ZMQ.
	Zmq *ZmqStats `json:"zmq,omitempty"`
}

// ZmqStats is a stream's ZMQ publisher in a STATS reply.
type ZmqStats struct {
	Published      uint64 `json:"published"`
	Dropped        uint64 `json:"dropped"`
	ReplayRequests uint64 `json:"replay_requests"`
	// BadReplayRequests counts replay requests that were not [identity, "", start seq u64 BE]: ignored, unanswered.
	BadReplayRequests uint64  `json:"bad_replay_requests"`
	Replayed          uint64  `json:"replayed"`
	Endpoint          string  `json:"endpoint"`
	ReplayEndpoint    *string `json:"replay_endpoint"`
}

// StatsReply is the body of a STATS reply.
type StatsReply struct {
	Streams []StreamStats `json:"streams"`
}

// ErrorBody is the body of every error reply.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}

// DecodeStrict decodes a request body (a JSON object) into v, a pointer to a struct: unknown fields, keys that
// match a field only when case is ignored, duplicate keys, a non-object (null included) and trailing data are
// errors; an empty body is {}. encoding/json alone would accept the middle three.
func DecodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		body = []byte("{}")
	}
	if err := checkObjectKeys(body, v); err != nil {
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %v", err)
	}
	if rest := body[dec.InputOffset():]; len(bytes.TrimSpace(rest)) != 0 {
		return fmt.Errorf("invalid JSON body: trailing data after the object")
	}
	return nil
}

// checkObjectKeys checks that body is one JSON object whose keys are each exactly (case included) the json name of
// one of v's struct fields, at most once. Values are left to json.Decoder.
func checkObjectKeys(body []byte, v any) error {
	fields, nested := jsonFieldNames(reflect.TypeOf(v).Elem())
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil {
		return err
	} else if tok != json.Delim('{') {
		return fmt.Errorf("want a JSON object, got %v", tok)
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key := tok.(string) // an object key is always a string token
		switch {
		case !fields[key]:
			return fmt.Errorf("unknown field %q", key)
		case seen[key]:
			return fmt.Errorf("duplicate field %q", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return err
		}
		if sub := nested[key]; sub != nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			if err := checkObjectKeys(raw, reflect.New(sub).Interface()); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	return nil
}

// jsonFieldNames returns the json names of a struct type's fields, and the struct type of those that hold a
// struct (or a pointer to one): their objects are checked the same way.
func jsonFieldNames(t reflect.Type) (map[string]bool, map[string]reflect.Type) {
	names := make(map[string]bool, t.NumField())
	nested := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if name != "-" {
			names[name] = true
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				nested[name] = ft
			}
		}
	}
	return names, nested
}

// EncodeErrorBody returns the JSON body of an error reply (the daemon writes it on the socket and over HTTP).
func EncodeErrorBody(code, msg string) []byte {
	b, err := json.Marshal(ErrorBody{Error: msg, Code: code})
	if err != nil { // cannot happen for two strings
		return []byte(`{"error":"internal","code":"internal"}`)
	}
	return b
}
