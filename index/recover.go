package index

import (
	"context"
	"fmt"
	"slices"
)

// Recover answers a recovery query (Dynamo 1.6.1's get_events_in_id_range, then its dump path) with the
// complete WorkerKvQueryResponse JSON. start and end are inclusive; nil means absent. The error is non-nil only
// when ctx ends while waiting for another caller's dump build.
func (ix *Indexer) Recover(ctx context.Context, start, end *uint64) (Response, error) {
	return ix.recover(ctx, start, end, rankFilter{})
}

// RecoverRank answers a recovery query with the view of one dp_rank of a stream that carries several ranks:
// Events are the suffix filtered to that rank's events plus every Cleared (a Cleared clears the whole stream;
// it is written with dpRank);
// a TreeDump holds that rank's blocks only; last_event_id is the stream's. The classification is Recover's.
// Rank dumps are built per query (not cached).
func (ix *Indexer) RecoverRank(ctx context.Context, start, end *uint64, dpRank uint32) (Response, error) {
	return ix.recover(ctx, start, end, rankFilter{on: true, dp: dpRank})
}

func (ix *Indexer) recover(ctx context.Context, start, end *uint64, f rankFilter) (Response, error) {
	ix.mu.RLock()
	shape, strict := ix.cfg.DumpShape, ix.cfg.OnLoss == LossError
	// 1. end < start: InvalidRange.
	if start != nil && end != nil && *end < *start {
		ix.mu.RUnlock()
		return Response{Kind: RespInvalidRange, JSON: AppendInvalidRangeJSON(nil, *start, *end)}, nil
	}
	// 2, 4. No start, or an empty log: dump.
	if start == nil || ix.log.count == 0 {
		ix.mu.RUnlock()
		return ix.dump(ctx, f)
	}
	first, last := ix.log.firstID(), ix.log.lastID()
	s := *start
	// 5. start > last: TooNew; it misses the lost ids at or after start (Error under LossError).
	if s > last {
		lost := ix.lostFromLocked(s)
		if len(lost) > 0 && strict {
			msg := ix.crossingMessageLocked(s)
			ix.mu.RUnlock()
			return errorResponse(msg), nil
		}
		ix.mu.RUnlock()
		endEff := last
		if end != nil {
			endEff = *end
		}
		return Response{Kind: RespTooNew, JSON: AppendTooNewJSON(nil, s, endEff, last), LastEventID: last,
			Incomplete: len(lost) > 0, Lost: lost}, nil
	}
	// 6. start < first: too old, dump. So is start == first when the log cut the front batch (a batch longer than
	// max_buffer_size): an Events answer would miss its first events.
	if s < first || (s == first && !ix.log.complete()) {
		ix.mu.RUnlock()
		return ix.dump(ctx, f)
	}
	// 7. The suffix from start (exact hit or insertion point) to the tail, end ignored. It misses the lost ids
	// at or after start that no later Cleared re-bases.
	i := ix.log.search(s)
	var lost []LostRange
	if ix.hasLost && ix.maxLost >= s {
		from := s
		if j := ix.log.lastCleared(i); j >= 0 {
			from = max(from, ix.log.hdr(j).id)
		}
		lost = ix.lostFromLocked(from)
		if len(lost) > 0 && strict {
			msg := ix.crossingMessageLocked(from)
			ix.mu.RUnlock()
			return errorResponse(msg), nil
		}
	}
	parts := ix.log.view(i, nil)
	ix.mu.RUnlock()

	buf := make([]byte, 0, len(jsEventsHead)+viewSize(parts)+40)
	buf = append(buf, jsEventsHead...)
	buf, n := appendViewEvents(buf, shape, ix.cfg.WorkerID, parts, true, f)
	buf = appendListTail(buf, last)
	return Response{Kind: RespEvents, JSON: buf, LastEventID: last, NumEvents: n, Incomplete: len(lost) > 0,
		Lost: lost}, nil
}

// lostFromLocked returns a copy of the lost ranges that reach id from or later (nil when none).
func (ix *Indexer) lostFromLocked(from uint64) []LostRange {
	if !ix.hasLost || ix.maxLost < from {
		return nil
	}
	var out []LostRange
	for _, r := range ix.lost {
		if r.Last >= from {
			out = append(out, r)
		}
	}
	return out
}

func errorResponse(msg string) Response {
	return Response{Kind: RespError, JSON: AppendErrorJSON(nil, msg)}
}

// crossingMessageLocked explains why events from start cannot be served.
func (ix *Indexer) crossingMessageLocked(start uint64) string {
	for _, r := range ix.lost {
		if r.Last >= start {
			return fmt.Sprintf("kvshm: worker %d cannot serve events from id %d: %s and no Cleared event follows",
				ix.cfg.WorkerID, start, describeLoss(r))
		}
	}
	return fmt.Sprintf("kvshm: worker %d cannot serve events from id %d: events were lost", ix.cfg.WorkerID, start)
}

// dump answers with a TreeDump: through the single-flight cache for the whole stream, built afresh for a rank
// view. Under LossError a tainted index answers Error instead.
func (ix *Indexer) dump(ctx context.Context, f rankFilter) (Response, error) {
	if f.on {
		snap, errMsg := ix.buildDump(f)
		if errMsg != "" {
			ix.dumpErrors.Add(1)
			return errorResponse(errMsg), nil
		}
		return snap.response(false), nil
	}
	for {
		ix.cmu.Lock()
		if snap := ix.cache; snap != nil {
			if hit, ok := ix.assessCacheLocked(snap); ok {
				ix.cmu.Unlock()
				return hit.response(true), nil // encoded outside cmu: concurrent hits do not wait for each other
			}
		}
		if ix.building {
			done := ix.buildDone
			ix.cmu.Unlock()
			ix.waiters.Add(1)
			select {
			case <-done:
				ix.waiters.Add(-1)
				continue
			case <-ctx.Done():
				ix.waiters.Add(-1)
				return Response{}, fmt.Errorf("wait for tree dump: %w", ctx.Err())
			}
		}
		ix.building = true
		done := make(chan struct{})
		ix.buildDone = done
		ix.cmu.Unlock()

		snap, errMsg := ix.buildDump(f)
		var js []byte
		if errMsg == "" {
			js = snap.encode()
			snap.keep(js)
		}

		ix.cmu.Lock()
		ix.building = false
		close(done)
		if errMsg != "" {
			// A failed build is not cached.
			ix.cmu.Unlock()
			ix.dumpErrors.Add(1)
			return errorResponse(errMsg), nil
		}
		if ix.gen.Load() != snap.gen {
			// Invalidated while building: the result would be stale in the cache; build again.
			ix.cmu.Unlock()
			continue
		}
		ix.cache = snap
		ix.cmu.Unlock()
		return snap.responseWith(js, false), nil
	}
}

// assessCacheLocked decides between an exact hit, an extension by the log tail and a rebuild, as 1.6.1's
// snapshot_tail does. It returns the snapshot to answer with and true on an exact hit or an extension (the
// extension becomes the cache); false when the cache was invalidated. Called with cmu held.
func (ix *Indexer) assessCacheLocked(snap *dumpSnap) (*dumpSnap, bool) {
	ix.mu.RLock()
	invalid := ix.gen.Load() != snap.gen
	var parts []logPart
	var lastB, tv uint64
	if !invalid {
		if ix.log.count == 0 {
			// Exact hit only when nothing was applied since (Dynamo would also hit when max_buffer_size is 0 and
			// the tree changed; the tree version check keeps that honest).
			if snap.last != 0 || snap.treeVersion != ix.treeVersion {
				invalid = true
			} else {
				ix.mu.RUnlock()
				ix.cacheHits.Add(1)
				return snap, true
			}
		} else {
			// Every applied event is logged once and bumps treeVersion, so the events logged since the snapshot
			// are the last treeVersion-snap.treeVersion of the log. Counting by position, not by id, includes the
			// rest of a batch whose first events (same id) the snapshot already held.
			added := ix.treeVersion - snap.treeVersion
			lastB = ix.log.lastID()
			tv = ix.treeVersion
			switch {
			case added == 0:
				ix.mu.RUnlock()
				ix.cacheHits.Add(1)
				return snap, true
			case lastB < snap.last:
				invalid = true
			case lastB-snap.base > uint64(ix.cfg.MaxBufferSize/2):
				invalid = true
			case added > uint64(ix.log.count):
				invalid = true // some of them were evicted
			default:
				i := ix.log.count - int(added)
				if ix.log.hasCleared(i) {
					invalid = true
				} else {
					parts = ix.log.view(i, nil)
				}
			}
		}
	}
	ix.mu.RUnlock()
	if invalid {
		ix.cache = nil
		return nil, false
	}
	// Extend: the cached events, then the tail with its real ids (the log's immutable chunks, shared), then the
	// new last_event_id.
	ext := *snap
	ext.parts = slices.Concat(snap.parts, parts)
	ext.events, ext.last, ext.treeVersion = snap.events+viewEvents(parts), lastB, tv
	ext.json = nil
	if snap.json != nil { // a kept answer is extended as JSON: the cached events, the tail, the new last_event_id
		body := snap.json[:len(snap.json)-dumpTailLen(snap.shape, snap.last)]
		buf := make([]byte, 0, len(body)+viewSize(parts)+64)
		buf = append(buf, body...)
		buf, _ = appendViewEvents(buf, snap.shape, snap.worker, parts, snap.events == 0, rankFilter{})
		ext.keep(appendDumpTail(buf, snap.shape, lastB))
	}
	ix.cache = &ext
	ix.cacheExtends.Add(1)
	return &ext, true
}

// dumpSnap is a TreeDump, immutable once published. Its events are kept in the event log's compact form (a
// header per event, two words per block: 16 bytes a block where the JSON takes ~85); a large dump is encoded anew
// for every answer (the cache costs a fifth of the JSON it stands for, and formatting is cheap: appendU64,
// encode), a small one also keeps its JSON (dumpJSONKeep).
type dumpSnap struct {
	// parts: the built dump (event ids = positions), then the log tails it was extended with (real ids).
	parts []logPart
	// json: the answer, kept when at most dumpJSONKeep bytes (then shared by every answer), else nil.
	json        []byte
	events      int
	worker      uint64
	base, last  uint64
	gen         uint64
	treeVersion uint64
	shape       DumpShape
	// incomplete: the tree missed events kvshm lost (tainted at the snapshot); lost names them.
	incomplete bool
	lost       []LostRange
}

// dumpJSONKeep: a cached dump whose JSON is at most this long also keeps the JSON (answers are then shared, not
// encoded: ~200 k blocks and below, where the JSON costs little next to the daemon's other memory); larger ones keep
// only the compact form.
var dumpJSONKeep = 16 << 20 // a variable for tests

// keep records js as the snapshot's answer when it is small enough (dumpJSONKeep). Only before publication.
func (s *dumpSnap) keep(js []byte) {
	if len(js) <= dumpJSONKeep {
		s.json = js
	}
}

func (s *dumpSnap) response(hit bool) Response {
	js := s.json
	if js == nil {
		js = s.encode()
	}
	return s.responseWith(js, hit)
}

// responseWith answers with js, the snapshot's JSON.
func (s *dumpSnap) responseWith(js []byte, hit bool) Response {
	r := Response{Kind: RespTreeDump, JSON: js, LastEventID: s.last, NumEvents: s.events, CacheHit: hit,
		Incomplete: s.incomplete}
	if s.incomplete {
		r.Lost = slices.Clone(s.lost)
	}
	return r
}

// treeSnapshot is a copy of the tree taken under mu, encoded after the lock is released.
type treeSnapshot struct {
	nodes  []node
	flags  []uint8
	extra  map[uint32][]uint64
	dps    []uint32 // dp of each slot
	order  []int    // the slots dumped, sorted by dp
	rank   bool     // a rank view: only the one slot in order, pruned at nodes it does not hold
	blocks int
}

// snapshotTreeLocked copies what a dump reads of the tree (the read lock held): the node arena and edge flags,
// extra worker sets, the slots' dp_ranks and the slots to dump (f's rank, or all of them by dp_rank).
func (ix *Indexer) snapshotTreeLocked(f rankFilter) treeSnapshot {
	ts := treeSnapshot{nodes: slices.Clone(ix.tree.nodes), flags: slices.Clone(ix.tree.flags), blocks: ix.tree.residentBlocks(), rank: f.on}
	if len(ix.tree.extra) > 0 {
		ts.extra = make(map[uint32][]uint64, len(ix.tree.extra))
		for k, v := range ix.tree.extra {
			ts.extra[k] = slices.Clone(v)
		}
	}
	for _, s := range ix.tree.slots {
		ts.dps = append(ts.dps, s.dp)
	}
	if f.on {
		if s, ok := ix.tree.slotOf[f.dp]; ok {
			ts.order = []int{s}
			ts.blocks = len(ix.tree.slots[s].lookup)
		} else {
			ts.order, ts.blocks = []int{}, 0
		}
		return ts
	}
	ts.order = make([]int, len(ts.dps))
	for i := range ts.order {
		ts.order[i] = i
	}
	slices.SortFunc(ts.order, func(a, b int) int { return int64cmp(int64(ts.dps[a]), int64(ts.dps[b])) })
	return ts
}

// buildDump snapshots the tree and the watermark under the read lock, then encodes the dump outside it. It
// returns an error message instead when the index is tainted under LossError.
func (ix *Indexer) buildDump(f rankFilter) (*dumpSnap, string) {
	ix.mu.RLock()
	if ix.tainted && ix.cfg.OnLoss == LossError {
		msg := fmt.Sprintf("kvshm: worker %d cannot dump its tree: %s; no Cleared event has re-based it since",
			ix.cfg.WorkerID, ix.taintMessageLocked())
		ix.mu.RUnlock()
		return nil, msg
	}
	snap := &dumpSnap{gen: ix.gen.Load(), treeVersion: ix.treeVersion, shape: ix.cfg.DumpShape, worker: ix.cfg.WorkerID}
	if ix.tainted {
		snap.incomplete = true
		snap.lost = slices.Clone(ix.taintLost)
	}
	if ix.log.count > 0 {
		snap.last = ix.log.lastID()
	}
	snap.base = snap.last
	ts := ix.snapshotTreeLocked(f)
	ix.mu.RUnlock()

	ix.dumpBuilds.Add(1)
	if ix.testBuildHook != nil {
		ix.testBuildHook()
	}
	var part logPart
	if snap.shape == DumpBlocks {
		part = ts.compactBFS()
	} else {
		part = ts.compactChains()
	}
	snap.parts, snap.events = []logPart{part}, len(part.hdrs)
	return snap, ""
}

func (ts *treeSnapshot) heldAny(n uint32) bool {
	for _, s := range ts.order {
		if ts.has(n, s) {
			return true
		}
	}
	return false
}

// sameHolders reports whether a and b are held by the same dumped slots.
func (ts *treeSnapshot) sameHolders(a, b uint32) bool {
	for _, s := range ts.order {
		if ts.has(a, s) != ts.has(b, s) {
			return false
		}
	}
	return true
}

// compactChains returns the dump as Dynamo 1.6.1's dump_tree_as_events writes it, over its compressed edges (the
// edge flags of tree.go), in the event log's compact form: breadth-first over chains. A chain starts at a live edge
// (its first block held by a dumped dp_rank, or, in a whole-stream dump, with children) and takes in the edge below
// it while both edges are held to their end by the same non-empty set of dp_ranks and by no dp_rank only partly,
// and that edge is its only live child. A chain is one Stored event per dp_rank holding it to its end (the whole
// chain), then one per dp_rank holding a prefix of its single edge (that prefix), dp_ranks ascending in each group;
// parent_hash = the block hash above the chain (null under the root); event ids from 0. The live children of the
// chain's last block follow in the queue. An edge ends early where a dp_rank holds a block without the one before
// it (possible after removals inside an edge of a multi-rank stream), so every event is a prefix-closed run.
func (ts *treeSnapshot) compactChains() logPart {
	evs := ts.planChains()
	nodes := ts.nodes
	out := logPart{hdrs: make([]logHdr, 0, len(evs)), words: make([]uint64, 0, 2*ts.blocks)}
	for i, e := range evs {
		off := len(out.words)
		s := int(e.slot)
		for n, first := e.start, true; ; first = false {
			if !first {
				n = ts.next(n)
				if !e.full && !ts.has(n, s) {
					break
				}
			}
			out.words = append(out.words, nodes[n].blockHash, nodes[n].tokensHash)
			if n == e.end {
				break
			}
		}
		out.hdrs = append(out.hdrs, logHdr{id: uint64(i), parent: nodes[e.parent].blockHash, off: uint32(off),
			n: uint32((len(out.words) - off) / 2), dp: ts.dps[s], kind: KindStored, hasParent: e.parent != rootNode})
	}
	return out
}

// chainEvent is one Stored event of a chain dump: the blocks from start to end (full), or the prefix of them that
// slot holds (!full), under the block parent.
type chainEvent struct {
	start, end, parent uint32
	slot               int32
	full               bool
}

// planChains walks the tree as appendChains describes and returns its events in order (event id = index).
func (ts *treeSnapshot) planChains() []chainEvent {
	nodes := ts.nodes
	evs := make([]chainEvent, 0, ts.blocks/4+8)
	queue := ts.appendLiveEdges(make([]uint32, 0, 64), rootNode)
	var kids []uint32
	for qi := 0; qi < len(queue); qi++ {
		start := queue[qi]
		end := ts.edgeEnd(start)
		partial := ts.partlyHeld(start, end)
		for !partial {
			kids = ts.appendLiveEdges(kids[:0], end)
			if len(kids) != 1 {
				break
			}
			c := kids[0]
			cend := ts.edgeEnd(c)
			if !ts.heldAny(cend) || !ts.sameHolders(end, cend) || ts.partlyHeld(c, cend) {
				break
			}
			end = cend
		}
		if partial {
			kids = ts.appendLiveEdges(kids[:0], end)
		}
		p := nodes[start].parent
		for _, full := range []bool{true, false} {
			for _, s := range ts.order {
				if ts.has(start, s) && ts.has(end, s) == full {
					evs = append(evs, chainEvent{start: start, end: end, parent: p, slot: int32(s), full: full})
				}
			}
		}
		queue = append(queue, kids...)
	}
	return evs
}

// edgeNext returns the block after n in n's edge, or nilNode at the end of the edge. The edge ends early before a
// block held by a dumped dp_rank that does not hold n.
func (ts *treeSnapshot) edgeNext(n uint32) uint32 {
	for c := ts.nodes[n].firstChild; c != nilNode; c = ts.nodes[c].nextSib {
		if ts.flags[c]&flagEdge == 0 {
			for _, s := range ts.order {
				if ts.has(c, s) && !ts.has(n, s) {
					return nilNode
				}
			}
			return c
		}
	}
	return nilNode
}

// next returns the block after n in a chain: the rest of n's edge, or the only live edge below it.
func (ts *treeSnapshot) next(n uint32) uint32 {
	if c := ts.edgeNext(n); c != nilNode {
		return c
	}
	for c := ts.nodes[n].firstChild; c != nilNode; c = ts.nodes[c].nextSib {
		if ts.isEdge(c) && ts.live(c) {
			return c
		}
	}
	return nilNode
}

// edgeEnd returns the last block of the edge that n begins.
func (ts *treeSnapshot) edgeEnd(n uint32) uint32 {
	for c := ts.edgeNext(n); c != nilNode; c = ts.edgeNext(n) {
		n = c
	}
	return n
}

// isEdge reports whether the child c begins an edge of the dump: flagged so, or a block edgeNext does not continue
// its parent's edge with.
func (ts *treeSnapshot) isEdge(c uint32) bool {
	return ts.flags[c]&flagEdge != 0 || ts.edgeNext(ts.nodes[c].parent) != c
}

// partlyHeld reports whether a dumped dp_rank holds the edge start..end only partly (1.6.1's worker cutoffs).
func (ts *treeSnapshot) partlyHeld(start, end uint32) bool {
	for _, s := range ts.order {
		if ts.has(start, s) && !ts.has(end, s) {
			return true
		}
	}
	return false
}

// live reports whether the dump visits the edge that n begins: n is held by a dumped slot, or (whole-stream
// dumps) its edge's last block has children, as 1.6.1 visits a node with workers or children.
func (ts *treeSnapshot) live(n uint32) bool {
	if ts.heldAny(n) {
		return true
	}
	return !ts.rank && ts.nodes[ts.edgeEnd(n)].firstChild != nilNode
}

// appendLiveEdges appends the live edges below n (n's children that begin an edge), in insertion order (they
// are linked newest first).
func (ts *treeSnapshot) appendLiveEdges(dst []uint32, n uint32) []uint32 {
	if ts.rank && n != rootNode && !ts.heldAny(n) {
		return dst // a rank view does not descend below a block the rank does not hold
	}
	k := len(dst)
	for c := ts.nodes[n].firstChild; c != nilNode; c = ts.nodes[c].nextSib {
		if (n == rootNode || ts.isEdge(c)) && ts.live(c) {
			dst = append(dst, c)
		}
	}
	slices.Reverse(dst[k:])
	return dst
}

// compactBFS returns the older dump (upstream b2b7868) in the event log's compact form: for every live node
// reachable from the root, breadth-first, one single-block Stored event per holder (dp_rank ascending),
// parent_hash = the parent's block hash (null under the root), ids from 0.
func (ts *treeSnapshot) compactBFS() logPart {
	nodes := ts.nodes
	out := logPart{hdrs: make([]logHdr, 0, ts.blocks), words: make([]uint64, 0, 2*ts.blocks)}
	queue := ts.appendLiveNodes(make([]uint32, 0, len(nodes)), rootNode)
	for qi := 0; qi < len(queue); qi++ {
		n := queue[qi]
		nd := &nodes[n]
		p := nd.parent
		for _, s := range ts.order {
			if !ts.has(n, s) {
				continue
			}
			out.hdrs = append(out.hdrs, logHdr{id: uint64(len(out.hdrs)), parent: nodes[p].blockHash,
				off: uint32(len(out.words)), n: 1, dp: ts.dps[s], kind: KindStored, hasParent: p != rootNode})
			out.words = append(out.words, nd.blockHash, nd.tokensHash)
		}
		queue = ts.appendLiveNodes(queue, n)
	}
	return out
}

// appendLiveNodes appends n's children that a blocks-shape dump visits (held by a dumped slot, or, in a
// whole-stream dump, with children), in insertion order (they are linked newest first).
func (ts *treeSnapshot) appendLiveNodes(dst []uint32, n uint32) []uint32 {
	k := len(dst)
	for c := ts.nodes[n].firstChild; c != nilNode; c = ts.nodes[c].nextSib {
		if ts.heldAny(c) || (!ts.rank && ts.nodes[c].firstChild != nilNode) {
			dst = append(dst, c)
		}
	}
	slices.Reverse(dst[k:])
	return dst
}

func (ts *treeSnapshot) has(n uint32, s int) bool {
	if s < 64 {
		return ts.nodes[n].workers&(1<<uint(s)) != 0
	}
	w := ts.extra[n]
	i := s/64 - 1
	return i < len(w) && w[i]&(1<<uint(s%64)) != 0
}
