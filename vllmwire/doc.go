// Package vllmwire encodes KV-cache event batches exactly as vLLM 0.33.0 puts them on its ZMQ event stream: the
// msgpack that msgspec produces from vllm.distributed.kv_events.KVEventBatch. kvshmd publishes these bytes on a
// stream's PUB socket (package zmqpub); consumers (Dynamo's zmq_wire parser, vLLM-compatible subscribers) cannot
// tell them from vLLM's own.
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
// msgspec picks the smallest msgpack form for every value (uint forms for non-negative ints, fixstr/str8/16/32,
// fixarray/array16/32), always float64 for floats, and sizes a struct's map header for the struct's full field
// count (BlockStored has 16 with its tag: always map16). The shared vectors in testdata/vllmwire (written by
// gen_vectors.py from vLLM-shaped msgspec Structs) pin every case; TestVectors requires byte identity and
// TestVectorsFresh regenerates them with the dev venv's msgspec.
//
// # Usage
//
//	buf = vllmwire.AppendBatch(buf[:0], ts, events, dpRank) // or AppendBatchHeader, AppendEvent..., AppendBatchTrailer
//
// The Append functions allocate only when dst lacks capacity: with a reused buffer a batch costs no allocation
// (TestAppendBatchAllocs). They never fail; a field a kind does not carry is ignored, an unknown Kind appends
// nothing. An Event is read only during the call.
//
// Decode parses the shape this package encodes (tests, tools, the fuzz target); it fails with an error wrapping
// ErrMalformed on anything else (unknown tag or key, repeated key, wrong type, out-of-range integer, leftover
// bytes), never panics, and is not used on the daemon's path.
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
