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
	// 6. start < first: too old, dump.
	if s < first {
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
			if resp, ok := ix.assessCacheLocked(snap); ok {
				ix.cmu.Unlock()
				return resp, nil
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
		return snap.response(false), nil
	}
}

// assessCacheLocked decides between an exact hit, an extension by the log tail and a rebuild, as 1.6.1's
// snapshot_tail does. It returns the response and true on an exact hit or an extension; false when the cache
// was invalidated. Called with cmu held.
func (ix *Indexer) assessCacheLocked(snap *dumpSnap) (Response, bool) {
	ix.mu.RLock()
	invalid := ix.gen.Load() != snap.gen
	var parts []logPart
	var lastB uint64
	if !invalid {
		if ix.log.count == 0 {
			// Exact hit only when nothing was applied since (Dynamo would also hit when max_buffer_size is 0 and
			// the tree changed; the tree version check keeps that honest).
			if snap.last != 0 || snap.treeVersion != ix.treeVersion {
				invalid = true
			} else {
				ix.mu.RUnlock()
				ix.cacheHits.Add(1)
				return snap.response(true), true
			}
		} else {
			firstB := ix.log.firstID()
			lastB = ix.log.lastID()
			switch {
			case lastB <= snap.last:
				ix.mu.RUnlock()
				ix.cacheHits.Add(1)
				return snap.response(true), true
			case lastB-snap.base > uint64(ix.cfg.MaxBufferSize/2):
				invalid = true
			case snap.last+1 < firstB:
				invalid = true
			default:
				i := ix.log.search(snap.last + 1)
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
		return Response{}, false
	}
	// Extend: the cached events, then the tail with its real ids, then the new last_event_id.
	body := snap.json[:len(snap.json)-dumpTailLen(snap.shape, snap.last)]
	buf := make([]byte, 0, len(body)+viewSize(parts)+64)
	buf = append(buf, body...)
	buf, n := appendViewEvents(buf, snap.shape, ix.cfg.WorkerID, parts, snap.events == 0, rankFilter{})
	buf = appendDumpTail(buf, snap.shape, lastB)
	ext := *snap
	ext.json, ext.events, ext.last = buf, snap.events+n, lastB
	ix.cache = &ext
	ix.cacheExtends.Add(1)
	return ext.response(true), true
}

// dumpSnap is a TreeDump: the full response JSON and what it stands for, immutable once published.
type dumpSnap struct {
	json        []byte
	events      int
	base, last  uint64
	gen         uint64
	treeVersion uint64
	shape       DumpShape
	// incomplete: the tree missed events kvshm lost (tainted at the snapshot); lost names them.
	incomplete bool
	lost       []LostRange
}

func (s *dumpSnap) response(hit bool) Response {
	r := Response{Kind: RespTreeDump, JSON: s.json, LastEventID: s.last, NumEvents: s.events, CacheHit: hit,
		Incomplete: s.incomplete}
	if s.incomplete {
		r.Lost = slices.Clone(s.lost)
	}
	return r
}

// treeSnapshot is a copy of the tree taken under mu, encoded after the lock is released.
type treeSnapshot struct {
	nodes  []node
	extra  map[uint32][]uint64
	dps    []uint32 // dp of each slot
	order  []int    // the slots dumped, sorted by dp
	rank   bool     // a rank view: only the one slot in order, pruned at nodes it does not hold
	blocks int
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
	snap := &dumpSnap{gen: ix.gen.Load(), treeVersion: ix.treeVersion, shape: ix.cfg.DumpShape}
	if ix.tainted {
		snap.incomplete = true
		snap.lost = slices.Clone(ix.taintLost)
	}
	if ix.log.count > 0 {
		snap.last = ix.log.lastID()
	}
	snap.base = snap.last
	ts := treeSnapshot{nodes: slices.Clone(ix.tree.nodes), blocks: ix.tree.residentBlocks(), rank: f.on}
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
	}
	ix.mu.RUnlock()

	ix.dumpBuilds.Add(1)
	if ix.testBuildHook != nil {
		ix.testBuildHook()
	}
	if !f.on {
		ts.order = make([]int, len(ts.dps))
		for i := range ts.order {
			ts.order[i] = i
		}
		slices.SortFunc(ts.order, func(a, b int) int { return int64cmp(int64(ts.dps[a]), int64(ts.dps[b])) })
	}

	perBlock := 100 // a chain's block; its event's head is amortized
	if snap.shape == DumpBlocks {
		perBlock = 260
	}
	buf := make([]byte, 0, len(jsTreeDumpHead)+ts.blocks*perBlock+64)
	buf = append(buf, jsTreeDumpHead...)
	if snap.shape == DumpBlocks {
		buf, snap.events = ts.appendBFS(buf, ix.cfg.WorkerID)
	} else {
		buf, snap.events = ts.appendChains(buf, ix.cfg.WorkerID)
	}
	snap.json = appendDumpTail(buf, snap.shape, snap.last)
	return snap, ""
}

// live reports whether the dump visits n: it is held by a dumped slot, or (whole-stream dumps) it has
// children, as 1.6.1 visits a node with workers or children.
func (ts *treeSnapshot) live(n uint32) bool {
	if ts.heldAny(n) {
		return true
	}
	return !ts.rank && ts.nodes[n].firstChild != nilNode
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

// appendLiveChildren appends n's live children in insertion order (they are linked newest first).
func (ts *treeSnapshot) appendLiveChildren(dst []uint32, n uint32) []uint32 {
	k := len(dst)
	for c := ts.nodes[n].firstChild; c != nilNode; c = ts.nodes[c].nextSib {
		if ts.live(c) {
			dst = append(dst, c)
		}
	}
	slices.Reverse(dst[k:])
	return dst
}

// appendChains writes the dump as Dynamo 1.6.1's dump_tree_as_events does: breadth-first over chains; a chain
// starts at a live node and goes on through its only live child while that child is held by exactly the same
// (non-empty) set of dp_ranks; each chain is one Stored event per holder (dp_rank ascending) with every block
// of the chain, parent_hash = the block hash above the chain (null under the root); ids from 0.
func (ts *treeSnapshot) appendChains(dst []byte, worker uint64) ([]byte, int) {
	nodes := ts.nodes
	queue := ts.appendLiveChildren(make([]uint32, 0, 64), rootNode)
	var kids []uint32
	id := uint64(0)
	for qi := 0; qi < len(queue); qi++ {
		start := queue[qi]
		end := start
		for {
			kids = ts.appendLiveChildren(kids[:0], end)
			if len(kids) != 1 || !ts.heldAny(kids[0]) || !ts.sameHolders(end, kids[0]) {
				break
			}
			end = kids[0]
		}
		p := nodes[start].parent
		for _, s := range ts.order {
			if !ts.has(start, s) {
				continue
			}
			if id > 0 {
				dst = append(dst, ',')
			}
			dst = appendStoredHead(dst, DumpChains, worker, id, p != rootNode, nodes[p].blockHash)
			for n, first := start, true; ; n, first = ts.onlyLiveChild(n), false {
				if !first {
					dst = append(dst, ',')
				}
				dst = appendBlock(dst, nodes[n].blockHash, nodes[n].tokensHash)
				if n == end {
					break
				}
			}
			dst = append(dst, jsStoredTail...)
			dst = appendEventTail(dst, ts.dps[s])
			id++
		}
		queue = append(queue, kids...)
	}
	return dst, int(id)
}

// onlyLiveChild returns the live child of a chain node that is not the chain's end (it has exactly one).
func (ts *treeSnapshot) onlyLiveChild(n uint32) uint32 {
	for c := ts.nodes[n].firstChild; c != nilNode; c = ts.nodes[c].nextSib {
		if ts.live(c) {
			return c
		}
	}
	return nilNode
}

// appendBFS writes the older dump (upstream b2b7868): for every live node reachable from the root,
// breadth-first, one single-block Stored event per holder (dp_rank ascending), parent_hash = the parent's block
// hash (null under the root), ids from 0.
func (ts *treeSnapshot) appendBFS(dst []byte, worker uint64) ([]byte, int) {
	nodes := ts.nodes
	queue := ts.appendLiveChildren(make([]uint32, 0, len(nodes)), rootNode)
	id := uint64(0)
	for qi := 0; qi < len(queue); qi++ {
		n := queue[qi]
		nd := &nodes[n]
		p := nd.parent
		for _, s := range ts.order {
			if !ts.has(n, s) {
				continue
			}
			if id > 0 {
				dst = append(dst, ',')
			}
			dst = appendStoredHead(dst, DumpBlocks, worker, id, p != rootNode, nodes[p].blockHash)
			dst = appendBlock(dst, nd.blockHash, nd.tokensHash)
			dst = append(dst, jsStoredTail...)
			dst = appendEventTail(dst, ts.dps[s])
			id++
		}
		queue = ts.appendLiveChildren(queue, n)
	}
	return dst, int(id)
}

func (ts *treeSnapshot) has(n uint32, s int) bool {
	if s < 64 {
		return ts.nodes[n].workers&(1<<uint(s)) != 0
	}
	w := ts.extra[n]
	i := s/64 - 1
	return i < len(w) && w[i]&(1<<uint(s%64)) != 0
}
