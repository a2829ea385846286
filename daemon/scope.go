package daemon

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvshm/kvshm/proto/sock"
)

// streamKey identifies a stream: a worker and the scope of its producer. Scope ALL (perRank false: no dp_rank in
// the ATTACH, one producer for every attention-DP rank, as TensorRT-LLM does) or one dp_rank (perRank true: one
// producer per rank with its own seq space, as vLLM does). At most one live producer feeds a key.
type streamKey struct {
	worker  uint64
	rank    uint32 // valid when perRank
	perRank bool
}

func keyOf(worker uint64, dpRank *uint32) streamKey {
	if dpRank == nil {
		return streamKey{worker: worker}
	}
	return streamKey{worker: worker, rank: *dpRank, perRank: true}
}

// String is the key as logs and messages show it: "worker 7" or "worker 7 dp_rank 1".
func (k streamKey) String() string {
	if !k.perRank {
		return fmt.Sprintf("worker %d", k.worker)
	}
	return fmt.Sprintf("worker %d dp_rank %d", k.worker, k.rank)
}

// logAttrs are the key's slog attributes.
func (k streamKey) logAttrs() []any {
	if !k.perRank {
		return []any{"worker_id", k.worker}
	}
	return []any{"worker_id", k.worker, "dp_rank", k.rank}
}

// rankLabel is the dp_rank metric label of the stream: the rank of a per-rank stream, "" for an ALL stream (an
// empty label is an absent label in Prometheus, so ALL streams keep the series they had before dp_rank existed).
func (k streamKey) rankLabel() string {
	if !k.perRank {
		return ""
	}
	return strconv.FormatUint(uint64(k.rank), 10)
}

// dpRank is the key's rank as the wire shows it (null for ALL).
func (k streamKey) dpRank() *uint32 {
	if !k.perRank {
		return nil
	}
	r := k.rank
	return &r
}

// url is the HTTP path that answers for exactly this stream.
func (k streamKey) url() string {
	if !k.perRank {
		return fmt.Sprintf("/workers/%d/kv_recover", k.worker)
	}
	return rankURL(k.worker, k.rank)
}

func rankURL(worker uint64, rank uint32) string {
	return fmt.Sprintf("/workers/%d/dp/%d/kv_recover", worker, rank)
}

// compareKeys orders streams by worker, then the ALL stream, then ranks.
func compareKeys(a, b streamKey) int {
	if c := cmp.Compare(a.worker, b.worker); c != 0 {
		return c
	}
	if a.perRank != b.perRank {
		if !a.perRank {
			return -1
		}
		return 1
	}
	return cmp.Compare(a.rank, b.rank)
}

// target is what a recovery query resolved to: a stream, and for a rank view of an ALL stream the rank.
type target struct {
	st   *stream
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
		if st := s.streams[streamKey{worker: *worker}]; st != nil {
			r := *rank
			return target{st: st, view: &r}, nil
		}
		return target{}, errorf(sock.CodeNotFound, "no stream for worker_id %d dp_rank %d (%d streams attached)", *worker, *rank, len(s.streams))
	}
	if st := s.streams[streamKey{worker: *worker}]; st != nil {
		return target{st: st}, nil // no dp_rank means scope ALL, as in ATTACH
	}
	var only *stream
	n := 0
	for k, st := range s.streams {
		if k.worker == *worker {
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
		if !seen[k.worker] {
			seen[k.worker] = true
			out = append(out, k.worker)
		}
	}
	slices.Sort(out)
	return out
}

// urlsLocked lists the URL of every stream (of worker, when given), in key order.
func (s *Server) urlsLocked(worker *uint64) []string {
	var keys []streamKey
	for k := range s.streams {
		if worker == nil || k.worker == *worker {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.url()
	}
	return out
}

// selectExactLocked finds the stream of exactly (worker, scope) for DETACH and FORGET (never a rank view); an
// absent dp_rank means the worker's ALL stream, or its only stream when it has no ALL stream (a per-rank
// producer's client that does not send its rank), and is a conflict when the worker has several per-rank streams.
func (s *Server) selectExactLocked(worker uint64, rank *uint32) (*stream, error) {
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
