package index

import (
	"context"
	"fmt"
	"slices"
	"strconv"
)

// Recover answers a recovery query (Dynamo's get_events_in_id_range, §5.3, then the dump path of §5.4) with the
// complete WorkerKvQueryResponse JSON. start and end are inclusive; nil means absent. The error is non-nil only
// when ctx ends while waiting for another caller's dump build.
func (ix *Indexer) Recover(ctx context.Context, start, end *uint64) (Response, error) {
	ix.mu.RLock()
	// 1. end < start: InvalidRange.
	if start != nil && end != nil && *end < *start {
		ix.mu.RUnlock()
		return Response{Kind: RespInvalidRange, JSON: AppendInvalidRangeJSON(nil, *start, *end)}, nil
	}
	// 2, 4. No start, or an empty log: dump.
	if start == nil || ix.log.count == 0 {
		ix.mu.RUnlock()
		return ix.dump(ctx)
	}
	first, last := ix.log.firstID(), ix.log.lastID()
	s := *start
	// 5. start > last: TooNew (Error when the requested ids were lost).
	if s > last {
		if ix.hasLost && ix.maxLost >= s {
			msg := ix.crossingMessageLocked(s)
			ix.mu.RUnlock()
			return errorResponse(msg), nil
		}
		endEff := last
		if end != nil {
			endEff = *end
		}
		ix.mu.RUnlock()
		return Response{Kind: RespTooNew, JSON: AppendTooNewJSON(nil, s, endEff, last), LastEventID: last}, nil
	}
	// 6. start < first: too old, dump.
	if s < first {
		ix.mu.RUnlock()
		return ix.dump(ctx)
	}
	// 7. The suffix from start to the tail; across a loss only from a later Cleared.
	i := ix.log.search(s)
	if ix.hasLost && ix.maxLost >= s {
		j := ix.log.lastClearedFrom(i, ix.maxLost)
		if j < 0 {
			msg := ix.crossingMessageLocked(s)
			ix.mu.RUnlock()
			return errorResponse(msg), nil
		}
		i = j
	}
	parts := ix.log.view(i, nil)
	ix.mu.RUnlock()

	n := viewLen(parts)
	buf := make([]byte, 0, len(jsEventsHead)+viewSize(parts)+40)
	buf = append(buf, jsEventsHead...)
	buf = appendViewEvents(buf, ix.cfg.WorkerID, parts, true)
	buf = appendListTail(buf, last)
	return Response{Kind: RespEvents, JSON: buf, LastEventID: last, NumEvents: n}, nil
}

// RecoverRank answers a recovery query with the view of one dp_rank of a stream that carries several ranks:
// Events are the suffix filtered to that rank's events plus every Cleared (a Cleared clears the whole stream);
// a TreeDump holds that rank's blocks only; last_event_id is the stream's. The classification is Recover's.
func (ix *Indexer) RecoverRank(ctx context.Context, start, end *uint64, dpRank uint32) (Response, error) {
	return ix.Recover(ctx, start, end)
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

// dump answers with a TreeDump through the single-flight cache (§5.4), or Error while the index is tainted.
func (ix *Indexer) dump(ctx context.Context) (Response, error) {
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

		snap, errMsg := ix.buildDump()

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
		return Response{Kind: RespTreeDump, JSON: snap.json, LastEventID: snap.last, NumEvents: snap.events}, nil
	}
}

// assessCacheLocked implements step 2 of §5.4 against the current log. It returns the response and true on an
// exact hit or an extension; false when the cache was invalidated. Called with cmu held.
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
	body := snap.json[:len(snap.json)-snap.tailLen()]
	buf := make([]byte, 0, len(body)+viewSize(parts)+40)
	buf = append(buf, body...)
	buf = appendViewEvents(buf, ix.cfg.WorkerID, parts, snap.events == 0)
	buf = appendListTail(buf, lastB)
	ext := &dumpSnap{json: buf, events: snap.events + viewLen(parts), base: snap.base, last: lastB, gen: snap.gen,
		treeVersion: snap.treeVersion}
	ix.cache = ext
	ix.cacheExtends.Add(1)
	return ext.response(true), true
}

func (s *dumpSnap) response(hit bool) Response {
	return Response{Kind: RespTreeDump, JSON: s.json, LastEventID: s.last, NumEvents: s.events, CacheHit: hit}
}

// tailLen is the length of `],"last_event_id":N}}` at the end of the cached JSON.
func (s *dumpSnap) tailLen() int {
	return len(jsListTail) + len(strconv.AppendUint(nil, s.last, 10)) + len(jsRespTail)
}

// treeSnapshot is a copy of the tree taken under mu, encoded after the lock is released.
type treeSnapshot struct {
	nodes  []node
	extra  map[uint32][]uint64
	dps    []uint32 // dp of each slot
	order  []int    // slots sorted by dp
	blocks int
}

// buildDump snapshots the tree and the watermark under the read lock, then encodes the BFS dump outside it.
// It returns an error message instead when the index is tainted.
func (ix *Indexer) buildDump() (*dumpSnap, string) {
	ix.mu.RLock()
	if ix.tainted {
		msg := fmt.Sprintf("kvshm: worker %d cannot dump its tree: %s; no Cleared event has re-based it since",
			ix.cfg.WorkerID, ix.taintMessageLocked())
		ix.mu.RUnlock()
		return nil, msg
	}
	snap := &dumpSnap{gen: ix.gen.Load(), treeVersion: ix.treeVersion}
	if ix.log.count > 0 {
		snap.last = ix.log.lastID()
	}
	snap.base = snap.last
	ts := treeSnapshot{nodes: slices.Clone(ix.tree.nodes), blocks: ix.tree.residentBlocks()}
	if len(ix.tree.extra) > 0 {
		ts.extra = make(map[uint32][]uint64, len(ix.tree.extra))
		for k, v := range ix.tree.extra {
			ts.extra[k] = slices.Clone(v)
		}
	}
	for _, s := range ix.tree.slots {
		ts.dps = append(ts.dps, s.dp)
	}
	ix.mu.RUnlock()

	ix.dumpBuilds.Add(1)
	if ix.testBuildHook != nil {
		ix.testBuildHook()
	}
	ts.order = make([]int, len(ts.dps))
	for i := range ts.order {
		ts.order[i] = i
	}
	slices.SortFunc(ts.order, func(a, b int) int { return int64cmp(int64(ts.dps[a]), int64(ts.dps[b])) })

	buf := make([]byte, 0, len(jsTreeDumpHead)+ts.blocks*260+64)
	buf = append(buf, jsTreeDumpHead...)
	buf, snap.events = ts.appendBFS(buf, ix.cfg.WorkerID)
	snap.json = appendListTail(buf, snap.last)
	return snap, ""
}

// appendBFS writes the breadth-first dump (§3.7): for every node reachable from the root, one single-block
// Stored event per worker (dp_rank ascending), parent_hash = the parent's block hash (null under the root), ids
// from 0.
func (ts *treeSnapshot) appendBFS(dst []byte, worker uint64) ([]byte, int) {
	nodes := ts.nodes
	queue := make([]uint32, 0, len(nodes))
	for c := nodes[rootNode].firstChild; c != nilNode; c = nodes[c].nextSib {
		queue = append(queue, c)
	}
	slices.Reverse(queue)
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
			dst = appendStoredHead(dst, worker, id, p != rootNode, nodes[p].blockHash)
			dst = appendBlock(dst, nd.blockHash, nd.tokensHash)
			dst = append(dst, jsStoredTail...)
			dst = appendEventTail(dst, ts.dps[s])
			id++
		}
		// Children are linked newest first; emit them in insertion order.
		k := len(queue)
		for c := nd.firstChild; c != nilNode; c = nodes[c].nextSib {
			queue = append(queue, c)
		}
		slices.Reverse(queue[k:])
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
