// Package tracecheck replays the traces recorded through the real Dynamo crate (conformance/traces, recorded by
// `make conformance-traces` with dynamo-kv-router 1.6.1's LocalKvIndexer) through kvshm's index package, and
// checks every answer against Dynamo's recorded one, without Rust. It runs in `make test` (go test ./...).
//
// # What a trace is
//
// JSON Lines (the format is conformance/README.md's; the Python driver writes it). Line 1 is the header
// {"trace":"name","worker_id":W,"block_size":B,"max_buffer_size":M} with an optional "deviations" object: a
// deviation id of conformance/README.md's table mapped to the index (0-based, among the op lines) of the first
// op from which that documented difference may explain an answer. Then one op per line: stored, removed, cleared
// (each with its seq and dp_rank) and query (start, end, and Dynamo's answer: its WorkerKvQueryResponse JSON,
// byte for byte as serde wrote it).
//
// # How an answer is judged
//
// Each query's answer from kvshm's index.Indexer (fed the same events, with the trace's constructor arguments) is:
//
//  1. Identical: the same bytes as Dynamo's;
//  2. SameState: not the same bytes, but the small consumer model below rebuilds the same state from both;
//  3. a Deviation (its id): the trace's header marked that deviation before this query, and both answers leave
//     the consumer at the same watermarks;
//  4. otherwise Fail: the test reports the trace, the op and both answers.
//
// # The consumer model (what "same state" means here)
//
// Model is a global indexer as deepinfra's consumer builds it, reduced to what decides routing and recovery: per
// dp_rank, a map from each resident block hash to its path, the tokens hashes (Dynamo's LocalBlockHash) from the
// root to the block. A Stored event resolves its parent_hash in that map (missing: the whole event is skipped, as
// Dynamo's ParentBlockNotFound), then each block's path is its parent's path plus its tokens hash; Removed deletes
// the hashes it names; Cleared drops the rank. Recovery follows deepinfra's plan: Events are applied, a TreeDump
// first resets the rank, TooNew/InvalidRange/Error change nothing, and the watermark becomes last_event_id. Each
// answer is split per rank (each rank's events under its own key; a Cleared only for its rank, as in 1.6.1), and
// the consumer is first primed live with the trace's events before the query's start (every event so far for a
// query without a start). Two answers rebuild the same state when every rank's watermark and map are equal (the
// variants may differ: a TreeDump that rebuilds what the Events would have serves the consumer as well). The model
// ignores what the map cannot express: the order of a dump's events, its grouping into chains, and 1.6.1's
// compressed-edge bookkeeping; the Python driver (`make conformance`) judges with the crate's own consumer and tree
// instead.
//
// Failure outcomes: a trace that does not parse fails the test with the file and line; an answer kvshm gives that
// the model cannot parse is a Fail.
package tracecheck
