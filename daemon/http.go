package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// RecoverQuery is the parsed query string of GET /kv_recover.
type RecoverQuery struct {
	WorkerID, Start, End *uint64
}

// ParseRecoverQuery parses the raw query string of /kv_recover strictly: only start, end and worker_id, each at
// most once, each empty (= absent, so "?start=&end=" asks for a dump) or a decimal u64 without sign or spaces.
func ParseRecoverQuery(raw string) (RecoverQuery, error) {
	var q RecoverQuery
	vals, err := url.ParseQuery(raw)
	if err != nil {
		return q, fmt.Errorf("malformed query string: %v", err)
	}
	for k, vs := range vals {
		var dst **uint64
		switch k {
		case "start":
			dst = &q.Start
		case "end":
			dst = &q.End
		case "worker_id":
			dst = &q.WorkerID
		default:
			return q, fmt.Errorf("unknown query parameter %q (allowed: start, end, worker_id)", k)
		}
		if len(vs) != 1 {
			return q, fmt.Errorf("query parameter %q given %d times", k, len(vs))
		}
		v := vs[0]
		if v == "" {
			continue
		}
		if len(v) > 20 || v[0] < '0' || v[0] > '9' {
			return q, fmt.Errorf("query parameter %s=%q is not an unsigned decimal integer", k, v)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return q, fmt.Errorf("query parameter %s=%q is not an unsigned 64-bit decimal integer", k, v)
		}
		*dst = &n
	}
	return q, nil
}

// Handler returns the HTTP handler: GET /kv_recover, /metrics, /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/kv_recover", s.handleRecover)
	mux.Handle("/metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{ErrorLog: slogAdapter{s}, Registry: s.cfg.Registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			httpError(w, http.StatusMethodNotAllowed, CodeBadRequest, "use GET")
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

func (s *Server) handleRecover(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		s.m.requests.WithLabelValues("http", "events", CodeBadRequest).Inc()
		w.Header().Set("Allow", "GET")
		httpError(w, http.StatusMethodNotAllowed, CodeBadRequest, "use GET /kv_recover?start=&end=&worker_id=")
		return
	}
	q, err := ParseRecoverQuery(r.URL.RawQuery)
	if err != nil {
		s.m.requests.WithLabelValues("http", "events", CodeBadRequest).Inc()
		httpError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
	defer cancel()
	resp, err := s.recover(ctx, q.WorkerID, q.Start, q.End)
	if err != nil {
		var re *replyError
		if !errors.As(err, &re) {
			re = &replyError{code: CodeInternal, msg: err.Error()}
		}
		s.m.requests.WithLabelValues("http", "events", re.code).Inc()
		httpError(w, httpStatus(re.code), re.code, re.msg)
		return
	}
	s.m.requests.WithLabelValues("http", "events", "ok").Inc()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(resp.JSON)))
	_, _ = w.Write(resp.JSON)
}

func httpStatus(code string) int {
	switch code {
	case CodeBadRequest:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict:
		return http.StatusConflict
	case CodeBusy:
		return http.StatusServiceUnavailable
	case CodeTooLarge:
		return http.StatusInsufficientStorage
	case CodeForbidden:
		return http.StatusForbidden
	}
	return http.StatusInternalServerError
}

func httpError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(encodeErrorBody(code, msg), '\n'))
}

// slogAdapter routes promhttp's error log to slog.
type slogAdapter struct{ s *Server }

func (a slogAdapter) Println(v ...any) { a.s.log.Error("metrics", "err", fmt.Sprint(v...)) }

// limitListener bounds the number of open HTTP connections. A connection beyond the bound is answered at once with
// 503 and closed (counted as connections_rejected_total{reason="http_busy"}), so a flood of idle or slow clients
// cannot exhaust file descriptors or goroutines; ReadHeaderTimeout and IdleTimeout free the slots of silent ones.
type limitListener struct {
	net.Listener
	sem chan struct{} // one token per open connection
	s   *Server
}

// httpBusyReply is the whole answer to a connection beyond the bound.
var httpBusyReply = func() []byte {
	body := append(encodeErrorBody(CodeBusy, "too many HTTP connections; retry later"), '\n')
	return append(fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", len(body)), body...)
}()

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
		}
		l.s.m.rejected.WithLabelValues("http_busy").Inc()
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(httpBusyReply)
		_ = c.Close()
	}
}

// limitConn gives its listener slot back on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
