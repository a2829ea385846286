package index

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Indexer is the worker-local KV index of one worker: radix tree, bounded event log, recovery answers.
// Safe for one writer goroutine (Apply, ApplyStoredTokens, MarkLost, MarkUnknownHistory) and any number of
// concurrent readers (Recover, FindMatches, MatchTokens, Stats).
type Indexer struct {
	cfg Config

	// mu protects everything below up to the dump cache. The writer holds it exclusively while applying one
	// event; readers hold it shared while classifying, matching, or copying a snapshot.
	mu       sync.RWMutex
	tree     *tree
	log      eventLog
	seenAny  bool   // an event or loss was recorded in the current numbering
	lastSeen uint64 // highest id applied or lost in the current numbering
	// lost are the recent lost ranges of the current numbering (bounded, oldest merged); maxLost is the
	// highest id any of them covers (valid when hasLost).
	lost    []LostRange
	hasLost bool
	maxLost uint64
	// tainted: a loss or unknown history happened after the last applied Cleared; taint is its first cause
	// and taintMore the number of further causes.
	tainted   bool
	taint     LostRange
	taintMore int
	// taintLost are the losses since the last applied Cleared (bounded like lost): what a dump misses.
	taintLost   []LostRange
	treeVersion uint64 // events applied to the tree; lets the dump cache see changes an empty log hides
	c           counters

	// gen is the dump cache generation, bumped (under mu, by the writer) on Cleared, gaps, losses and id resets.
	// Read atomically by dump builders.
	gen atomic.Uint64

	// batch is the open batch (BeginBatch); owned by the writer goroutine, read and written under mu.
	batch struct {
		on   bool   // BeginBatch(id) was called and no event with another id followed
		id   uint64 // the batch's id
		seen bool   // an event of the batch was applied or rejected: the next ones with id continue it
	}

	// scratch is owned by the writer goroutine (only Apply* touch it).
	scratch []Block
	hashes  []uint64
	// src is the token vector of the Stored event being applied (KeepTokens; nil otherwise and for Apply).
	src    *tokenSrc
	srcBuf tokenSrc

	// The dump cache (upstream local.rs get_cached_or_fresh_dump). Protected by cmu.
	cmu       sync.Mutex
	cache     *dumpSnap
	building  bool
	buildDone chan struct{} // closed when the in-flight build finishes

	dumpBuilds, cacheHits, cacheExtends, dumpErrors atomic.Uint64
	waiters                                         atomic.Int64 // callers waiting for an in-flight build

	// testBuildHook, when set, runs in a dump build after the tree snapshot, outside every lock.
	testBuildHook func()
}

// counters are plain fields protected by mu (written by the writer only).
type counters struct {
	lostIDs, gaps, losses, unknowns, idResets, rejected, tokenMismatches uint64
	applied                                                              [3][NumStatuses]uint64
}

// New returns an empty index. Errors: ErrZeroBlockSize.
func New(cfg Config) (*Indexer, error) {
	if cfg.BlockSize == 0 {
		return nil, fmt.Errorf("new index for worker %d: %w", cfg.WorkerID, ErrZeroBlockSize)
	}
	if cfg.MaxBufferSize < 0 {
		cfg.MaxBufferSize = 0
	}
	ix := &Indexer{cfg: cfg, tree: newTree(), log: eventLog{max: cfg.MaxBufferSize}}
	if cfg.KeepTokens {
		ix.tree.tok = newTokenStore(cfg.BlockSize)
	}
	return ix, nil
}

// Config returns the configuration the index was created with (policies as last set by SetPolicies).
func (ix *Indexer) Config() Config {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.cfg
}

// ApplyStoredTokens applies a Stored event whose blocks come as engine block hashes (n*8 little-endian bytes)
// and tokens (u32 little-endian bytes), as they sit in a FlatBuffers event; the index computes the tokens hashes.
// Nothing is retained. A token count that does not match the block count is not refused: the complete windows
// are hashed and zipped with the block hashes (the shorter decides how many blocks are stored, as Dynamo 1.6.1
// does) and ApplyResult.TokenMismatch is set. Input errors (ErrBlockHashBytes, token bytes not a multiple of 4:
// ErrTokenCount) reject the event: it is neither applied nor logged, and its id is recorded as lost. Tree errors
// are returned after the event was logged.
func (ix *Indexer) ApplyStoredTokens(id uint64, dp uint32, hasParent bool, parent uint64, blockHashesLE, tokensLE, lora []byte, eagle bool) (ApplyResult, error) {
	mismatch, err := ix.hashStored(blockHashesLE, tokensLE, lora, eagle)
	if err != nil {
		ix.reject(id, err)
		return ApplyResult{}, fmt.Errorf("apply stored event %d: %w", id, err)
	}
	if ix.tree.tok != nil {
		ix.srcBuf = tokenSrc{le: tokensLE, bs: int(ix.cfg.BlockSize), eagle: eagle, lora: lora}
		ix.src = &ix.srcBuf
	}
	res, err := ix.apply(id, dp, KindStored, hasParent, parent, ix.scratch, nil, mismatch)
	ix.src, ix.srcBuf = nil, tokenSrc{} // nothing of the event is retained
	res.TokenMismatch = mismatch
	return res, err
}

// hashStored validates a Stored event's byte vectors and fills ix.scratch with its blocks: the block hashes
// zipped with the tokens hashes of the complete windows. It reports whether the token count differs from what
// the block count implies (n*block_size tokens, n*block_size+1 for Eagle; no tokens for no blocks).
func (ix *Indexer) hashStored(blockHashesLE, tokensLE, lora []byte, eagle bool) (bool, error) {
	if len(blockHashesLE)%8 != 0 {
		return false, fmt.Errorf("%w: %d bytes", ErrBlockHashBytes, len(blockHashesLE))
	}
	hs, err := AppendBlockHashes(ix.hashes[:0], tokensLE, ix.cfg.BlockSize, Seed(lora), eagle)
	ix.hashes = hs
	if err != nil {
		return false, err
	}
	n := len(blockHashesLE) / 8
	mismatch := TokenCountMismatch(n, len(tokensLE)/4, ix.cfg.BlockSize, eagle)
	ix.scratch = ix.scratch[:0]
	for i := range min(n, len(hs)) {
		ix.scratch = append(ix.scratch, Block{BlockHash: binary.LittleEndian.Uint64(blockHashesLE[8*i:]), TokensHash: hs[i]})
	}
	return mismatch, nil
}

// Apply applies an event whose tokens are already hashed. Tree errors (ErrParentNotFound, ErrBlockNotFound,
// ErrInvalidBlockSequence) are returned after the event was logged, as Dynamo logs rejected events too.
func (ix *Indexer) Apply(ev *Event) (ApplyResult, error) {
	switch ev.Kind {
	case KindStored, KindRemoved, KindCleared:
	default:
		err := fmt.Errorf("%w: %d", ErrInvalidKind, uint8(ev.Kind))
		ix.reject(ev.ID, err)
		return ApplyResult{}, fmt.Errorf("apply event %d: %w", ev.ID, err)
	}
	return ix.apply(ev.ID, ev.DpRank, ev.Kind, ev.HasParent, ev.Parent, ev.Blocks, ev.Hashes, false)
}

func (ix *Indexer) apply(id uint64, dp uint32, kind Kind, hasParent bool, parent uint64, blocks []Block, hashes []uint64, mismatch bool) (ApplyResult, error) {
	res := ix.applyLocked(id, dp, kind, hasParent, parent, blocks, hashes, mismatch)
	switch res.Status {
	case StatusParentNotFound:
		return res, fmt.Errorf("apply %s event %d (dp_rank %d): parent %d: %w", kind, id, dp, parent, ErrParentNotFound)
	case StatusBlockNotFound:
		return res, fmt.Errorf("apply %s event %d (dp_rank %d): %w", kind, id, dp, ErrBlockNotFound)
	case StatusInvalidBlockSequence:
		return res, fmt.Errorf("apply %s event %d (dp_rank %d): %w", kind, id, dp, ErrInvalidBlockSequence)
	}
	return res, nil
}

// applyLocked applies one event to the tree and the log under the write lock. The unlock is deferred so that a
// panic (a bug) cannot leave the index locked: the daemon contains such a panic and then marks the history
// unknown, which needs the lock again.
func (ix *Indexer) applyLocked(id uint64, dp uint32, kind Kind, hasParent bool, parent uint64, blocks []Block, hashes []uint64, mismatch bool) ApplyResult {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	res := ix.recordIDLocked(id)
	if mismatch {
		ix.c.tokenMismatches++
	}
	s := ix.tree.slot(dp)
	switch kind {
	case KindStored:
		res.Status = ix.tree.store(s, hasParent, parent, blocks, ix.src)
	case KindRemoved:
		res.Status = ix.tree.remove(s, hashes)
	case KindCleared:
		ix.tree.clearAll()
		ix.tainted, ix.taintMore = false, 0
		ix.taintLost = ix.taintLost[:0]
		ix.gen.Add(1)
	}
	if checkInvariants {
		if err := ix.tree.check(); err != nil {
			panic(fmt.Sprintf("after event %d (%s): %v", id, kind, err))
		}
	}
	ix.treeVersion++
	ix.c.applied[kind-1][res.Status]++
	ix.log.append(id, dp, kind, hasParent, parent, blocks, hashes)
	return res
}

// BeginBatch says that the events applied next with exactly this id, until an event with another id, are one
// batch (an engine's KV-event batch: Dynamo's ZMQ listener gives each event of a batch the batch's seq as its
// event id). The first of them is checked as any event (gap, id reset); the 2nd..kth are logged with the same id,
// are not id resets, and an Events answer from that id returns all of them. An event with another id closes the
// batch; so does the next BeginBatch. Only the writer goroutine calls it.
func (ix *Indexer) BeginBatch(id uint64) {
	ix.mu.Lock()
	ix.batch.on, ix.batch.id, ix.batch.seen = true, id, false
	ix.mu.Unlock()
}

// continuesBatchLocked reports whether an event with id is the 2nd..kth of the open batch, and closes the batch
// when id is another id. Called with mu held by the writer.
func (ix *Indexer) continuesBatchLocked(id uint64) bool {
	if !ix.batch.on {
		return false
	}
	if id != ix.batch.id {
		ix.batch.on = false
		return false
	}
	cont := ix.batch.seen && ix.seenAny && id == ix.lastSeen
	ix.batch.seen = true
	return cont
}

// recordIDLocked checks id against the ids seen: a gap is counted and invalidates the dump cache (the skipped
// ids were never handed to kvshm: not a loss, as in Dynamo); a backwards or duplicate id restarts the log at it.
// Called with mu held by the writer.
func (ix *Indexer) recordIDLocked(id uint64) ApplyResult {
	var res ApplyResult
	if ix.continuesBatchLocked(id) {
		return res // the 2nd..kth event of a batch: same id, same place in the numbering
	}
	switch {
	case !ix.seenAny:
		ix.seenAny = true
	case id == ix.lastSeen+1:
	case id > ix.lastSeen:
		ix.c.gaps++
		res.Gap = true
		ix.gen.Add(1)
	default:
		ix.c.idResets++
		res.IDReset = true
		ix.log.reset()
		// The lost ranges name ids of the old numbering; the tree stays tainted (if it was) until a Cleared.
		ix.lost, ix.hasLost, ix.maxLost = ix.lost[:0], false, 0
		ix.gen.Add(1)
	}
	ix.lastSeen = id
	return res
}

// addLostLocked records a lost range (or an unknown-history point) and taints the tree.
func (ix *Indexer) addLostLocked(r LostRange) {
	if !r.Unknown {
		ix.c.lostIDs += r.Last - r.First + 1
	}
	if len(ix.lost) == MaxLostRanges {
		ix.lost = mergeOldest(ix.lost)
	}
	ix.lost = append(ix.lost, r)
	ix.addTaintLostLocked(r)
	if !ix.hasLost || r.Last > ix.maxLost {
		ix.maxLost = r.Last
	}
	ix.hasLost = true
	if !ix.tainted {
		ix.tainted, ix.taint, ix.taintMore = true, r, 0
	} else {
		ix.taintMore++
	}
	ix.gen.Add(1)
}

// addTaintLostLocked remembers r among the losses since the last Cleared (what an incomplete dump misses),
// merging the two oldest beyond MaxLostRanges.
func (ix *Indexer) addTaintLostLocked(r LostRange) {
	if len(ix.taintLost) == MaxLostRanges {
		ix.taintLost = mergeOldest(ix.taintLost)
	}
	ix.taintLost = append(ix.taintLost, r)
}

// mergeOldest merges the two oldest ranges of a full list: conservative (it may name ids that were not lost),
// and crossing checks only use the upper bounds, which merging keeps.
func mergeOldest(l []LostRange) []LostRange {
	a, b := l[0], l[1]
	l[1] = LostRange{First: min(a.First, b.First), Last: max(a.Last, b.Last), Unknown: a.Unknown || b.Unknown,
		Reason: b.Reason}
	return append(l[:0], l[1:]...)
}

// MarkLost records that the events with ids first..last (inclusive) were never delivered (the producer found
// the ring full). Ids between the last id seen and first are lost too. Until a later Cleared, dumps answer Error;
// Events suffixes crossing the range answer Error unless a Cleared after it is in the log.
func (ix *Indexer) MarkLost(first, last uint64, reason string) {
	if last < first {
		first, last = last, first
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.c.losses++
	ix.markLostLocked(first, last, reason)
}

func (ix *Indexer) markLostLocked(first, last uint64, reason string) {
	if ix.seenAny && first > ix.lastSeen+1 {
		first = ix.lastSeen + 1
	}
	ix.addLostLocked(LostRange{First: first, Last: last, Reason: reason})
	if !ix.seenAny || last > ix.lastSeen {
		ix.lastSeen = last
	}
	ix.seenAny = true
}

// MarkUnknownHistory records that events may have been missed at this point without knowing their ids (the
// daemon resumed a ring, or skipped corrupt records). Until a later Cleared, dumps answer Error; Events suffixes
// that start at or before the last id seen answer Error unless a Cleared after that point is in the log.
func (ix *Indexer) MarkUnknownHistory(reason string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.c.unknowns++
	ix.markUnknownLocked(reason)
}

func (ix *Indexer) markUnknownLocked(reason string) {
	if ix.seenAny {
		ix.addLostLocked(LostRange{First: ix.lastSeen + 1, Last: ix.lastSeen, Unknown: true, Reason: reason})
		return
	}
	// Nothing seen yet: the unknown history lies before every id the log will hold; only the tree is tainted.
	r := LostRange{Unknown: true, Reason: reason}
	ix.addTaintLostLocked(r)
	if !ix.tainted {
		ix.tainted, ix.taint, ix.taintMore = true, r, 0
	} else {
		ix.taintMore++
	}
	ix.gen.Add(1)
}

// reject counts an event refused as invalid input; its id is recorded as lost (the engine's cache changed in a
// way the index does not know).
func (ix *Indexer) reject(id uint64, err error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.c.rejected++
	reason := "rejected invalid event: " + err.Error()
	if ix.continuesBatchLocked(id) {
		ix.addLostLocked(LostRange{First: id, Last: id, Reason: reason}) // an event of the batch id is lost
		return
	}
	if !ix.seenAny || id > ix.lastSeen {
		ix.markLostLocked(id, id, reason)
		return
	}
	ix.markUnknownLocked(reason)
}

// FindMatches returns the overlap scores of a tokens-hash sequence (upstream radix_tree.rs find_matches): for each
// dp_rank, the number of leading blocks it holds. Ranks with score 0 are omitted; the order is by dp_rank.
func (ix *Indexer) FindMatches(localHashes []uint64, earlyExit bool) []Score {
	ix.mu.RLock()
	scores := make([]uint32, len(ix.tree.slots))
	ix.tree.findMatches(localHashes, earlyExit, scores)
	var out []Score
	for s, v := range scores {
		if v > 0 {
			out = append(out, Score{WorkerID: ix.cfg.WorkerID, DpRank: ix.tree.slots[s].dp, Blocks: v})
		}
	}
	ix.mu.RUnlock()
	slices.SortFunc(out, func(a, b Score) int { return int64cmp(int64(a.DpRank), int64(b.DpRank)) })
	return out
}

func int64cmp(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// MatchTokens hashes tokens with the index's block size and calls FindMatches (early exit off, as KvIndexer).
func (ix *Indexer) MatchTokens(tokens []uint32, lora string, eagle bool) ([]Score, error) {
	hs, err := HashTokens(tokens, ix.cfg.BlockSize, lora, eagle)
	if err != nil {
		return nil, fmt.Errorf("match tokens: %w", err)
	}
	return ix.FindMatches(hs, false), nil
}

// Stats returns a consistent copy of the index's counters.
func (ix *Indexer) Stats() Stats {
	ix.mu.RLock()
	st := Stats{
		WorkerID:        ix.cfg.WorkerID,
		BlockSize:       ix.cfg.BlockSize,
		MaxBufferSize:   ix.cfg.MaxBufferSize,
		Buffered:        ix.log.count,
		SeenAny:         ix.seenAny,
		LastSeenID:      ix.lastSeen,
		ResidentBlocks:  ix.tree.residentBlocks(),
		Nodes:           ix.tree.live,
		Tainted:         ix.tainted,
		Incomplete:      ix.tainted,
		LostRanges:      slices.Clone(ix.lost),
		LostIDs:         ix.c.lostIDs,
		Gaps:            ix.c.gaps,
		Losses:          ix.c.losses,
		Unknowns:        ix.c.unknowns,
		IDResets:        ix.c.idResets,
		Rejected:        ix.c.rejected,
		TokenMismatches: ix.c.tokenMismatches,
		Applied:         ix.c.applied,
	}
	if ix.log.count > 0 {
		st.FirstEventID, st.LastEventID = ix.log.firstID(), ix.log.lastID()
	}
	if len(ix.taintLost) > 0 { // nil when none, however the slice got empty (a restored index compares equal)
		st.Missing = slices.Clone(ix.taintLost)
	}
	if ix.tainted {
		st.TaintReason = ix.taintMessageLocked()
	}
	for _, s := range ix.tree.slots {
		st.DpRanks = append(st.DpRanks, s.dp)
	}
	ix.mu.RUnlock()
	slices.Sort(st.DpRanks)
	st.DumpBuilds = ix.dumpBuilds.Load()
	st.DumpCacheHits = ix.cacheHits.Load()
	st.DumpCacheExtends = ix.cacheExtends.Load()
	st.DumpErrors = ix.dumpErrors.Load()
	return st
}

func describeLoss(r LostRange) string {
	switch {
	case r.Unknown && r.First == 0 && r.Last == 0:
		return fmt.Sprintf("the history before the first event is unknown (%s)", r.Reason)
	case r.Unknown:
		return fmt.Sprintf("events after id %d may be missing (%s)", r.Last, r.Reason)
	case r.First == r.Last:
		return fmt.Sprintf("event id %d was lost (%s)", r.First, r.Reason)
	}
	return fmt.Sprintf("event ids %d..%d were lost (%s)", r.First, r.Last, r.Reason)
}

func (ix *Indexer) taintMessageLocked() string {
	msg := describeLoss(ix.taint)
	if ix.taintMore > 0 {
		msg += fmt.Sprintf(" and %d later loss(es)", ix.taintMore)
	}
	return msg
}

// SetPolicies changes the loss policy and dump shape (Config.OnLoss, Config.DumpShape), for an index restored
// by ReadCheckpoint, which does not save them (they are the daemon's flags, not state). It drops the dump cache.
func (ix *Indexer) SetPolicies(onLoss LossPolicy, shape DumpShape) {
	ix.mu.Lock()
	ix.cfg.OnLoss, ix.cfg.DumpShape = onLoss, shape
	ix.gen.Add(1)
	ix.mu.Unlock()
}
