package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/sock"
)

// dispatch serves one well-framed request. Errors that are not *replyError become internal errors.
func (s *Server) dispatch(cc *conn, kind sock.Kind, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.QueryTimeout)
	defer cancel()
	switch kind {
	case sock.KindAttach:
		var req sock.AttachRequest
		if err := sock.DecodeStrict(body, &req); err != nil {
			return nil, errorf(sock.CodeBadRequest, "%v", err)
		}
		rep, err := s.attach(cc, req)
		if err != nil {
			return nil, err
		}
		return json.Marshal(rep)
	case sock.KindDetach:
		var req sock.WorkerRequest
		if err := sock.DecodeStrict(body, &req); err != nil {
			return nil, errorf(sock.CodeBadRequest, "%v", err)
		}
		if req.WorkerID == nil {
			return nil, errorf(sock.CodeBadRequest, "detach needs a worker_id")
		}
		return []byte("{}"), s.detach(cc, *req.WorkerID, req.DpRank)
	case sock.KindForget:
		var req sock.WorkerRequest
		if err := sock.DecodeStrict(body, &req); err != nil {
			return nil, errorf(sock.CodeBadRequest, "%v", err)
		}
		if req.WorkerID == nil {
			return nil, errorf(sock.CodeBadRequest, "forget needs a worker_id")
		}
		return []byte("{}"), s.forget(ctx, *req.WorkerID, req.DpRank)
	case sock.KindEvents, sock.KindDump:
		var req sock.EventsRequest
		if kind == sock.KindDump {
			var wr sock.WorkerRequest
			if err := sock.DecodeStrict(body, &wr); err != nil {
				return nil, errorf(sock.CodeBadRequest, "%v", err)
			}
			req.WorkerID, req.DpRank = wr.WorkerID, wr.DpRank
		} else if err := sock.DecodeStrict(body, &req); err != nil {
			return nil, errorf(sock.CodeBadRequest, "%v", err)
		}
		resp, _, err := s.recover(ctx, req.WorkerID, req.DpRank, req.Start, req.End)
		if err != nil {
			return nil, err
		}
		return resp.JSON, nil
	case sock.KindStats:
		var req sock.WorkerRequest
		if err := sock.DecodeStrict(body, &req); err != nil {
			return nil, errorf(sock.CodeBadRequest, "%v", err)
		}
		return s.stats(ctx, req.WorkerID, req.DpRank)
	case sock.KindMatch:
		var req sock.MatchRequest
		if err := sock.DecodeStrict(body, &req); err != nil {
			return nil, errorf(sock.CodeBadRequest, "%v", err)
		}
		return s.match(ctx, req)
	case sock.KindHealth:
		var req struct{}
		if err := sock.DecodeStrict(body, &req); err != nil {
			return nil, errorf(sock.CodeBadRequest, "%v", err)
		}
		return json.Marshal(sock.HealthReply{Status: "ok", Version: s.cfg.Version, Streams: len(s.streamList())})
	}
	return nil, errorf(sock.CodeUnknownKind, "unknown request kind %d", kind)
}

// selectStream finds the stream a query means (see resolveLocked); a rank view of an ALL stream selects the ALL
// stream.
func (s *Server) selectStream(worker *uint64, rank *uint32) (target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.resolveLocked(worker, rank)
	if err == nil {
		t.st.touch(s.mono()) // a consumer asked for it (reap.go)
	}
	return t, err
}

// wireRanges converts the index's lost ranges to the STATS wire type (never nil: JSON [] not null).
func wireRanges(rs []index.LostRange) []sock.LostRange {
	out := make([]sock.LostRange, 0, len(rs))
	for _, lr := range rs {
		out = append(out, sock.LostRange{First: lr.First, Last: lr.Last, Unknown: lr.Unknown, Reason: lr.Reason})
	}
	return out
}

// caughtUp returns the stream's index after the drain goroutine applied everything published before the call
// (read-your-writes for a producer that publishes then queries).
func (s *Server) caughtUp(ctx context.Context, st *entry) (*index.Indexer, error) {
	ix, a := st.Current()
	if a != nil {
		if err := a.Sync(ctx); err != nil {
			return nil, errorf(sock.CodeBusy, "%s: drain did not catch up with the ring: %v", st.key, err)
		}
		s.rankPorts.settle() // the ports the applied events asked for are open (rankPorts)
		ix, _ = st.Current()
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
func (s *Server) recover(ctx context.Context, worker *uint64, rank *uint32, start, end *uint64) (index.Response, *entry, error) {
	tg, err := s.selectStream(worker, rank)
	if err != nil {
		return index.Response{}, nil, err
	}
	st := tg.st
	t0 := time.Now()
	ix, err := s.caughtUp(ctx, st)
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
			return resp, st, errorf(sock.CodeBusy, "%s: recovery did not finish: %v", st.key, err)
		}
		return resp, st, fmt.Errorf("%s: recover: %w", st.key, err)
	}
	if uint64(len(resp.JSON)) > sock.MaxResponseBody {
		s.m.recoveries.WithLabelValues(wl, rl, "failed").Inc()
		return index.Response{}, st, errorf(sock.CodeTooLarge, "%s: response of %d bytes exceeds the 1 GiB frame cap", st.key, len(resp.JSON))
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
		if n, ok := st.incompleteLog.Allow(time.Now()); ok {
			args := append(st.key.LogAttrs(), "answer", resp.Kind.String(), "lost", lostHeader(resp.Lost), "suppressed", n)
			if tg.view != nil {
				args = append(args, "rank_view", *tg.view)
			}
			s.log.Warn("recovery answer is incomplete: it misses events kvshm lost (best effort, --on-loss=best-effort)", args...)
		}
	}
	return resp, st, nil
}

func (s *Server) match(ctx context.Context, req sock.MatchRequest) ([]byte, error) {
	tg, err := s.selectStream(req.WorkerID, req.DpRank)
	if err != nil {
		return nil, err
	}
	ix, err := s.caughtUp(ctx, tg.st)
	if err != nil {
		return nil, err
	}
	lora := ""
	if req.LoraName != nil {
		lora = *req.LoraName
	}
	scores, err := ix.MatchTokens(req.Tokens, lora, req.IsEagle)
	if err != nil {
		return nil, errorf(sock.CodeBadRequest, "match: %v", err)
	}
	rep := sock.MatchReply{Scores: make([]sock.MatchScore, 0, len(scores))}
	for _, sc := range scores {
		rep.Scores = append(rep.Scores, sock.MatchScore{WorkerID: sc.WorkerID, DpRank: sc.DpRank, Blocks: sc.Blocks})
	}
	return json.Marshal(rep)
}

// stats answers STATS: every stream, or those of worker, or (with rank) for each worker the per-rank stream of
// that rank or else its ALL stream. An empty selection is not_found; null selects every stream (no conflict).
func (s *Server) stats(ctx context.Context, worker *uint64, rank *uint32) ([]byte, error) {
	var list []*entry
	for _, st := range s.streamList() {
		k := st.key
		if worker != nil && k.Worker != *worker {
			continue
		}
		if rank != nil && (!k.PerRank || k.Rank != *rank) {
			if k.PerRank {
				continue
			}
			s.mu.Lock()
			_, own := s.streams[keyOf(k.Worker, rank)]
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
		return nil, errorf(sock.CodeNotFound, "no stream for %s", what)
	}
	rep := sock.StatsReply{Streams: make([]sock.StreamStats, 0, len(list))}
	for _, st := range list {
		if _, err := s.caughtUp(ctx, st); err != nil {
			return nil, err
		}
		rep.Streams = append(rep.Streams, st.statsSnapshot())
	}
	return json.Marshal(rep)
}

// statsSnapshot assembles a stream's STATS entry.
func (st *entry) statsSnapshot() sock.StreamStats {
	ss := st.Status()
	out := sock.StreamStats{
		WorkerID: st.key.Worker, DpRank: dpRankOf(st.key), KVBlockSize: ss.BlockSize, MaxBufferSize: ss.MaxBuffer, RingPath: ss.RingPath,
		Epoch: ss.Epoch, StreamEpoch: ss.StreamEpoch, Resets: ss.Resets,
		ProducerAlive: ss.Alive, ProducerPID: ss.Header.ProducerPID, Attached: ss.Attached,
	}
	rs, base := ss.Ring, ss.Base
	is := ss.Index.Stats()
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
	for k := range ss.EventsRecv {
		out.EventsReceived += ss.EventsRecv[k]
	}
	out.CorruptRecords = ss.Corrupt
	out.MalformedEvents = ss.Malformed
	out.RingHead, out.RingTail = rs.Head, rs.Tail
	out.RingUsedBytes, out.RingCapacity = rs.Used, rs.Capacity
	if rs.Capacity > 0 {
		out.RingFill = float64(rs.Used) / float64(rs.Capacity)
	}
	out.DroppedEvents, out.DroppedBytes, out.LossPending = rs.DroppedEvents, rs.DroppedBytes, rs.LossPending
	out.DumpBuilds, out.DumpCacheHits = is.DumpBuilds, is.DumpCacheHits
	for i := range ss.NotIndexed {
		out.EventsNotIndexed += ss.NotIndexed[i]
	}
	if zs, on := st.ZMQStats(); on {
		out.Zmq = &sock.ZmqStats{Published: zs.Published, Dropped: zs.DroppedTotal(), ReplayRequests: zs.ReplayRequests,
			BadReplayRequests: zs.BadRequests, Replayed: zs.Replayed, Endpoint: zs.Endpoint}
		if zs.ReplayEndpoint != "" {
			out.Zmq.ReplayEndpoint = &zs.ReplayEndpoint
		}
	}
	return out
}

// labels are the stream's metric label values (worker_id, dp_rank).
func (st *entry) labels() (string, string) {
	return strconv.FormatUint(st.key.Worker, 10), rankLabel(st.key)
}
