package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
		return []byte("{}"), s.detach(*req.WorkerID)
	case KindForget:
		var req WorkerRequest
		if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		if req.WorkerID == nil {
			return nil, errorf(CodeBadRequest, "forget needs a worker_id")
		}
		return []byte("{}"), s.forget(ctx, *req.WorkerID)
	case KindEvents, KindDump:
		var req EventsRequest
		if kind == KindDump {
			var wr WorkerRequest
			if err := decodeStrict(body, &wr); err != nil {
				return nil, errorf(CodeBadRequest, "%v", err)
			}
			req.WorkerID = wr.WorkerID
		} else if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		resp, err := s.recover(ctx, req.WorkerID, req.Start, req.End)
		if err != nil {
			return nil, err
		}
		return resp.JSON, nil
	case KindStats:
		var req WorkerRequest
		if err := decodeStrict(body, &req); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
		return s.stats(ctx, req.WorkerID)
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

// selectStream finds the stream for workerID; nil selects the only stream.
func (s *Server) selectStream(workerID *uint64) (*stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if workerID != nil {
		st := s.streams[*workerID]
		if st == nil {
			return nil, errorf(CodeNotFound, "no stream for worker_id %d (%d attached)", *workerID, len(s.streams))
		}
		return st, nil
	}
	switch len(s.streams) {
	case 0:
		return nil, errorf(CodeNotFound, "no stream: no producer has attached yet")
	case 1:
		for _, st := range s.streams {
			return st, nil
		}
	}
	return nil, errorf(CodeConflict, "%d streams are attached: give a worker_id", len(s.streams))
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
			return nil, errorf(CodeBusy, "worker %d: drain did not catch up with the ring: %v", st.workerID, err)
		}
		ix, _ = st.current()
	}
	return ix, nil
}

var resultNames = map[index.RespKind]string{
	index.RespEvents: "events", index.RespTreeDump: "tree_dump", index.RespTooNew: "too_new",
	index.RespInvalidRange: "invalid_range", index.RespError: "error",
}

// recover answers a recovery query (EVENTS, DUMP, /kv_recover) with the index's WorkerKvQueryResponse.
func (s *Server) recover(ctx context.Context, workerID, start, end *uint64) (index.Response, error) {
	st, err := s.selectStream(workerID)
	if err != nil {
		return index.Response{}, err
	}
	t0 := time.Now()
	ix, err := st.caughtUp(ctx)
	if err != nil {
		return index.Response{}, err
	}
	resp, err := ix.Recover(ctx, start, end)
	wl := st.label()
	if err != nil {
		s.m.recoveries.WithLabelValues(wl, "failed").Inc()
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return resp, errorf(CodeBusy, "worker %d: recovery did not finish: %v", st.workerID, err)
		}
		return resp, fmt.Errorf("worker %d: recover: %w", st.workerID, err)
	}
	if uint64(len(resp.JSON))+lengthCounted > MaxResponse {
		s.m.recoveries.WithLabelValues(wl, "failed").Inc()
		return index.Response{}, errorf(CodeTooLarge, "worker %d: response of %d bytes exceeds the 1 GiB frame cap", st.workerID, len(resp.JSON))
	}
	res := resultNames[resp.Kind]
	if res == "" {
		res = "unknown"
	}
	s.m.recoveries.WithLabelValues(wl, res).Inc()
	s.m.recoverySeconds.WithLabelValues(wl).Observe(time.Since(t0).Seconds())
	s.m.recoveryBytes.WithLabelValues(wl).Observe(float64(len(resp.JSON)))
	return resp, nil
}

func (s *Server) match(ctx context.Context, req MatchRequest) ([]byte, error) {
	st, err := s.selectStream(req.WorkerID)
	if err != nil {
		return nil, err
	}
	ix, err := st.caughtUp(ctx)
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

func (s *Server) stats(ctx context.Context, workerID *uint64) ([]byte, error) {
	var list []*stream
	if workerID != nil {
		st, err := s.selectStream(workerID)
		if err != nil {
			return nil, err
		}
		list = []*stream{st}
	} else {
		list = s.streamList() // null = every stream (not a conflict for STATS)
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
		WorkerID: st.workerID, KVBlockSize: st.blockSize, MaxBufferSize: st.maxBuffer, RingPath: st.ringPath,
		Epoch: st.epoch, StreamEpoch: st.streamEpoch, Resets: st.resets.Load(),
		ProducerAlive: st.alive, ProducerPID: st.lastHeader.ProducerPID, Attached: st.att != nil,
	}
	rs := st.lastRing
	st.mu.Unlock()
	is := ix.Stats()
	if is.Buffered > 0 {
		f, l := is.FirstEventID, is.LastEventID
		out.FirstEventID, out.LastEventID = &f, &l
	}
	out.Buffered = is.Buffered
	out.ResidentBlocks = is.ResidentBlocks
	out.Tainted, out.TaintReason = is.Tainted, is.TaintReason
	out.LostRanges = make([]LostRange, 0, len(is.LostRanges))
	for _, lr := range is.LostRanges {
		out.LostRanges = append(out.LostRanges, LostRange{First: lr.First, Last: lr.Last, Reason: lr.Reason})
	}
	out.LostEvents = is.LostIDs
	out.IDResets = is.IDResets
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

func (st *stream) label() string { return fmt.Sprint(st.workerID) }

// attach validates an ATTACH request, opens the ring and starts (or resumes, or replaces) the worker's stream.
func (s *Server) attach(cc *conn, req AttachRequest) (AttachReply, error) {
	if cc.att != nil {
		return AttachReply{}, errorf(CodeConflict, "this connection already attached worker %d; open a new connection", cc.att.st.workerID)
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
	// Resuming a ring this daemon does not know: look for the checkpoint of a gracefully stopped daemon. Read outside
	// s.mu (it may be large); startStream decides under the lock whether it applies.
	var ck *ckptLoad
	s.mu.Lock()
	known := s.streams[req.WorkerID] != nil
	s.mu.Unlock()
	if s.cfg.StateDir != "" && head > 0 && !known {
		l := s.loadCheckpoint(req.WorkerID, h.Epoch, head,
			index.Config{WorkerID: req.WorkerID, BlockSize: req.KVBlockSize, MaxBufferSize: int(h.MaxBufferSize)})
		ck = &l
	}
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return AttachReply{}, errorf(CodeBusy, "daemon is shutting down")
		}
		st := s.streams[req.WorkerID]
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
			return AttachReply{}, errorf(CodeConflict, "worker %d already has a live producer (pid %d, ring %s)", req.WorkerID, old.hdr.ProducerPID, old.st.ringPath)
		}
		rep, err := s.startStream(cc, st, r, h, req, head, ck)
		s.mu.Unlock()
		if err != nil {
			return AttachReply{}, err
		}
		keep = true
		return rep, nil
	}
}

// startStream installs the attachment. Called with s.mu held.
// ck is the checkpoint lookup done by attach (nil when none was made).
func (s *Server) startStream(cc *conn, st *stream, r *shm.Reader, h shm.Header, req AttachRequest, head uint64, ck *ckptLoad) (AttachReply, error) {
	newIndex := func() (*index.Indexer, error) {
		// The header's max_buffer_size is authoritative (the request's, when nonzero, was checked against it).
		ix, err := index.New(index.Config{WorkerID: req.WorkerID, BlockSize: req.KVBlockSize, MaxBufferSize: int(h.MaxBufferSize)})
		if err != nil {
			return nil, errorf(CodeBadRequest, "create index: %v", err)
		}
		return ix, nil
	}
	log := s.log.With("worker_id", req.WorkerID)
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
		st = &stream{workerID: req.WorkerID, srv: s, ix: ix, streamEpoch: 1}
		s.streams[req.WorkerID] = st
		if ck != nil {
			s.m.ckptRestores.WithLabelValues(ck.result).Inc()
		}
		// Any checkpoint of this worker is now consumed (restored) or stale (another epoch, head or content). With
		// --checkpoint-interval the restored one stays: it matches the persisted head until a newer one replaces it
		// (the head is released only after that), so a crash before then restores it again.
		if restored && s.cfg.CheckpointInterval > 0 {
			s.removeCheckpointsBut(req.WorkerID, ckptName(req.WorkerID, h.Epoch))
		} else {
			s.removeCheckpoints(req.WorkerID)
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
		s.removeCheckpoints(req.WorkerID)
		if head > 0 {
			resumed = true
			ix.MarkUnknownHistory(fmt.Sprintf("new ring epoch resumed at head %d", head))
		}
		log.Info("producer restarted (new ring epoch): index reset", "old_epoch", st.epoch, "epoch", h.Epoch, "stream_epoch", st.streamEpoch)
	}
	st.mu.Lock()
	a := &attachment{
		st: st, r: r, hdr: h, ix: st.ix, log: log, idl: idler{r: r},
		checkPID: h.ProducerPID != 0 && int32(h.ProducerPID) == cc.pid,
		stop:     make(chan struct{}), done: make(chan struct{}), syncs: make(chan syncReq, 64),
		ckptEvery: s.cfg.CheckpointInterval, lastCkpt: time.Now(), ckptHead: head,
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

// detach ends the worker's attachment after a final drain; the index stays queryable.
func (s *Server) detach(workerID uint64) error {
	st, err := s.selectStream(&workerID)
	if err != nil {
		return err
	}
	_, a := st.current()
	if a == nil {
		return nil // already detached: idempotent
	}
	a.finish("detach requested")
	<-a.done
	return nil
}

// forget drops a stream whose producer is gone: its index, counters and metric series. A stream with an attached
// producer is refused (conflict); one whose attachment is ending is forgotten after the final drain.
func (s *Server) forget(ctx context.Context, workerID uint64) error {
	for {
		s.mu.Lock()
		st := s.streams[workerID]
		if st == nil {
			s.mu.Unlock()
			return errorf(CodeNotFound, "no stream for worker_id %d (%d known)", workerID, len(s.streams))
		}
		_, a := st.current()
		if a == nil {
			// Attach installs an attachment only under s.mu, so none can appear before the stream is gone.
			delete(s.streams, workerID)
			s.removeCheckpoints(workerID)
			s.mu.Unlock()
			s.m.forgetWorker(st.label())
			s.log.Info("stream forgotten: index and metrics dropped", "worker_id", workerID)
			return nil
		}
		s.mu.Unlock()
		select {
		case <-a.stop: // ending: wait for its final drain, then decide again
		default:
			return errorf(CodeConflict, "worker %d has an attached producer (pid %d): it must detach or exit first", workerID, a.hdr.ProducerPID)
		}
		select {
		case <-a.done:
		case <-ctx.Done():
			return errorf(CodeBusy, "worker %d: the producer's final drain did not finish: %v", workerID, ctx.Err())
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
	return a
}
