// Package index is the worker-local KV index of kvshm: token hashing, the radix tree of one stream (one producer,
// one seq space: all its dp_ranks), the bounded event log, recovery answers (Events, TreeDump, TooNew,
// InvalidRange, and Error under the strict loss policy) with a single-flight dump cache, per-rank views, overlap
// matching, and Dynamo's exact JSON. It reproduces the LocalKvIndexer of NVIDIA Dynamo's crate dynamo-kv-router
// 1.6.1 (crates.io; source at https://docs.rs/crate/dynamo-kv-router/1.6.1/source/src/: indexer/local.rs, indexer/radix_tree.rs,
// protocols.rs, cited below by file and function) so that a global indexer written against Dynamo recovers from
// kvshm without noticing; DumpBlocks keeps the wire of the older upstream (commit b2b7868). Pure Go, no I/O.
//
// # Usage
//
// One Indexer per stream. The daemon's drain goroutine feeds every event, in ring order:
//
//	ix, err := index.New(index.Config{WorkerID: w, BlockSize: 32, MaxBufferSize: 10000}) // best effort, chains
//	res, err := ix.ApplyStoredTokens(ev.Seq, ev.DpRank, ev.HasParent, ev.ParentHash,
//		ev.BlockHashes, ev.TokenIDs, ev.LoraName, ev.IsEagle) // FlatBuffer vectors, read in place
//	res, err = ix.Apply(&index.Event{ID: seq, DpRank: dp, Kind: index.KindRemoved, Hashes: hs})
//	ix.MarkLost(first, last, "ring full")                   // a LOSS record
//	resp, err := ix.Recover(ctx, start, end)                 // resp.JSON = WorkerKvQueryResponse
//	resp, err = ix.RecoverRank(ctx, start, end, r)           // the view of dp_rank r of a multi-rank stream
//	if resp.Incomplete { report(resp.Lost) }                 // headers, metrics, logs: never in the JSON
//
// Concurrency: an Indexer is safe for one writer goroutine (Apply, ApplyStoredTokens, MarkLost,
// MarkUnknownHistory, SetPolicies) and any number of concurrent readers (Recover, RecoverRank, FindMatches,
// MatchTokens, Stats). The writer holds a mutex for one event at a time; a dump copies the node arena under the
// read lock (a memmove of 40 bytes per node) and plans and encodes after releasing it, so ingest continues during
// a dump build. A dump is planned into the event log's compact form (a header per event, two words per block) and
// then encoded: sized exactly first (digit counts), then written in place, by up to four goroutines (GOMAXPROCS)
// for 16 Ki blocks or more, since formatting the u64s is most of its cost (appendU64: 8-digit groups converted
// inside one word, ~5x strconv.AppendUint). Events replies capture immutable log chunks under the lock and encode
// outside it.
//
// # Token hashing (1.6.1 compute_block_hash_for_seq)
//
// tokens_hash = XXH3-64 (github.com/zeebo/xxh3, checked against libxxhash) of the u32 little-endian token bytes
// of one window, seed 1337, or 1337 + XXH3-64(lora_name) (wrapping) for a non-empty LoRA name. Windows start
// every block_size tokens and hold block_size tokens (block_size+1 for Eagle, overlapping the next block by one);
// only complete windows are hashed. The drain path hashes the FlatBuffer's token vector in place (no copy).
//
// The exact rule for a Stored event with n block hashes and t tokens (the conformance reference implements the
// same): w = the number of complete windows (t / block_size; Eagle: (t-1) / block_size, 0 when t = 0); the event
// stores min(n, w) blocks, block i pairing block_hashes[i] with the tokens hash of window i (a zip: the shorter
// decides; the parent hash is unchanged). Nothing is refused: a count other than n*block_size (Eagle:
// n*block_size+1; no tokens for no blocks) sets ApplyResult.TokenMismatch and counts Stats.TokenMismatches, and
// the event is applied and logged with the blocks it kept (so its Events JSON lists those). Only bytes that are no
// tokens at all are refused (ErrTokenCount: token bytes not a multiple of 4; ErrBlockHashBytes), and block size 0
// is ErrZeroBlockSize. Invalid input never panics.
//
// # Radix tree (one node per block, 1.6.1's edges emulated)
//
//   - Stored: the parent is looked up in the event's own (worker, dp_rank) lookup; missing parent =
//     ErrParentNotFound and nothing is applied. Each block reuses the parent's child under its tokens hash; while
//     a worker holds that child it keeps its first block hash (1.6.1 matches children by tokens hash and keeps
//     the edge's hash), and the lookup maps the event's block hash to it. A child that no worker holds counts as
//     absent (1.6.1 has pruned it) and, when a node is needed, is reused in place with the new block hash (the
//     stale-block-hash decision, docs/decisions.md: store 101, store 102 under it, remove 102, store 103 with
//     102's tokens: the dump says 101 -> 103; testdata/stale.txt). Else a node the lookup maps the block hash to,
//     if detached, is re-attached; else a new node. The worker joins each block's node.
//   - Removed: best effort; a missing hash is remembered as ErrBlockNotFound (the first error is returned) and the
//     rest are removed. A node losing its last worker has its children detached, except an unheld block that
//     continues its edge (below).
//   - Cleared clears the stream (its scope: the Cleared-scope decision, docs/decisions.md): every dp_rank of the
//     stream loses every block. For a per-rank stream that is 1.6.1's rule (Cleared clears the event's (worker, dp_rank)); for a stream that
//     carries all ranks (TensorRT-LLM's apply_cleared(seq) without a rank: the engine dropped its whole cache) it
//     is worker-wide, where 1.6.1 would clear only the event's dp_rank (a documented conformance deviation).
//   - find_matches: Dynamo's scores, including its count-based intersection (a child with the same number of
//     workers but different members does not narrow the active set). MatchTokens hashes, then early_exit=false.
//
// Edges. 1.6.1's tree is compressed: a node holds a run of blocks (an edge) and each worker covers a prefix of
// it; its dump writes one Stored event per edge run and worker. To group blocks exactly as it does, this tree
// keeps two flags per node (tree.flags): "begins an edge" and "internal" (an edge that has had edges attached
// below it is never extended again), maintained as 1.6.1's apply_stored changes its edges: a store under a block
// inside an edge splits the edge there unless its blocks only re-cover (same tokens and hashes) or extend (the
// edge's remaining blocks, then more, on a non-internal edge) that edge; a new block continues its parent's edge
// when the parent ends a non-internal edge the worker holds to its end, else begins an edge (and the parent's edge
// becomes internal). Unheld blocks stay in their edge, as 1.6.1 keeps uncovered positions, and decide later
// splits the same way.
//
// Deliberate difference (a tree stays a tree): a lookup hit that is the parent or one of its ancestors is
// ErrInvalidBlockSequence (the blocks before it stay applied; 1.6.1 checks only a block equal to the parent
// hash), and a hit still attached elsewhere is not reused: a new node is made and the old node keeps the worker,
// as when a lookup entry is overwritten. Only streams that store one engine block hash at two positions see this.
//
// Memory: nodes live in a slice of 40-byte structs indexed by uint32 (free list for reuse) plus one flag byte;
// children are found through one open-addressing table of node indices keyed by (parent, tokens hash), 4 bytes per
// slot, and linked as sibling lists; the worker set is a 64-bit mask over the index's dp_rank slots (ranks beyond
// 64 spill into a sparse map); per dp_rank a map sends block hash to node. A node lives while attached or
// referenced by a lookup entry. Attached nodes no worker holds are kept (bounded by the distinct children ever
// stored) and reused as above; the dumps skip them.
//
// # TreeDump shapes
//
// DumpChains (default; 1.6.1's dump_tree_as_events): breadth-first over chains. A chain starts at a live edge
// (its first block held by a dumped dp_rank, or, in a whole-stream dump, with children below its end) and takes in
// the edge below it while both are held to their end by the same non-empty set of dp_ranks, no dp_rank holds
// either only partly, and that edge is its only live child. A chain is one Stored event per dp_rank holding it to
// its end (all its blocks), then one per dp_rank holding a prefix of its single edge (that prefix), dp_ranks
// ascending in each group; parent_hash = the block hash above the chain (null under the root), start_position and
// mm_extra_info null, event ids from 0; the live edges below the chain's last block follow in the queue. (An edge
// is cut for the dump where a dp_rank holds a block but not the one before it, which only removals inside an edge
// of a multi-rank stream leave, so every event is prefix-closed.) The TreeDump ends with "reset_scope":"all" and
// every RouterEvent carries "residency_domain":"worker" (1.6.1's RouterEvent::new). DumpBlocks (b2b7868): one
// single-block Stored event per (node, dp_rank), breadth-first, no residency_domain or reset_scope anywhere
// (Events replies included). Both: siblings in insertion order, last_event_id = the real last id.
//
// # Event log and recovery
//
// The log keeps the last MaxBufferSize applied events (including those the tree rejected, like Dynamo) with
// non-decreasing ids, in fixed chunks of 256 headers plus an append-only word arena per chunk: no
// allocation per event, binary search by id, and readers encode captured chunks outside the lock. Ids need not be
// consecutive: a gap (ids the producer never handed to kvshm, e.g. vLLM's skipped BlockStored events) is not a
// loss; it is counted (ApplyResult.Gap, Stats.Gaps) and invalidates the dump cache, as in 1.6.1.
//
// Batches (BeginBatch). An engine publishes KV events in batches under one sequence number, and Dynamo's ZMQ
// listener gives every event of a batch the batch's seq as its event id, so 1.6.1's LocalKvIndexer holds several
// events with one id. kvshm numbers the same way (recovery ids and ZMQ seqs are one numbering): BeginBatch(id)
// opens a batch, and the events that follow with exactly that id are logged with it; only the first is checked
// against the ids seen (gap, id reset), the 2nd..kth are neither. So log ids are non-decreasing, equal only inside
// a batch; an Events answer from an id returns every event of that batch (the suffix starts at the first event
// with id >= start, as 1.6.1 returns every buffered event in range). An event with another id, or the next
// BeginBatch, closes the batch; without BeginBatch an equal id is still an id reset. An invalid event inside a
// batch records the batch's id as lost and does not split the batch. The log evicts a batch whole (all the events
// with the front's id), so it always starts at a batch boundary and an Events answer never starts inside a batch
// (it may hold fewer than MaxBufferSize events); a query from an evicted batch's id is older than the log: a dump.
// Only a batch longer than MaxBufferSize is cut (its oldest events go); a query from its id is then answered with a
// dump, and a checkpoint does not save the cut batch (a restored index dumps where the original could say TooNew,
// until its next event). A reader can run between two events of a batch (the writer holds the lock
// per event, as 1.6.1's listener applies a batch event by event): an Events answer or a dump then has part of the
// batch and the batch's id as last_event_id. The dump cache counts the events logged after a snapshot by position
// (treeVersion), not by id, so a cached dump is extended with the rest of such a batch, never served without it;
// a consumer that recovered from a partial batch's id asks from id+1 next and misses the rest, as with 1.6.1. A
// restored checkpoint has no open batch.
//
// Recover classifies as 1.6.1's classify_query: end < start → InvalidRange; no start → dump; empty log → dump
// with last_event_id 0; start > last → TooNew (requested_end = end, or last); start < first → dump; else Events =
// the suffix from start (binary search, exact hit or insertion point) to the tail, end ignored, last_event_id from
// the same snapshot. (1.6.1 starts the suffix at its last all-domain Cleared; every event here carries
// residency_domain "worker", as 1.6.1's own events do, so no Cleared is all-domain and the whole suffix is sent.)
// Dumps go through 1.6.1's cache (kept in the compact form, 16 B a block; a dump of at most 16 MiB of JSON also
// keeps its JSON, shared by the answers; a larger one is encoded per answer, see Memory below): one build at a
// time (waiters share it), a cached dump is an exact hit when nothing
// was logged since (counted by position, see Batches), is extended with the log tail (real ids, Stored or Removed) while the tail is covered, holds no
// Cleared and stays within max_buffer_size/2 events of the build, and is invalidated (generation bump) by Cleared,
// a gap, a loss, an id reset or SetPolicies. A build invalidated while running is rebuilt (1.6.1 returns it
// uncached); a failed build (Error) is not cached. A TreeDump is consistent with its last_event_id: the tree is
// copied under the same lock that reads the watermark.
//
// RecoverRank(start, end, r) is the view of dp_rank r of a stream that carries several (the Cleared-scope
// decision): the same classification on the stream's log; Events = the suffix filtered to r's events plus every Cleared (written
// with dp_rank r: the stream's Cleared clears r too); TreeDump = r's blocks only (the chains of the nodes r holds,
// not descending below a node r does not hold), built per query (not cached); last_event_id is the stream's.
//
// # Losses (the best-state-on-loss decision, docs/decisions.md)
//
// A loss is an event kvshm itself failed to apply: MarkLost (the producer found the ring full), MarkUnknownHistory
// (a resumed ring, a corrupt record; a barrier after the last id seen, or before every id when nothing was seen),
// or an event refused as invalid input (ErrTokenCount, ErrBlockHashBytes, ErrInvalidKind: neither applied nor
// logged; its id is lost). Losses taint the tree until a later Cleared re-bases it (the tree after a Cleared is
// exactly what the following events build). The lost ranges of the current numbering are kept (newest
// MaxLostRanges, the oldest merged).
//
// LossBestEffort (default): every answer is what 1.6.1 answers from the events the index applied (TreeDump of the
// current tree, Events across lost ids as across a gap, TooNew), and Response.Incomplete says that it misses lost
// events, with Response.Lost naming them: a TreeDump while tainted (Lost = the losses since the last Cleared); an
// Events suffix or TooNew from start when some lost id is at or after start and no Cleared in the suffix follows
// it (Lost = those ranges). The JSON never says it: the daemon reports it (headers, metrics, logs, stats).
// LossError: exactly those answers are the Error variant naming the first loss instead (kvshm's wording; Dynamo has
// no such case), and complete answers are the same as under LossBestEffort.
//
// # Deviations from 1.6.1, with reasons
//
//   - Order inside a dump: sibling edges and the dp_ranks of one chain come, in 1.6.1, in hashbrown iteration
//     order (a function of FxHash and each table's history); here insertion order and dp_rank ascending. The
//     events, their grouping and the rebuilt state are the same (a differential run of random engine-like streams,
//     1 to 3 ranks, leaf-first eviction, through the real LocalKvIndexer: every Events answer byte-identical,
//     every TreeDump equal up to event order). Consumers must not depend on that order.
//   - Removing a block in the middle of one of its edges, 1.6.1 also drops the worker from the rest of that edge
//     (and forgets those hashes: a later Removed of them is BlockNotFound); here only the named block is removed,
//     and its descendants are detached when no worker holds it. Dumps can differ in state only when an engine
//     evicts a block before its descendants (the differential run above, with such evictions: 4 of 2393 answers
//     for one rank, 42 of 2438 for two). Kept on purpose: the blocks the engine still holds stay described (1.6.1
//     marks its own behaviour there TODO(CORRECTNESS) in apply_removed).
//   - A store whose tokens reach a block no worker holds inside an edge (an uncovered block after a held one,
//     matched by tokens from the edge's start, e.g. a root store of the whole sequence again): 1.6.1 keeps the
//     edge's old block hash (the stale block hash by another path); here the new hash, always.
//   - A store whose parent hash names a second copy of known tokens (a hash the lookup maps to a node under
//     another hash): applied here; 1.6.1 answers ParentBlockNotFound and drops the child.
//   - Backwards or duplicate ids (id <= last seen, outside a batch): the event is applied to the tree (the engine's cache did
//     change), the log restarts at it (so ids stay non-decreasing and binary search valid; 1.6.1 keeps it and breaks
//     its own search), the cache is invalidated and Stats.IDResets counts it. Lost ranges of the old numbering are
//     forgotten; the tree's taint is kept.
//   - max_buffer_size 0: nothing is logged; the dump cache also checks a tree version so it never serves a stale
//     dump (1.6.1's cache would hit forever).
//   - Cleared of a multi-rank stream clears every rank (the Cleared-scope decision, above).
//   - Batches (several events under one id): an Events answer from a batch's id starts at its first event; 1.6.1
//     binary-searches equal ids ("any one of the matches") and may answer from inside the batch. The log evicts
//     a batch whole; 1.6.1's buffer evicts event by event and then answers from the rest of a cut batch. Both
//     would have a consumer miss events the engine applied (see Batches above).
//
// # JSON
//
// Hand-rolled appenders write serde_json's bytes: no whitespace, fields in declaration order, storage_tier
// "device", residency_domain "worker" (DumpChains), "cleared" as a bare string, null start_position and
// mm_extra_info, u64 values in decimal (appendU64, byte-identical to strconv.AppendUint; never float64),
// PascalCase response variants, TreeDump's reset_scope "all" (DumpChains). Error JSON strings are escaped as serde_json escapes them. The golden files in
// ../testdata/json were written by dynamo-kv-router 1.6.1 itself and are checked byte for byte (older wire:
// ../testdata/json/blocks; see its README). Response.JSON is read-only: a cached dump is shared between callers.
//
// # Tokens and snapshots (KeepTokens; tokens.go, snapshot.go)
//
// With Config.KeepTokens (kvshmd: publishing streams) the index keeps every node's token window (block_size or,
// Eagle, block_size+1 tokens) and LoRA name, set by every store of the block: (block_size+2)*4 bytes per node in
// an arena of 1024-slot chunks allocated as nodes reach them, so it grows without copying what it holds (a flat
// slice regrown by append copied it all inside an apply: publish stalls of 25-50 ms at 100k-200k blocks) (72 B at
// block size 16; BenchmarkSnapshot), ~+45% on a 32-block ApplyStoredTokens
// (BenchmarkApplyStored keep_tokens). Snapshot copies the tree and the token arena under the read lock (8 ms at
// 100 k blocks) with the last id; TokenSnapshot.Events walks the copy outside every lock as BlockStored events in
// 1.6.1's dump chains (parents first per dp_rank), split where the LoRA name or Eagle form changes or two Eagle
// windows do not overlap, so a consumer hashing the token ids rebuilds the same blocks
// (TestSnapshotRebuildsTheTree). A block applied without tokens (Apply) has unknown tokens: Events returns
// ErrTokensUnknown; Snapshot without KeepTokens is ErrNoTokens; EnableTokens turns keeping on for later blocks.
//
// # Checkpoints
//
// WriteCheckpoint saves the whole state (config, the node arena with its free list, worker masks and dp_rank slots,
// lookups, the event log, last seen id, lost ranges, taint and the losses since the last Cleared, counters) plus
// the caller's opaque meta; ReadCheckpoint restores an index that answers every query (Recover, FindMatches, Stats)
// exactly as the original and goes on identically under the same further events. The dump cache and the policies
// (OnLoss, DumpShape: flags, not state; SetPolicies sets them) are not saved: the first dump after a restore is
// built from the tree. The format is versioned (3; versions 1 and 2 are still read) and ends with a CRC-32C;
// ReadCheckpoint validates every count, link and id (the tree must be a forest reached exactly once through child
// lists) and returns a *CheckpointError wrapping ErrCheckpoint, never panicking. Version 3 adds the token windows
// (KeepTokens); version 2 restores an index without tokens. Byte diagram and the full list of
// checks: CHECKPOINT.md. Cost at 1M resident blocks: ~53 B per block, write ~0.17 s, read ~0.27 s
// (BenchmarkCheckpoint).
//
//	var buf bytes.Buffer
//	err := ix.WriteCheckpoint(&buf, meta)     // holds the read lock: call it with ingest stopped
//	ix2, meta, err := index.ReadCheckpoint(&buf)
//	ix2.SetPolicies(index.LossError, index.DumpBlocks) // if the daemon runs with non-default flags
//
// # Corruption and errors
//
// The index trusts nothing about event content: counts are validated, hashes are opaque, hostile block hash
// patterns (self-references, cycles, repeated hashes) give ErrInvalidBlockSequence or stale-but-bounded state,
// never a panic, a hang or unbounded growth beyond the events applied. Tree errors (ErrParentNotFound,
// ErrBlockNotFound, ErrInvalidBlockSequence) are returned wrapped (errors.Is on the sentinels) after the event was
// logged; they are not losses (Dynamo applies and logs the same events the same way). Input errors
// (ErrTokenCount, ErrBlockHashBytes, ErrInvalidKind) refuse the event and record its id as lost. Stats.Applied
// counts applied events per kind × status for metrics.
//
// # Caveats
//
// Memory per resident block (scale bench, root chains of 256 blocks, measured on kvshmd's heap): the index 96 B (a
// 40-byte node, its flag byte, the children table and the per-rank lookup map: BenchmarkHeapPerBlock); the cached
// dump 16 B (its JSON, ~85 B, is kept only up to 16 MiB, i.e. ~200 k blocks; before this the JSON was kept at
// every size, in a buffer sized 100 B a block); the event log at most MaxBufferSize events of 16 B a block plus
// a 32-byte header (10,000 events of 32 blocks: ~5 MB per stream, whatever the tree's size). Transient, per dump
// answer: the node copy (41 B a block), the plan (20 B an event) and the answer's JSON (~85 B a block), garbage
// once written. What a process holds on top (collector headroom, free pages not yet returned) is the daemon's
// policy: cmd/kvshmd's --gc-headroom and daemon/memory.go.
//
// Slices passed to Apply and ApplyStoredTokens are only read during the call. Response.JSON must not be modified;
// Response.Lost belongs to the caller. A TreeDump extended from the cache contains events with real, non-unique,
// non-monotonic ids (as 1.6.1's); consumers must ignore event_id inside a TreeDump.
package index
