package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
)

// maxRankPorts bounds the rank listeners (open or failed) a daemon keeps: a producer publishing events of
// thousands of dp_ranks must not make it open thousands of ports. Beyond it a rank gets no port (logged, counted).
const maxRankPorts = 256

// rankPorts are the --rank-ports listeners: port base+r answers /kv_recover as /workers/{w}/dp/{r}/kv_recover for
// the daemon's only worker. A listener opens the first time the daemon holds a stream covering rank r: a per-rank
// ATTACH opens it before its reply (ensure); the first event of rank r on an ALL stream asks for it (request) and an
// opener goroutine opens it, because the drain path must not reach back into the server's layer (a listen, an HTTP
// server, a log line on a drain worker would stall every stream of that worker); a query waits for the ranks asked
// before it (settle, in caughtUp), so a query answered after the event still finds the port open. A failure
// to bind is logged and counted (kvshm_rank_port_errors_total), never fatal, and not retried. Safe for concurrent
// use.
type rankPorts struct {
	s    *Server
	base int    // 0: off
	host string // the --http host

	mu      sync.Mutex // protects the fields below
	ports   map[uint32]*rankPort
	closed  bool
	pending []uint32   // ranks requested and not yet opened (nor tried)
	asked   uint64     // ranks ever requested
	served  uint64     // of them, how many the opener has handled (in request order)
	opening bool       // an opener goroutine runs
	settled *sync.Cond // on mu: broadcast when served grows
}

// rankPort is one rank's listener (srv nil when it failed to open).
type rankPort struct {
	addr string
	srv  *http.Server
}

// request asks for rank r's listener without opening it (the drain path): the opener goroutine opens it. Cheap
// when rank ports are off, or r is open, tried or asked already.
func (p *rankPorts) request(r uint32) {
	if p.base == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ports[r] != nil || slices.Contains(p.pending, r) {
		return
	}
	p.pending = append(p.pending, r)
	p.asked++
	if !p.opening {
		p.opening = true
		go p.openPending()
	}
}

// openPending is the opener goroutine: it opens the requested listeners and exits when none is left.
func (p *rankPorts) openPending() {
	p.mu.Lock()
	for len(p.pending) > 0 {
		r := p.pending[0]
		p.pending = p.pending[1:]
		p.mu.Unlock()
		p.ensure(r)
		p.mu.Lock()
		p.served++
		p.settled.Broadcast()
	}
	p.opening = false
	p.mu.Unlock()
}

// settle waits until every rank requested before the call has been handled (opened, or failed and counted). An
// open is a bind and a goroutine start, never a long wait, so there is no deadline.
func (p *rankPorts) settle() {
	if p.base == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for target := p.asked; p.served < target; {
		p.settled.Wait()
	}
}

// listenTCP is net.Listen; a test replaces it to hold a listen open.
var listenTCP = net.Listen

// ensure opens rank r's listener if rank ports are on and it was never tried. The bind runs without p.mu held, so
// request (the drain path) never waits for it.
func (p *rankPorts) ensure(r uint32) {
	if p.base == 0 {
		return
	}
	p.mu.Lock()
	if p.closed || p.ports[r] != nil {
		p.mu.Unlock()
		return
	}
	if len(p.ports) >= maxRankPorts {
		if len(p.ports) == maxRankPorts {
			p.s.log.Warn("rank ports: limit reached; further ranks get no port", "limit", maxRankPorts, "dp_rank", r)
			p.ports[r] = &rankPort{} // logged once: the map now holds limit+1 entries
		}
		p.s.m.rankPortErrors.Inc()
		p.mu.Unlock()
		return
	}
	port := uint64(p.base) + uint64(r)
	rp := &rankPort{}
	p.ports[r] = rp // taken: a concurrent ensure(r) returns (its caller settles: see request)
	p.mu.Unlock()
	if port > 65535 {
		p.s.m.rankPortErrors.Inc()
		p.s.log.Warn("rank ports: no port for this dp_rank (base + rank > 65535)", "dp_rank", r, "base", p.base)
		return
	}
	addr := net.JoinHostPort(p.host, strconv.FormatUint(port, 10))
	ln, err := listenTCP("tcp", addr)
	if err != nil {
		p.s.m.rankPortErrors.Inc()
		p.s.log.Warn("rank ports: cannot listen; this rank is reachable only at its /workers URL", "dp_rank", r, "addr", addr, "err", err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		ln.Close()
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
