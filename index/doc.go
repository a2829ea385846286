// Package index is the worker-local KV index of kvshm: token hashing, the radix tree keyed by
// (worker_id, dp_rank), the bounded event log, recovery answers (Events, TreeDump, TooNew, InvalidRange, Error)
// with a single-flight dump cache, overlap matching, and Dynamo's exact JSON. It reproduces NVIDIA Dynamo's
// LocalKvIndexer (dynamo-kv-router, the TensorRT-LLM pin) so that a global indexer written against Dynamo recovers
// from kvshm without noticing; the reference is shared/reference/dynamo-local-indexer.md, cited below as §N.
// Pure Go, no I/O.
//
// # Usage
//
// One Indexer per worker (per producer stream). The daemon's drain goroutine feeds every event, in ring order:
//
//	ix, err := index.New(index.Config{WorkerID: w, BlockSize: 32, MaxBufferSize: 10000})
//	res, err := ix.ApplyStoredTokens(ev.Seq, ev.DpRank, ev.HasParent, ev.ParentHash,
//		ev.BlockHashes, ev.TokenIDs, ev.LoraName, ev.IsEagle) // FlatBuffer vectors, read in place
//	res, err = ix.Apply(&index.Event{ID: seq, DpRank: dp, Kind: index.KindRemoved, Hashes: hs})
//	ix.MarkLost(first, last, "ring full")                   // a LOSS record
//	resp, err := ix.Recover(ctx, start, end)                 // resp.JSON = WorkerKvQueryResponse
//
// Concurrency: an Indexer is safe for one writer goroutine (Apply, ApplyStoredTokens, MarkLost,
// MarkUnknownHistory) and any number of concurrent readers (Recover, FindMatches, MatchTokens, Stats). The
// writer holds a mutex for one event at a time; a dump copies the node arena under the read lock (a memmove of
// 40 bytes per node) and encodes JSON after releasing it, so ingest continues during a dump build. Events
// replies capture immutable log chunks under the lock and encode outside it.
//
// # Token hashing (§2)
//
// tokens_hash = XXH3-64 (github.com/zeebo/xxh3, checked against libxxhash) of the u32 little-endian token bytes
// of one window, seed 1337, or 1337 + XXH3-64(lora_name) (wrapping) for a non-empty LoRA name. Windows start
// every block_size tokens and hold block_size tokens (block_size+1 for Eagle, overlapping the next block by one);
// only complete windows are hashed. The drain path hashes the FlatBuffer's token vector in place (no copy).
// A Stored event must carry exactly n*block_size tokens for n blocks (Eagle: n*block_size+1, the lookahead);
// otherwise it is refused with ErrTokenCount or ErrEagleTooShort (where Dynamo would panic or truncate), and
// block size 0 is ErrZeroBlockSize. Invalid input never panics.
//
// # Radix tree (§3, variant A: one node per block)
//
//   - Stored: the parent is looked up in the event's own (worker, dp_rank) lookup; missing parent =
//     ErrParentNotFound and nothing is applied. Each block reuses the parent's child under its tokens hash (keeping
//     that node's block hash if it differs), else the node the lookup maps its block hash to, else a new node.
//     The worker joins each block's node; the lookup maps the block hash to it.
//   - Removed: best effort; a missing hash is remembered as ErrBlockNotFound (the first error is returned) and the
//     rest are removed. A node losing its last worker has its children detached (no cascade: the worker's
//     descendants stay in its lookup, unreachable, as in Dynamo).
//   - Cleared is worker-wide: every dp_rank of the worker loses every block (#3597); ranks keep empty lookups.
//   - find_matches: Dynamo's scores, including its count-based intersection (a child with the same number of
//     workers but different members does not narrow the active set). MatchTokens hashes, then early_exit=false.
//   - The dump is breadth-first from the root: one single-block Stored event per (node, dp_rank), parent_hash
//     = the parent's block hash (null under the root), start_position and mm_extra_info null, event ids from 0,
//     last_event_id = the real last id. Siblings appear in insertion order, dp_ranks ascending.
//
// Deliberate difference: Dynamo attaches a node found through the lookup under a second parent, which makes a
// DAG (dumped twice) or a cycle (its BFS dump never ends). Here the tree stays a tree: a lookup hit that is the
// parent or one of its ancestors is ErrInvalidBlockSequence (Dynamo: only the parent itself), and a hit still
// attached elsewhere is not reused: a new node is made, and the old node keeps the worker, exactly as when
// Dynamo overwrites a lookup entry. Only streams that store one engine block hash at two positions see this.
//
// Memory: nodes live in a slice of 40-byte structs indexed by uint32 (free list for reuse); children are found
// through one open-addressing table of node indices keyed by (parent, tokens hash), 4 bytes per slot, and
// linked as sibling lists; the worker set is a 64-bit mask over
// the index's dp_rank slots (ranks beyond 64 spill into a sparse map); per dp_rank a map sends block hash to node.
// A node lives while attached or referenced by a lookup entry (what Dynamo's reference counting gives).
//
// # Event log and recovery (§5)
//
// The log keeps the last MaxBufferSize applied events (including those the tree rejected, like Dynamo) with
// strictly increasing ids, in fixed chunks of 256 headers plus an append-only word arena per chunk: no
// allocation per event, binary search by id, and readers encode captured chunks outside the lock.
//
// Recover classifies exactly in the order of §5.3: end < start → InvalidRange; no start → dump; empty log → dump
// with last_event_id 0; start > last → TooNew (requested_end = end, or last); start < first → dump; else Events =
// the suffix from start (binary search, exact hit or insertion point) to the tail, end ignored, last_event_id
// from the same snapshot. Dumps go through the §5.4 cache: one build at a time (waiters share it), a cached
// dump is an exact hit when nothing newer was logged, is extended with the log tail (real ids, Stored or Removed)
// while the tail is covered, holds no Cleared and stays within max_buffer_size/2 events of the build, and is
// invalidated (generation bump) by Cleared, a gap, a loss or an id reset. A build invalidated while running is
// rebuilt; a failed build (Error) is not cached. A TreeDump is consistent with its last_event_id: the tree is
// copied under the same lock that reads the watermark.
//
// # Decisions where Dynamo is silent or wrong (CONTRACTS §3)
//
//   - Gaps: an id greater than last+1 records ids last+1..id-1 as lost (same as MarkLost) and invalidates the
//     cache. Dynamo only logs it; but a worker that lost events cannot describe its cache.
//   - Backwards or duplicate ids (id <= last seen): the event is applied to the tree (the engine's cache did
//     change), the log restarts at it (so ids stay increasing and binary search valid; Dynamo keeps it and breaks
//     its own search), the cache is invalidated and Stats.IDResets counts it. Lost ranges of the old numbering are
//     forgotten; the tree's taint is kept.
//   - Honest answers after loss: after MarkLost, a gap, MarkUnknownHistory or a refused event, the tree is
//     "tainted" until a later Cleared re-bases it (Cleared is worker-wide, so the tree after it is exactly what
//     the following events build). While tainted, an answer that would be a TreeDump is the Error variant naming
//     the loss. An Events suffix that crosses a lost range (some lost id >= start) is served from the last
//     Cleared after every lost id if the log holds one (#9296-style, recovery-equivalent), else Error; a start
//     among lost ids past the tail is Error rather than TooNew. Suffixes not crossing a loss are served normally.
//     MarkUnknownHistory with events already seen puts a barrier after the last id seen (suffixes starting at or
//     before it cross it); before any event it only taints the tree.
//   - An event refused as invalid input (ErrTokenCount, ErrEagleTooShort, ErrBlockHashBytes, ErrInvalidKind) is
//     neither applied nor logged, and its id counts as lost: the engine's cache changed in a way the index does
//     not know.
//   - max_buffer_size 0: nothing is logged; the dump cache also checks a tree version so it never serves a
//     stale dump (Dynamo's cache would hit forever).
//   - Cleared events are applied and logged with their dp_rank, although they clear every rank.
//   - The Error variant's strings are this package's wording (Dynamo has no such case); Error JSON strings are
//     escaped as serde_json escapes them.
//
// # JSON (§1)
//
// Hand-rolled appenders write serde_json's bytes: no whitespace, fields in declaration order, storage_tier
// "device", "cleared" as a bare string, null start_position and mm_extra_info, u64 values through
// strconv.AppendUint (never float64), PascalCase response variants. The golden files in ../testdata/json are the
// reference's literal examples byte for byte, plus one response of each variant (see its README). Response.JSON
// is read-only: a cached dump is shared between callers.
//
// # Checkpoints
//
// WriteCheckpoint saves the whole state (config, the node arena with its free list, worker masks and dp_rank slots,
// lookups, the event log, last seen id, lost ranges, taint and its reason, counters) plus the caller's opaque meta;
// ReadCheckpoint restores an index that answers every query (Recover, FindMatches, Stats) exactly as the original
// and goes on identically under the same further events. The dump cache is not saved: the first dump after a
// restore is built from the tree. The format is versioned and ends with a CRC-32C; ReadCheckpoint validates every
// count, link and id (the tree must be a forest reached exactly once through child lists) and returns a
// *CheckpointError wrapping ErrCheckpoint, never panicking. Byte diagram and the full list of checks:
// CHECKPOINT.md. Cost at 1M resident blocks: ~53 B per block, write ~0.17 s, read ~0.27 s (BenchmarkCheckpoint).
//
//	var buf bytes.Buffer
//	err := ix.WriteCheckpoint(&buf, meta)     // holds the read lock: call it with ingest stopped
//	ix2, meta, err := index.ReadCheckpoint(&buf)
//
// # Corruption and errors
//
// The index trusts nothing about event content: counts are validated, hashes are opaque, hostile block hash
// patterns (self-references, cycles, repeated hashes) give ErrInvalidBlockSequence or stale-but-bounded state,
// never a panic, a hang or unbounded growth beyond the events applied. Tree errors are returned wrapped (errors.Is
// on the sentinels) after the event was logged; Stats.Applied counts them per kind × status for metrics.
//
// # Caveats
//
// Slices passed to Apply and ApplyStoredTokens are only read during the call. Response.JSON must not be modified.
// A TreeDump extended from the cache contains events with real, non-unique, non-monotonic ids (as Dynamo's);
// consumers must ignore event_id inside a TreeDump. Attached nodes that lost all workers stay (Dynamo keeps them
// in their parent's children and reuses them with their old block hash); they are bounded by the distinct first
// blocks ever stored and are freed when their parent loses its last worker.
package index
