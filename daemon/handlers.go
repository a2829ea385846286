package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/shm"
)

// dispatch serves one well-framed request. Errors that are not *replyError become internal errors.
func (s *Server) dispatch(cc *conn, kind Kind, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.QueryTimeout)
	defer cancel()
	switch kind {
	case KindAttach:
		var req AttachRequest
		if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		rep, err := s.attach(cc, req)
		if err != nil {
			return nil, err
		}
		return json.Marshal(rep)
	case KindDetach:
		var req WorkerRequest
		if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		if req.WorkerID == nil {
			return nil, errorf(CodeBadRequest, "detach needs a worker_id")
		}
		return []byte("{}"), s.detach(cc, *req.WorkerID, req.DpRank)
	case KindForget:
		var req WorkerRequest
		if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		if req.WorkerID == nil {
			return nil, errorf(CodeBadRequest, "forget needs a worker_id")
		}
		return []byte("{}"), s.forget(ctx, *req.WorkerID, req.DpRank)
	case KindEvents, KindDump:
		var req EventsRequest
		if kind == KindDump {
			var wr WorkerRequest
			if err := decodeStrict(body, &wr); err != nil {
				return nil, errorf(CodeBadRequest, "%v", err)
			}
			req.WorkerID, req.DpRank = wr.WorkerID, wr.DpRank
		} else if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		resp, _, err := s.recover(ctx, req.WorkerID, req.DpRank, req.Start, req.End)
		if err != nil {
			return nil, err
		}
		return resp.JSON, nil
	case KindStats:
		var req WorkerRequest
		if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		return s.stats(ctx, req.WorkerID, req.DpRank)
	case KindMatch:
		var req MatchRequest
		if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		return s.match(ctx, req)
	case KindHealth:
		var req struct{}
		if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		return json.Marshal(HealthReply{Status: "ok", Version: s.cfg.Version, Streams: len(s.streamList())})
	}
	return nil, errorf(CodeUnknownKind, "unknown request kind %d", kind)
}

// selectStream finds the stream a query means (see resolveLocked); a rank view of an ALL stream selects the ALL
// stream.
func (s *Server) selectStream(worker *uint64, rank *uint32) (target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resolveLocked(worker, rank)
}

// wireRanges converts the index's lost ranges to the STATS wire type (never nil: JSON [] not null).
func wireRanges(rs []index.LostRange) []LostRange {
	out := make([]LostRange, 0, len(rs))
	for _, lr := range rs {
		out = append(out, LostRange{First: lr.First, Last: lr.Last, Unknown: lr.Unknown, Reason: lr.Reason})
	}
	return out
}

// current returns the stream's index and attachment (nil when detached).
func (st *stream) current() (*index.Indexer, *attachment) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ix, st.att
}

// caughtUp returns the stream's index after the drain goroutine applied everything published before the call
// (read-your-writes for a producer that publishes then queries).
func (st *stream) caughtUp(ctx context.Context) (*index.Indexer, error) {
	ix, a := st.current()
	if a != nil {
		if err := a.sync(ctx); err != nil {
			return nil, errorf(CodeBusy, "%s: drain did not catch up with the ring: %v", st.key, err)
		}
		ix, _ = st.current()
	}
	return ix, nil
}

var resultNames = map[index.RespKind]string{
	index.RespEvents: "events", index.RespTreeDump: "tree_dump", index.RespTooNew: "too_new",
	index.RespInvalidRange: "invalid_range", index.RespError: "error",
}

// recover answers a recovery query (EVENTS, DUMP, /kv_recover) with the index's WorkerKvQueryResponse: the whole
// stream, or the rank view of an ALL stream (Indexer.RecoverRank) when rank selects one. An Incomplete answer is
// counted (kvshm_incomplete_answers_total) and logged, rate-limited per stream. The stream is returned for the
// caller's log and headers.
func (s *Server) recover(ctx context.Context, worker *uint64, rank *uint32, start, end *uint64) (index.Response, *stream, error) {
	tg, err := s.selectStream(worker, rank)
	if err != nil {
		return index.Response{}, nil, err
	}
	st := tg.st
	t0 := time.Now()
	ix, err := st.caughtUp(ctx)
	if err != nil {
		return index.Response{}, st, err
	}
	var resp index.Response
	if tg.view != nil {
		resp, err = ix.RecoverRank(ctx, start, end, *tg.view)
	} else {
		resp, err = ix.Recover(ctx, start, end)
	}
	wl, rl := st.labels()
	if err != nil {
		s.m.recoveries.WithLabelValues(wl, rl, "failed").Inc()
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return resp, st, errorf(CodeBusy, "%s: recovery did not finish: %v", st.key, err)
		}
		return resp, st, fmt.Errorf("%s: recover: %w", st.key, err)
	}
	if uint64(len(resp.JSON))+lengthCounted > MaxResponse {
		s.m.recoveries.WithLabelValues(wl, rl, "failed").Inc()
		return index.Response{}, st, errorf(CodeTooLarge, "%s: response of %d bytes exceeds the 1 GiB frame cap", st.key, len(resp.JSON))
	}
	res := resultNames[resp.Kind]
	if res == "" {
		res = "unknown"
	}
	s.m.recoveries.WithLabelValues(wl, rl, res).Inc()
	s.m.recoverySeconds.WithLabelValues(wl, rl).Observe(time.Since(t0).Seconds())
	s.m.recoveryBytes.WithLabelValues(wl, rl).Observe(float64(len(resp.JSON)))
	if resp.Incomplete {
		s.m.incomplete.WithLabelValues(wl, rl).Inc()
		if n, ok := st.incompleteLog.allow(time.Now()); ok {
			args := append(st.key.logAttrs(), "answer", resp.Kind.String(), "lost", lostHeader(resp.Lost), "suppressed", n)
			if tg.view != nil {
				args = append(args, "rank_view", *tg.view)
			}
			s.log.Warn("recovery answer is incomplete: it misses events kvshm lost (best effort, --on-loss=best-effort)", args...)
		}
	}
	return resp, st, nil
}

func (s *Server) match(ctx context.Context, req MatchRequest) ([]byte, error) {
	tg, err := s.selectStream(req.WorkerID, req.DpRank)
	if err != nil {
		return nil, err
	}
	ix, err := tg.st.caughtUp(ctx)
	if err != nil {
		return nil, err
	}
	lora := ""
	if req.LoraName != nil {
		lora = *req.LoraName
	}
	scores, err := ix.MatchTokens(req.Tokens, lora, req.IsEagle)
	if err != nil {
		return nil, errorf(CodeBadRequest, "match: %v", err)
	}
	rep := MatchReply{Scores: make([]MatchScore, 0, len(scores))}
	for _, sc := range scores {
		rep.Scores = append(rep.Scores, MatchScore{WorkerID: sc.WorkerID, DpRank: sc.DpRank, Blocks: sc.Blocks})
	}
	return json.Marshal(rep)
}

// stats answers STATS: every stream, or those of worker, or (with rank) for each worker the per-rank stream of
// that rank or else its ALL stream. An empty selection is not_found; null selects every stream (no conflict).
func (s *Server) stats(ctx context.Context, worker *uint64, rank *uint32) ([]byte, error) {
	var list []*stream
	for _, st := range s.streamList() {
		k := st.key
		if worker != nil && k.worker != *worker {
			continue
		}
		if rank != nil && (!k.perRank || k.rank != *rank) {
			if k.perRank {
				continue
			}
			s.mu.Lock()
			_, own := s.streams[keyOf(k.worker, rank)]
			s.mu.Unlock()
			if own {
				continue // the worker has a stream of its own for that rank
			}
		}
		list = append(list, st)
	}
	if len(list) == 0 && (worker != nil || rank != nil) {
		what := "the filter"
		switch {
		case worker != nil && rank != nil:
			what = fmt.Sprintf("worker_id %d dp_rank %d", *worker, *rank)
		case worker != nil:
			what = fmt.Sprintf("worker_id %d", *worker)
		default:
			what = fmt.Sprintf("dp_rank %d", *rank)
		}
		return nil, errorf(CodeNotFound, "no stream for %s", what)
	}
	rep := StatsReply{Streams: make([]StreamStats, 0, len(list))}
	for _, st := range list {
		if _, err := st.caughtUp(ctx); err != nil {
			return nil, err
		}
		rep.Streams = append(rep.Streams, st.statsSnapshot())
	}
	return json.Marshal(rep)
}

// statsSnapshot assembles a stream's STATS entry.
func (st *stream) statsSnapshot() StreamStats {
	st.mu.Lock()
	ix := st.ix
	out := StreamStats{
		WorkerID: st.key.worker, DpRank: st.key.dpRank(), KVBlockSize: st.blockSize, MaxBufferSize: st.maxBuffer, RingPath: st.ringPath,
		Epoch: st.epoch, StreamEpoch: st.streamEpoch, Resets: st.resets.Load(),
		ProducerAlive: st.alive, ProducerPID: st.lastHeader.ProducerPID, Attached: st.att != nil,
	}
	rs, base := st.lastRing, st.base
	st.mu.Unlock()
	is := ix.Stats()
	if is.Buffered > 0 {
		f, l := is.FirstEventID, is.LastEventID
		out.FirstEventID, out.LastEventID = &f, &l
	}
	out.Buffered = is.Buffered
	out.ResidentBlocks = is.ResidentBlocks
	out.Tainted, out.Incomplete, out.TaintReason = is.Tainted, is.Incomplete, is.TaintReason
	out.LostRanges, out.Missing = wireRanges(is.LostRanges), wireRanges(is.Missing)
	out.LostEvents = is.LostIDs
	out.IDResets = is.IDResets
	out.TokenMismatches = base.TokenMismatches + is.TokenMismatches
	for k := range st.eventsRecv {
		out.EventsReceived += st.eventsRecv[k].Load()
	}
	out.CorruptRecords = st.corrupt.Load()
	out.MalformedEvents = st.malformed.Load()
	out.RingHead, out.RingTail = rs.Head, rs.Tail
	out.RingUsedBytes, out.RingCapacity = rs.Used, rs.Capacity
	if rs.Capacity > 0 {
		out.RingFill = float64(rs.Used) / float64(rs.Capacity)
	}
	out.DroppedEvents, out.DroppedBytes, out.LossPending = rs.DroppedEvents, rs.DroppedBytes, rs.LossPending
	out.DumpBuilds, out.DumpCacheHits = is.DumpBuilds, is.DumpCacheHits
	return out
}

// labels are the stream's metric label values (worker_id, dp_rank).
func (st *stream) labels() (string, string) {
	return strconv.FormatUint(st.key.worker, 10), st.key.rankLabel()
}

// attach validates an ATTACH request, opens the ring and starts (or resumes, or replaces) the worker's stream.
func (s *Server) attach(cc *conn, req AttachRequest) (AttachReply, error) {
	if cc.att != nil {
		return AttachReply{}, errorf(CodeConflict, "this connection already attached %s; open a new connection", cc.att.st.key)
	}
	if req.KVBlockSize == 0 {
		return AttachReply{}, errorf(CodeBadRequest, "kv_block_size must be > 0")
	}
	if !filepath.IsAbs(req.RingPath) {
		return AttachReply{}, errorf(CodeBadRequest, "ring_path %q must be absolute", req.RingPath)
	}
	if int(cc.uid) != s.uid {
		return AttachReply{}, errorf(CodeForbidden, "peer uid %d is not the daemon's uid %d", cc.uid, s.uid)
	}
	fi, err := os.Lstat(req.RingPath)
	if err != nil {
		return AttachReply{}, errorf(CodeNotFound, "ring file: %v", err)
	}
	if !fi.Mode().IsRegular() {
		return AttachReply{}, errorf(CodeForbidden, "ring %s is not a regular file (mode %s)", req.RingPath, fi.Mode())
	}
	sys := fi.Sys().(*syscall.Stat_t)
	if sys.Uid != cc.uid {
		return AttachReply{}, errorf(CodeForbidden, "ring %s is owned by uid %d, not by the producer's uid %d", req.RingPath, sys.Uid, cc.uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return AttachReply{}, errorf(CodeForbidden, "ring %s has mode %04o: it must not be group/other writable", req.RingPath, fi.Mode().Perm())
	}
	r, err := shm.Open(req.RingPath)
	if err != nil {
		return AttachReply{}, errorf(CodeBadRequest, "open ring: %v", err)
	}
	keep := false
	defer func() {
		if !keep {
			_ = r.Close()
		}
	}()
	if fi2, err := os.Stat(req.RingPath); err != nil || !os.SameFile(fi, fi2) {
		return AttachReply{}, errorf(CodeConflict, "ring %s was replaced while attaching; retry", req.RingPath)
	}
	h := r.Header()
	switch {
	case h.WorkerID != req.WorkerID:
		return AttachReply{}, errorf(CodeBadRequest, "ring header worker_id %d does not match the request's %d", h.WorkerID, req.WorkerID)
	case h.KVBlockSize != req.KVBlockSize:
		return AttachReply{}, errorf(CodeBadRequest, "ring header kv_block_size %d does not match the request's %d", h.KVBlockSize, req.KVBlockSize)
	case req.MaxBufferSize != 0 && h.MaxBufferSize != req.MaxBufferSize:
		return AttachReply{}, errorf(CodeBadRequest, "ring header max_buffer_size %d does not match the request's %d", h.MaxBufferSize, req.MaxBufferSize)
	}
	head := r.Stats().Head
	key := keyOf(req.WorkerID, req.DpRank)
	// Resuming a ring this daemon does not know: look for the checkpoint of a gracefully stopped daemon. Read outside
	// s.mu (it may be large); startStream decides under the lock whether it applies.
	var ck *ckptLoad
	s.mu.Lock()
	known := s.streams[key] != nil
	s.mu.Unlock()
	if s.cfg.StateDir != "" && !known {
		// Even at head 0: the first checkpoint of a ring may have been written just before a crash that kept its
		// head from being released. A fresh ring with no checkpoint is not a "missing" restore.
		l := s.loadCheckpoint(key, h.Epoch, r, s.indexConfig(req.WorkerID, req.KVBlockSize, h.MaxBufferSize))
		if head > 0 || l.result != ckptMissing {
			ck = &l
		}
		if l.ix != nil {
			head = l.head
		}
	}
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return AttachReply{}, errorf(CodeBusy, "daemon is shutting down")
		}
		st := s.streams[key]
		var old *attachment
		if st != nil {
			st.mu.Lock()
			old = st.att
			st.mu.Unlock()
		}
		if old != nil {
			select {
			case <-old.stop: // ending: wait for its final drain, then decide again
				s.mu.Unlock()
				<-old.done
				continue
			default:
			}
			s.mu.Unlock()
			scope := "scope ALL (no dp_rank: one producer for every rank)"
			if key.perRank {
				scope = fmt.Sprintf("dp_rank %d", key.rank)
			}
			return AttachReply{}, errorf(CodeConflict, "worker %d already has a live producer for %s (pid %d, ring %s); producers that each publish one attention-DP rank with their own seq space must pass dp_rank (LocalIndexer(..., dp_rank=r) or KVSHM_DP_RANK) so each gets its own stream", req.WorkerID, scope, old.hdr.ProducerPID, old.st.ringPath)
		}
		rep, err := s.startStream(cc, st, key, r, h, req, head, ck)
		s.mu.Unlock()
		if err != nil {
			return AttachReply{}, err
		}
		keep = true
		if key.perRank {
			s.rankPorts.ensure(key.rank) // per-rank attach: rank r's port (--rank-ports) opens before the reply
		}
		return rep, nil
	}
}

// startStream installs the attachment. Called with s.mu held.
// ck is the checkpoint lookup done by attach (nil when none was made).
func (s *Server) startStream(cc *conn, st *stream, key streamKey, r *shm.Reader, h shm.Header, req AttachRequest, head uint64, ck *ckptLoad) (AttachReply, error) {
	newIndex := func() (*index.Indexer, error) {
		// The header's max_buffer_size is authoritative (the request's, when nonzero, was checked against it).
		ix, err := index.New(s.indexConfig(req.WorkerID, req.KVBlockSize, h.MaxBufferSize))
		if err != nil {
			return nil, errorf(CodeBadRequest, "create index: %v", err)
		}
		return ix, nil
	}
	log := s.log.With(key.logAttrs()...)
	resumed, restored := false, false
	switch {
	case st == nil: // first producer for this worker since the daemon started
		ix, err := newIndex()
		if err != nil {
			return AttachReply{}, err
		}
		if head > 0 && ck != nil && ck.ix != nil {
			ix, restored = ck.ix, true
		}
		st = &stream{key: key, srv: s, ix: ix, streamEpoch: 1}
		s.streams[key] = st
		if ck != nil {
			s.m.ckptRestores.WithLabelValues(ck.result).Inc()
		}
		// Any checkpoint of this worker is now consumed (restored) or stale (another epoch, head or content). With
		// --checkpoint-interval the restored one stays: it matches the persisted head until a newer one replaces it
		// (the head is released only after that), so a crash before then restores it again.
		if restored && s.cfg.CheckpointInterval > 0 {
			s.removeCheckpointsBut(key, ckptName(key, h.Epoch))
		} else {
			s.removeCheckpoints(key)
		}
		switch {
		case restored:
			resumed = true
			log.Info("resuming a ring from the checkpoint of a gracefully stopped daemon: nothing lost", "head", head, "epoch", h.Epoch)
		case head > 0:
			resumed = true
			ix.MarkUnknownHistory(fmt.Sprintf("daemon resumed ring at head %d: events consumed by an earlier daemon are gone", head))
			why := "no --state-dir"
			if s.cfg.StateDir != "" {
				why = "checkpoint not looked up (the stream existed when the attach began)"
			}
			if ck != nil {
				why = ck.why
			}
			log.Warn("resuming a ring consumed by an earlier daemon: earlier state is unknown until a Cleared", "head", head, "epoch", h.Epoch, "checkpoint", why)
		}
	case h.Epoch == st.epoch: // same producer incarnation reattached: continue the same index
		resumed = true
		if ck != nil && ck.moved {
			// Another attach created the stream while this one read a checkpoint ahead of the ring's head, so the
			// records the reader skipped for it reach no index.
			st.ix.MarkUnknownHistory(fmt.Sprintf("ring resumed at checkpoint head %d, but the checkpoint was not used", head))
		}
		log.Info("producer reattached the same ring; continuing", "head", head, "epoch", h.Epoch)
	default: // producer restarted: its cache is empty
		ix, err := newIndex()
		if err != nil {
			return AttachReply{}, err
		}
		st.mu.Lock()
		st.base = addStats(st.base, st.ix.Stats())
		st.ix = ix
		st.streamEpoch++
		st.mu.Unlock()
		st.resets.Add(1)
		s.removeCheckpoints(key)
		if head > 0 {
			resumed = true
			ix.MarkUnknownHistory(fmt.Sprintf("new ring epoch resumed at head %d", head))
		}
		log.Info("producer restarted (new ring epoch): index reset", "old_epoch", st.epoch, "epoch", h.Epoch, "stream_epoch", st.streamEpoch)
	}
	st.mu.Lock()
	is := st.ix.Stats()
	a := &attachment{
		st: st, r: r, hdr: h, ix: st.ix, log: log, idl: idler{r: r}, lease: cc,
		checkPID: h.ProducerPID != 0 && int32(h.ProducerPID) == cc.pid,
		stop:     make(chan struct{}), done: make(chan struct{}), syncs: make(chan syncReq, 64),
		ckptEvery: s.cfg.CheckpointInterval, lastCkpt: time.Now(), ckptHead: head,
		seqSeen: is.SeenAny, lastSeq: is.LastSeenID, ranks: rankSet{on: s.rankPorts.base != 0 && !key.perRank},
	}
	st.att, st.alive = a, true
	st.blockSize, st.maxBuffer, st.ringPath, st.epoch = req.KVBlockSize, h.MaxBufferSize, req.RingPath, h.Epoch
	st.lastHeader, st.lastRing = h, r.Stats()
	rep := AttachReply{WorkerID: req.WorkerID, Epoch: h.Epoch, StreamEpoch: st.streamEpoch, Resumed: resumed, Head: head, Restored: restored}
	st.mu.Unlock()
	cc.att = a
	if !a.checkPID {
		log.Info("producer pid check disabled: the attaching process is not the ring's producer_pid (or another pid namespace)", "peer_pid", cc.pid, "producer_pid", h.ProducerPID)
	}
	log.Info("producer attached", "ring", req.RingPath, "epoch", h.Epoch, "stream_epoch", rep.StreamEpoch, "resumed", resumed, "restored", restored, "head", head, "producer_pid", h.ProducerPID)
	go a.run()
	return rep, nil
}

// detach ends the attachment of the stream (worker, rank) (see selectExactLocked) after a final drain; the index
// stays queryable.
func (s *Server) detach(cc *conn, worker uint64, rank *uint32) error {
	s.mu.Lock()
	st, err := s.selectExactLocked(worker, rank)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	_, a := st.current()
	if a == nil {
		return nil // already detached: idempotent
	}
	if a.lease != cc {
		// Another client ending a live producer's stream would leave it publishing into a ring nobody reads.
		return errorf(CodeForbidden, "%s is attached by producer pid %d: only the producer detaches it, on its ATTACH "+
			"connection (FORGET drops a worker whose producer is gone)", st.key, a.hdr.ProducerPID)
	}
	a.finish("detach requested")
	<-a.done
	return nil
}

// forget drops a stream whose producer is gone (see selectExactLocked): its index, counters and metric series. A
// stream with an attached producer is refused (conflict); one whose attachment is ending is forgotten after the
// final drain.
func (s *Server) forget(ctx context.Context, worker uint64, rank *uint32) error {
	for {
		s.mu.Lock()
		st, err := s.selectExactLocked(worker, rank)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		_, a := st.current()
		if a == nil {
			// Attach installs an attachment only under s.mu, so none can appear before the stream is gone.
			delete(s.streams, st.key)
			s.removeCheckpoints(st.key)
			s.mu.Unlock()
			s.m.forgetStream(st.labels())
			s.log.Info("stream forgotten: index and metrics dropped", st.key.logAttrs()...)
			return nil
		}
		s.mu.Unlock()
		select {
		case <-a.stop: // ending: wait for its final drain, then decide again
		default:
			return errorf(CodeConflict, "%s has an attached producer (pid %d): it must detach or exit first", st.key, a.hdr.ProducerPID)
		}
		select {
		case <-a.done:
		case <-ctx.Done():
			return errorf(CodeBusy, "%s: the producer's final drain did not finish: %v", st.key, ctx.Err())
		}
	}
}

// addStats accumulates the cumulative counters of a replaced index.
func addStats(a, b index.Stats) index.Stats {
	for k := range a.Applied {
		for j := range a.Applied[k] {
			a.Applied[k][j] += b.Applied[k][j]
		}
	}
	a.LostIDs += b.LostIDs
	a.Gaps += b.Gaps
	a.Losses += b.Losses
	a.Unknowns += b.Unknowns
	a.IDResets += b.IDResets
	a.Rejected += b.Rejected
	a.DumpBuilds += b.DumpBuilds
	a.DumpCacheHits += b.DumpCacheHits
	a.DumpCacheExtends += b.DumpCacheExtends
	a.DumpErrors += b.DumpErrors
	a.TokenMismatches += b.TokenMismatches
	return a
}
