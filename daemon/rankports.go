package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
)

// maxRankPorts bounds the rank listeners (open or failed) a daemon keeps: a producer publishing events of
// thousands of dp_ranks must not make it open thousands of ports. Beyond it a rank gets no port (logged, counted).
const maxRankPorts = 256

// rankPorts are the --rank-ports listeners: port base+r answers /kv_recover as /workers/{w}/dp/{r}/kv_recover for
// the daemon's only worker. A listener opens the first time the daemon holds a stream covering rank r (a per-rank
// ATTACH, before its reply; or the first event of rank r on an ALL stream, on its drain goroutine as it applies the
// event, so a query answered after it finds the port open). A failure to bind is logged and counted
// (kvshm_rank_port_errors_total), never fatal, and not retried. Safe for concurrent use.
type rankPorts struct {
	s    *Server
	base int    // 0: off
	host string // the --http host

	mu     sync.Mutex // protects the fields below
	ports  map[uint32]*rankPort
	closed bool
}

// rankPort is one rank's listener (srv nil when it failed to open).
type rankPort struct {
	addr string
	srv  *http.Server
}

// ensure opens rank r's listener if rank ports are on and it was never tried.
func (p *rankPorts) ensure(r uint32) {
	if p.base == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ports[r] != nil {
		return
	}
	if len(p.ports) >= maxRankPorts {
		if len(p.ports) == maxRankPorts {
			p.s.log.Warn("rank ports: limit reached; further ranks get no port", "limit", maxRankPorts, "dp_rank", r)
			p.ports[r] = &rankPort{} // logged once: the map now holds limit+1 entries
		}
		p.s.m.rankPortErrors.Inc()
		return
	}
	port := uint64(p.base) + uint64(r)
	rp := &rankPort{}
	p.ports[r] = rp
	if port > 65535 {
		p.s.m.rankPortErrors.Inc()
		p.s.log.Warn("rank ports: no port for this dp_rank (base + rank > 65535)", "dp_rank", r, "base", p.base)
		return
	}
	addr := net.JoinHostPort(p.host, strconv.FormatUint(port, 10))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		p.s.m.rankPortErrors.Inc()
		p.s.log.Warn("rank ports: cannot listen; this rank is reachable only at its /workers URL", "dp_rank", r, "addr", addr, "err", err)
		return
	}
	rp.addr = ln.Addr().String()
	rp.srv = p.s.newHTTPServer(p.s.rankHandler(r))
	go func() {
		if err := rp.srv.Serve(&limitListener{Listener: ln, sem: p.s.httpSem, s: p.s}); err != nil && err != http.ErrServerClosed {
			p.s.log.Error("rank port stopped serving", "dp_rank", r, "addr", rp.addr, "err", err)
		}
	}()
	p.s.log.Info("rank port open", "dp_rank", r, "addr", rp.addr)
}

// addr returns the bound address of rank r's listener, "" when none is open.
func (p *rankPorts) addr(r uint32) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rp := p.ports[r]; rp != nil && rp.srv != nil {
		return rp.addr
	}
	return ""
}

// open counts the open listeners.
func (p *rankPorts) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, rp := range p.ports {
		if rp.srv != nil {
			n++
		}
	}
	return n
}

// close shuts every listener down (at most 5 s for requests in flight); no listener opens after it.
func (p *rankPorts) close() {
	p.mu.Lock()
	p.closed = true
	var srvs []*http.Server
	for _, rp := range p.ports {
		if rp.srv != nil {
			srvs = append(srvs, rp.srv)
		}
	}
	p.mu.Unlock()
	for _, srv := range srvs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(ctx)
		cancel()
	}
}

// RankAddr returns the address rank r's --rank-ports listener is bound to, "" when it is not open.
func (s *Server) RankAddr(r uint32) string { return s.rankPorts.addr(r) }

// rankHandler serves a rank port: /kv_recover (start, end, optionally worker_id; a dp_rank must be r) and
// /healthz.
func (s *Server) rankHandler(r uint32) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/kv_recover", func(w http.ResponseWriter, req *http.Request) {
		q, ok := s.recoverQuery(w, req)
		if !ok {
			return
		}
		if q.DpRank != nil && *q.DpRank != r {
			s.httpFail(w, errorf(sock.CodeBadRequest, "this port answers dp_rank %d, not %d", r, *q.DpRank))
			return
		}
		s.serveRecover(w, req, q.WorkerID, &r, q)
	})
	mux.HandleFunc("/healthz", handleHealthz)
	return mux
}

// newHTTPServer builds an http.Server with the daemon's HTTP timeouts and error log.
func (s *Server) newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler: h, ReadHeaderTimeout: s.cfg.HTTPHeaderTimeout, IdleTimeout: s.cfg.HTTPIdleTimeout,
		WriteTimeout: s.cfg.QueryTimeout + s.cfg.WriteTimeout, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// rankPortsHost returns the host part of the --http address (rank ports listen on the same host).
func rankPortsHost(httpAddr string) (string, error) {
	host, _, err := net.SplitHostPort(httpAddr)
	if err != nil {
		return "", fmt.Errorf("--http %q: %w", httpAddr, err)
	}
	return host, nil
}
