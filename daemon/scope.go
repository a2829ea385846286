package daemon

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/proto/sock"
)

// streamKey identifies a stream (package stream: Key).
type streamKey = stream.Key

// keyOf is the key of a request's worker and optional dp_rank.
func keyOf(worker uint64, dpRank *uint32) streamKey { return stream.KeyOf(worker, dpRank) }

// rankLabel is the dp_rank metric label of the stream: the rank of a per-rank stream, "" for an ALL stream (an
// empty label is an absent label in Prometheus, so ALL streams keep the series they had before dp_rank existed).
func rankLabel(k streamKey) string {
	if !k.PerRank {
		return ""
	}
	return strconv.FormatUint(uint64(k.Rank), 10)
}

// dpRank is the key's rank as the wire shows it (null for ALL).
func dpRankOf(k streamKey) *uint32 {
	if !k.PerRank {
		return nil
	}
	r := k.Rank
	return &r
}

// url is the HTTP path that answers for exactly this stream.
func keyURL(k streamKey) string {
	if !k.PerRank {
		return fmt.Sprintf("/workers/%d/kv_recover", k.Worker)
	}
	return rankURL(k.Worker, k.Rank)
}

func rankURL(worker uint64, rank uint32) string {
	return fmt.Sprintf("/workers/%d/dp/%d/kv_recover", worker, rank)
}

// compareKeys orders streams by worker, then the ALL stream, then ranks.
func compareKeys(a, b streamKey) int {
	if c := cmp.Compare(a.Worker, b.Worker); c != 0 {
		return c
	}
	if a.PerRank != b.PerRank {
		if !a.PerRank {
			return -1
		}
		return 1
	}
	return cmp.Compare(a.Rank, b.Rank)
}

// target is what a recovery query resolved to: a stream, and for a rank view of an ALL stream the rank.
type target struct {
	st   *entry
	view *uint32 // non-nil: answer RecoverRank(view) of an ALL stream
}

// resolve finds the stream a query means (called with s.mu held). worker and rank may each be absent:
//
//	worker  rank  answer
//	-       -     the only stream; 409 with the URL of every stream when there are several; 404 when none
//	w       -     w's ALL stream, else w's only stream; 409 with the URLs of w's per-rank streams when it has several
//	              (and no ALL stream); 404 when none
//	w       r     the per-rank stream (w, r), else w's ALL stream's rank view; 404 when w has neither
//	-       r     as (w, r) for the only worker; 409 with /workers/{w}/dp/{r}/kv_recover per worker; 404 when none
//
// A per-rank stream asked without a rank answers for itself (its rank is its scope); an ALL stream asked without
// a rank answers for every rank.
func (s *Server) resolveLocked(worker *uint64, rank *uint32) (target, error) {
	if worker == nil {
		workers := s.workersLocked()
		switch {
		case len(workers) == 0:
			return target{}, errorf(sock.CodeNotFound, "no stream: no producer has attached yet")
		case rank == nil && len(s.streams) == 1:
			for _, st := range s.streams {
				return target{st: st}, nil
			}
		case rank == nil:
			return target{}, errorf(sock.CodeConflict, "%d streams are attached: give a worker_id (and a dp_rank for a per-rank stream), or use the stream's own URL: %s", len(s.streams), strings.Join(s.urlsLocked(nil), " "))
		case len(workers) > 1:
			urls := make([]string, len(workers))
			for i, w := range workers {
				urls[i] = rankURL(w, *rank)
			}
			return target{}, errorf(sock.CodeConflict, "%d workers are attached: give a worker_id, or use the worker's URL for dp_rank %d: %s", len(workers), *rank, strings.Join(urls, " "))
		}
		w := workers[0]
		worker = &w
	}
	if rank != nil {
		if st := s.streams[keyOf(*worker, rank)]; st != nil {
			return target{st: st}, nil
		}
		if st := s.streams[streamKey{Worker: *worker}]; st != nil {
			r := *rank
			return target{st: st, view: &r}, nil
		}
		return target{}, errorf(sock.CodeNotFound, "no stream for worker_id %d dp_rank %d (%d streams attached)", *worker, *rank, len(s.streams))
	}
	if st := s.streams[streamKey{Worker: *worker}]; st != nil {
		return target{st: st}, nil // no dp_rank means scope ALL, as in ATTACH
	}
	var only *entry
	n := 0
	for k, st := range s.streams {
		if k.Worker == *worker {
			only, n = st, n+1
		}
	}
	switch n {
	case 0:
		return target{}, errorf(sock.CodeNotFound, "no stream for worker_id %d (%d attached)", *worker, len(s.streams))
	case 1:
		return target{st: only}, nil
	}
	return target{}, errorf(sock.CodeConflict, "worker %d has %d streams (one producer per dp_rank): give a dp_rank, or use the rank's URL: %s", *worker, n, strings.Join(s.urlsLocked(worker), " "))
}

// workersLocked returns the distinct worker ids of the streams, sorted.
func (s *Server) workersLocked() []uint64 {
	seen := map[uint64]bool{}
	var out []uint64
	for k := range s.streams {
		if !seen[k.Worker] {
			seen[k.Worker] = true
			out = append(out, k.Worker)
		}
	}
	slices.Sort(out)
	return out
}

// urlsLocked lists the URL of every stream (of worker, when given), in key order.
func (s *Server) urlsLocked(worker *uint64) []string {
	var keys []streamKey
	for k := range s.streams {
		if worker == nil || k.Worker == *worker {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = keyURL(k)
	}
	return out
}

// selectExactLocked finds the stream of exactly (worker, scope) for DETACH and FORGET (never a rank view); an
// absent dp_rank means the worker's ALL stream, or its only stream when it has no ALL stream (a per-rank
// producer's client that does not send its rank), and is a conflict when the worker has several per-rank streams.
func (s *Server) selectExactLocked(worker uint64, rank *uint32) (*entry, error) {
	if st := s.streams[keyOf(worker, rank)]; st != nil {
		return st, nil
	}
	if rank != nil {
		return nil, errorf(sock.CodeNotFound, "no stream for worker_id %d dp_rank %d (%d streams attached)", worker, *rank, len(s.streams))
	}
	t, err := s.resolveLocked(&worker, nil)
	if err != nil {
		return nil, err
	}
	return t.st, nil
}
