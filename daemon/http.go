package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/sock"
)

// RecoverQuery is the parsed query string of GET /kv_recover.
type RecoverQuery struct {
	WorkerID, Start, End *uint64
	DpRank               *uint32
}

// ParseRecoverQuery parses the raw query string of /kv_recover strictly: only start, end, worker_id and dp_rank,
// each at most once, each empty (= absent, so "?start=&end=" asks for a dump) or a decimal integer without sign
// or spaces (u64; dp_rank u32).
func ParseRecoverQuery(raw string) (RecoverQuery, error) {
	var q RecoverQuery
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return q, fmt.Errorf("malformed query string: %v", err)
	}
	for k, vs := range vals {
		bits := 64
		switch k {
		case "start", "end", "worker_id":
		case "dp_rank":
			bits = 32
		default:
			return q, fmt.Errorf("unknown query parameter %q (allowed: start, end, worker_id, dp_rank)", k)
		}
		if len(vs) != 1 {
			return q, fmt.Errorf("query parameter %q given %d times", k, len(vs))
		}
		if vs[0] == "" {
			continue
		}
		n, err := parseDecimal(vs[0], bits)
		if err != nil {
			return q, fmt.Errorf("query parameter %s=%q %v", k, vs[0], err)
		}
		switch k {
		case "start":
			q.Start = &n
		case "end":
			q.End = &n
		case "worker_id":
			q.WorkerID = &n
		default:
			r := uint32(n)
			q.DpRank = &r
		}
	}
	return q, nil
}

// parseDecimal parses an unsigned decimal integer of at most bits bits: digits only (no sign, spaces, 0x).
func parseDecimal(v string, bits int) (uint64, error) {
	if v == "" || len(v) > 20 || v[0] < '0' || v[0] > '9' {
		return 0, fmt.Errorf("is not an unsigned decimal integer")
	}
	n, err := strconv.ParseUint(v, 10, bits)
	if err != nil {
		return 0, fmt.Errorf("is not an unsigned %d-bit decimal integer", bits)
	}
	return n, nil
}

// Handler returns the HTTP handler of the --http listener:
//
//	GET /kv_recover?start=&end=[&worker_id=][&dp_rank=]           resolved as in resolveLocked
//	GET /workers/{worker_id}/kv_recover?start=&end=                the worker's only stream
//	GET /workers/{worker_id}/dp/{dp_rank}/kv_recover?start=&end=   the per-rank stream, else the ALL stream's view
//	GET /metrics, GET /healthz
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/kv_recover", func(w http.ResponseWriter, r *http.Request) {
		q, ok := s.recoverQuery(w, r)
		if !ok {
			return
		}
		s.serveRecover(w, r, q.WorkerID, q.DpRank, q)
	})
	mux.HandleFunc("/workers/{worker_id}/kv_recover", func(w http.ResponseWriter, r *http.Request) {
		worker, _, q, ok := s.pathQuery(w, r, false)
		if ok {
			s.serveRecover(w, r, &worker, nil, q)
		}
	})
	mux.HandleFunc("/workers/{worker_id}/dp/{dp_rank}/kv_recover", func(w http.ResponseWriter, r *http.Request) {
		worker, rank, q, ok := s.pathQuery(w, r, true)
		if ok {
			s.serveRecover(w, r, &worker, &rank, q)
		}
	})
	mux.Handle("/metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{ErrorLog: slogAdapter{s}, Registry: s.cfg.Registry}))
	mux.HandleFunc("/healthz", handleHealthz)
	return mux
}

func handleHealthz(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		httpError(w, http.StatusMethodNotAllowed, sock.CodeBadRequest, "use GET")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// recoverQuery checks the method and parses the query string of a recovery route; on failure it has answered.
func (s *Server) recoverQuery(w http.ResponseWriter, r *http.Request) (RecoverQuery, bool) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		s.m.requests.WithLabelValues("http", "events", sock.CodeBadRequest).Inc()
		httpError(w, http.StatusMethodNotAllowed, sock.CodeBadRequest, "use GET "+r.URL.Path+"?start=&end=")
		return RecoverQuery{}, false
	}
	q, err := ParseRecoverQuery(r.URL.RawQuery)
	if err != nil {
		s.httpFail(w, errorf(sock.CodeBadRequest, "%v", err))
		return q, false
	}
	return q, true
}

// pathQuery parses a /workers/... route: the worker (and rank) from the path, start and end from the query (a
// worker_id or dp_rank there is refused: the path says which stream).
func (s *Server) pathQuery(w http.ResponseWriter, r *http.Request, withRank bool) (uint64, uint32, RecoverQuery, bool) {
	q, ok := s.recoverQuery(w, r)
	if !ok {
		return 0, 0, q, false
	}
	if q.WorkerID != nil || q.DpRank != nil {
		s.httpFail(w, errorf(sock.CodeBadRequest, "worker_id and dp_rank are given by the path, not the query string"))
		return 0, 0, q, false
	}
	worker, err := parseDecimal(r.PathValue("worker_id"), 64)
	if err != nil {
		s.httpFail(w, errorf(sock.CodeBadRequest, "worker_id %q in the path %v", r.PathValue("worker_id"), err))
		return 0, 0, q, false
	}
	var rank uint64
	if withRank {
		if rank, err = parseDecimal(r.PathValue("dp_rank"), 32); err != nil {
			s.httpFail(w, errorf(sock.CodeBadRequest, "dp_rank %q in the path %v", r.PathValue("dp_rank"), err))
			return 0, 0, q, false
		}
	}
	return worker, uint32(rank), q, true
}

// Response headers of /kv_recover answers that miss events kvshm lost.
const (
	// HeaderLostEvents lists the lost ids an answer misses: inclusive ranges "80-80,95-97", the newest
	// index.MaxLostRanges, an unknown-history point written "unknown-N" (N: the first id after it).
	HeaderLostEvents = "Kvshm-Lost-Events"
	// HeaderState is "incomplete" on an Incomplete answer (--on-loss=best-effort), absent otherwise.
	HeaderState = "Kvshm-State"
)

// serveRecover answers one recovery route: the WorkerKvQueryResponse JSON with status 200 for every variant, the
// loss headers when the answer is incomplete, an error JSON with 400/404/409/503 otherwise.
func (s *Server) serveRecover(w http.ResponseWriter, r *http.Request, worker *uint64, rank *uint32, q RecoverQuery) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
	defer cancel()
	resp, _, err := s.recover(ctx, worker, rank, q.Start, q.End)
	if err != nil {
		s.httpFail(w, err)
		return
	}
	s.m.requests.WithLabelValues("http", "events", "ok").Inc()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(resp.JSON)))
	if resp.Incomplete {
		h.Set(HeaderState, "incomplete")
		h.Set(HeaderLostEvents, lostHeader(resp.Lost))
	}
	n := len(resp.JSON)
	_, _ = w.Write(resp.JSON)
	releaseAfterReply(n)
}

// httpFail answers err (a *replyError, else internal) as an error JSON with the code's HTTP status.
func (s *Server) httpFail(w http.ResponseWriter, err error) {
	var re *replyError
	if !errors.As(err, &re) {
		re = &replyError{code: sock.CodeInternal, msg: err.Error()}
	}
	s.m.requests.WithLabelValues("http", "events", re.code).Inc()
	httpError(w, httpStatus(re.code), re.code, re.msg)
}

// lostHeader formats lost ranges for HeaderLostEvents.
func lostHeader(lost []index.LostRange) string {
	b := make([]byte, 0, 16*len(lost))
	for i, lr := range lost {
		if i > 0 {
			b = append(b, ',')
		}
		if lr.Unknown {
			b = append(b, "unknown-"...)
			b = strconv.AppendUint(b, lr.First, 10)
			continue
		}
		b = strconv.AppendUint(b, lr.First, 10)
		b = append(b, '-')
		b = strconv.AppendUint(b, lr.Last, 10)
	}
	return string(b)
}

func httpStatus(code string) int {
	switch code {
	case sock.CodeBadRequest:
		return http.StatusBadRequest
	case sock.CodeNotFound:
		return http.StatusNotFound
	case sock.CodeConflict:
		return http.StatusConflict
	case sock.CodeBusy:
		return http.StatusServiceUnavailable
	case sock.CodeTooLarge:
		return http.StatusInsufficientStorage
	case sock.CodeForbidden:
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

func httpError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(sock.EncodeErrorBody(code, msg), '\n'))
}
