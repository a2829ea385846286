package daemon

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/drain"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/zmqpub"
)

// Config configures a Server. A zero field selects its value in DefaultConfig (OnLoss, DumpShape: their zero values;
// ZMQHeartbeat, ZMQReplayFill: off).
type Config struct {
	SocketPath        string        // the Unix socket
	SocketMode        os.FileMode   // the socket file's mode
	HTTPAddr          string        // "" = no HTTP listener
	ParentPID         int           // > 0: shut down (after draining) when this process is gone
	MaxRequestBytes   uint32        // request frame cap (length field)
	MaxConns          int           // concurrent connections
	HTTPMaxConns      int           // concurrent HTTP connections; beyond it a client gets 503 and is closed
	HTTPHeaderTimeout time.Duration // an HTTP request's headers must arrive within this
	HTTPIdleTimeout   time.Duration // an idle keep-alive HTTP connection is closed after this
	IdleTimeout       time.Duration // a connection that never attached and sends nothing for this long is closed
	FrameTimeout      time.Duration // a started frame must be complete within this
	WriteTimeout      time.Duration // a reply must be written within this
	QueryTimeout      time.Duration // bound on one query (including waiting for the single-flight dump)
	PIDCheckInterval  time.Duration // producer pid backstop period
	ParentPoll        time.Duration // --parent-pid poll period where the kernel has no pidfd
	// EagerDrain: every stream asks its producer for a doorbell at every publication, none is drained lazily
	// (package stream, idle.go: lazyLevelMax). For benchmarks of the doorbell path and for reading a stream's metrics at
	// sub-second resolution without queries; it costs a wakeup per record burst on streams nobody subscribes to.
	EagerDrain bool
	// CleanupDir, when set, is removed recursively when Serve returns (--cleanup-dir): only a directory made for
	// this daemon, proven by CleanupToken (--cleanup-token) in its CleanupTokenFile; Listen refuses anything else
	// (owndir.go).
	CleanupDir   string
	CleanupToken string
	// DeadRetention: a stream whose producer is gone and that no consumer asked for during this long is
	// forgotten (--dead-stream-retention; reap.go says what counts and why the default, DefaultDeadRetention).
	DeadRetention time.Duration
	// MaxDeadStreams: beyond this many dead streams, the ones longest not asked for are forgotten at once
	// (--max-dead-streams; 0 = DefaultMaxDeadStreams).
	MaxDeadStreams int
	// ZMQHeartbeat > 0: a publishing stream that published nothing for this long publishes an empty batch with the
	// next wire seq (--zmq-heartbeat; docs/lifecycle.md, "Heartbeats"). 0 = off.
	ZMQHeartbeat time.Duration
	// ZMQNoSnapshots turns replay snapshots off (--zmq-snapshots=false): a publishing stream's index keeps no
	// tokens and a replay older than the buffer gets the buffer only, as from vLLM's publisher (docs/replay-snapshots.md).
	ZMQNoSnapshots bool
	// ZMQSnapshotBuilds bounds the replay snapshots built at once, daemon-wide (--zmq-snapshot-builds); 0 =
	// DefaultSnapshotBuilds. A build beyond it waits for a slot.
	ZMQSnapshotBuilds int
	// ZMQSnapshotChunk > 0 splits a replay snapshot's batch of a rank into batches of about this many bytes of
	// events, all under the snapshot's seq (--zmq-snapshot-chunk; docs/replay-snapshots.md, "Chunks"). 0: one batch per rank.
	ZMQSnapshotChunk int
	// ZMQReplayFill > 0 makes replay replies carry every seq from the requested one, filling the seqs of heartbeats,
	// of a wiped incarnation and before a snapshot with empty batches, at most this many per reply
	// (--zmq-replay-fill; docs/replay-snapshots.md, "Contiguous replies"). 0: off, the buffer's seqs as kept.
	ZMQReplayFill int
	// ZMQSeqZero numbers a stream's wire seqs from 1 in each daemon (--zmq-seq-base zero; docs/lifecycle.md, "Wire
	// seqs"), continuing across incarnations and restored checkpoints, instead of from the clock in µs: what
	// llm-d's replay consumer needs (it replays from seq 0 on connect). A daemon that restarts without its state
	// starts again from 1, which llm-d takes for a publisher restart and Dynamo's listener drops as stale.
	ZMQSeqZero bool
	// Clock is the wall clock wire seqs start from (unix µs; docs/lifecycle.md, "Wire seqs"). nil = time.Now; tests
	// inject one.
	Clock    func() time.Time
	StateDir string // "" = no checkpoints; else indexes are checkpointed here at shutdown (created 0700)
	// CheckpointInterval > 0 (requires StateDir): also checkpoint each stream while it runs and release its ring head
	// only up to a written checkpoint, so a crash loses nothing (package stream's doc.go, "Continuous checkpoints"). 0 = off.
	CheckpointInterval time.Duration
	// OnLoss is how a recovery answer that misses events kvshm lost is given (--on-loss): best effort (the
	// default: what Dynamo would answer from the events applied, marked incomplete) or Error.
	OnLoss index.LossPolicy
	// DumpShape is the TreeDump shape (--dump-shape): Dynamo 1.6.1's merged chains (default) or single blocks.
	DumpShape index.DumpShape
	// RankPortsBase > 0 (requires HTTPAddr): port RankPortsBase+r on the HTTP host answers /kv_recover for rank r
	// of the only worker, opened when the daemon first holds a stream covering r (--rank-ports). 0 = off.
	RankPortsBase int
	Bounds        Bounds // per-producer bounds (bounds.go); zero fields: DefaultBounds
	// Drain configures the drain scheduler (package drain): rings per worker, and NoWaitv to force the fallback
	// of one worker per ring on Reader.Park (as on a kernel without futex_waitv). The zero value is the default.
	Drain    drain.Config
	Version  string       // reported by HEALTH and kvshm_build_info
	Logger   *slog.Logger //
	Registry *prometheus.Registry
}

// DefaultConfig returns the defaults every zero field of a Config stands for (New fills them in); kvshmd serve shows
// them as its flag defaults.
func DefaultConfig() Config {
	return Config{
		SocketPath:        sock.DefaultSocketPath(),
		SocketMode:        0o600,
		MaxRequestBytes:   sock.DefaultMaxRequest,
		MaxConns:          1024,
		HTTPMaxConns:      256,
		HTTPHeaderTimeout: 10 * time.Second,
		HTTPIdleTimeout:   2 * time.Minute,
		IdleTimeout:       5 * time.Minute,
		FrameTimeout:      10 * time.Second,
		WriteTimeout:      60 * time.Second,
		QueryTimeout:      120 * time.Second,
		PIDCheckInterval:  time.Second,
		ParentPoll:        200 * time.Millisecond,
		OnLoss:            index.LossBestEffort,
		DumpShape:         index.DumpChains,
		ZMQHeartbeat:      time.Second,
		DeadRetention:     DefaultDeadRetention,
		MaxDeadStreams:    DefaultMaxDeadStreams,
		ZMQReplayFill:     DefaultReplayFill,
		Bounds:            DefaultBounds(),
		Version:           "dev",
	}
}

func (c *Config) fill() {
	d := DefaultConfig()
	if c.SocketPath == "" {
		c.SocketPath = d.SocketPath
	}
	if c.SocketMode == 0 {
		c.SocketMode = d.SocketMode
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = d.MaxRequestBytes
	}
	for _, f := range []struct {
		v   *int
		def int
	}{{&c.MaxConns, d.MaxConns}, {&c.HTTPMaxConns, d.HTTPMaxConns}, {&c.MaxDeadStreams, d.MaxDeadStreams}} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	for _, f := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.HTTPHeaderTimeout, d.HTTPHeaderTimeout}, {&c.HTTPIdleTimeout, d.HTTPIdleTimeout}, {&c.IdleTimeout, d.IdleTimeout},
		{&c.FrameTimeout, d.FrameTimeout}, {&c.WriteTimeout, d.WriteTimeout}, {&c.QueryTimeout, d.QueryTimeout},
		{&c.PIDCheckInterval, d.PIDCheckInterval}, {&c.ParentPoll, d.ParentPoll}, {&c.DeadRetention, d.DeadRetention}} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	c.Bounds.fill()
	if c.Version == "" {
		c.Version = d.Version
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
}

// Server is a running kvshmd: the socket listener, the optional HTTP listener and the streams.
// Its methods are safe for concurrent use.
type Server struct {
	snapLimit *zmqpub.SnapshotLimit // replay snapshot builds, daemon-wide (package stream, snapshot.go)
	cfg       Config
	log       *slog.Logger
	m         *metrics
	uid       int

	ln        *net.UnixListener
	httpLn    net.Listener
	httpS     *http.Server
	httpSem   chan struct{} // one token per open HTTP connection, shared by --http and the rank ports
	rankPorts rankPorts
	ckpt      *ckptStore
	stateLock *os.File         // the --state-dir's flock, held until Serve returns (owndir.go)
	cleanup   *cleanupClaim    // the --cleanup-dir claimed at Listen
	sched     *drain.Scheduler // the drain workers of every attachment
	eng       *stream.Engine   // the stream engine (package stream); env.go is its environment
	nconns    atomic.Int64     // open connections. Updated atomically.
	peers     peerConns        // open connections per peer (bounds.go)

	// parentGone is set when the --parent-pid process is gone (before the shutdown it causes): the streams'
	// incarnations end with the daemon (a private daemon's engine is its parent). Updated atomically.
	parentGone atomic.Bool

	born     time.Time     // the origin of mono (reap.go)
	reapWake chan struct{} // wakes the reaper (an attachment ended)
	monoSkew atomic.Int64  // added to mono (tests)
	reapMu   sync.Mutex    // one reaper sweep at a time

	ctx    context.Context // canceled at shutdown: aborts queries in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup // connection goroutines

	mu      sync.Mutex // protects streams, conns, closed
	streams map[streamKey]*entry
	conns   map[*conn]struct{}
	closed  bool
}

// New validates cfg and builds a Server; Listen binds it.
func New(cfg Config) (*Server, error) {
	cfg.fill()
	if cfg.CheckpointInterval < 0 || (cfg.CheckpointInterval > 0 && cfg.StateDir == "") {
		return nil, fmt.Errorf("checkpoint interval %v: %w", cfg.CheckpointInterval, ErrCheckpointInterval)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, uid: os.Getuid(), streams: map[streamKey]*entry{}, conns: map[*conn]struct{}{},
		httpSem: make(chan struct{}, cfg.HTTPMaxConns), born: time.Now(), reapWake: make(chan struct{}, 1)}
	if cfg.ZMQSnapshotBuilds <= 0 {
		cfg.ZMQSnapshotBuilds = DefaultSnapshotBuilds
	}
	s.snapLimit = zmqpub.NewSnapshotLimit(cfg.ZMQSnapshotBuilds)
	s.rankPorts = rankPorts{s: s, ports: map[uint32]*rankPort{}}
	s.rankPorts.settled = sync.NewCond(&s.rankPorts.mu)
	s.sched = drain.New(cfg.Drain)
	if cfg.RankPortsBase != 0 {
		if cfg.RankPortsBase < 0 || cfg.RankPortsBase > 65535 || cfg.HTTPAddr == "" {
			return nil, fmt.Errorf("rank ports base %d with http address %q: %w", cfg.RankPortsBase, cfg.HTTPAddr, ErrRankPorts)
		}
		host, err := rankPortsHost(cfg.HTTPAddr)
		if err != nil {
			return nil, fmt.Errorf("rank ports: %v: %w", err, ErrRankPorts)
		}
		s.rankPorts.base, s.rankPorts.host = cfg.RankPortsBase, host
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	m, err := newMetrics(cfg.Registry, s)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	s.m = m
	s.ckpt = &ckptStore{dir: cfg.StateDir, writes: m.ckptWrites, log: s.log}
	s.eng = stream.New(s.engineConfig(), engineEnv{s}, drainScheduler{s.sched}, s.log)
	return s, nil
}

// Listen binds the Unix socket (and the HTTP address when configured). After it returns, clients can connect.
func (s *Server) Listen() error {
	if s.cfg.CleanupDir != "" {
		c, err := claimCleanupDir(s.cfg.CleanupDir, s.cfg.CleanupToken)
		if err != nil {
			return err
		}
		s.cleanup = c
	}
	if s.cfg.StateDir != "" {
		if err := prepareStateDir(s.cfg.StateDir); err != nil {
			return err
		}
	}
	ln, stale, err := listenUnix(s.cfg.SocketPath, s.cfg.SocketMode)
	if err != nil {
		return err
	}
	if s.cfg.StateDir != "" {
		if s.stateLock, err = lockStateDir(s.cfg.StateDir, s.cfg.SocketPath); err != nil {
			_ = ln.Close()
			return err
		}
		removeTempCheckpoints(s.cfg.StateDir)
	}
	if stale {
		s.log.Info("removed stale socket file", "socket", s.cfg.SocketPath)
	}
	s.ln = ln
	if s.cfg.HTTPAddr != "" {
		hl, err := net.Listen("tcp", s.cfg.HTTPAddr)
		if err != nil {
			_ = ln.Close()
			s.unlockState()
			return fmt.Errorf("listen http %s: %w", s.cfg.HTTPAddr, err)
		}
		s.httpLn = &limitListener{Listener: hl, sem: s.httpSem, s: s}
		s.httpS = s.newHTTPServer(s.Handler())
	}
	return nil
}

// SocketPath is the bound socket path.
func (s *Server) SocketPath() string { return s.cfg.SocketPath }

// HTTPAddr is the bound HTTP address ("" without --http).
func (s *Server) HTTPAddr() string {
	if s.httpLn == nil {
		return ""
	}
	return s.httpLn.Addr().String()
}

// Serve accepts connections until ctx is done or the parent process is gone, then shuts down gracefully: it stops
// accepting, closes connections, drains every ring one last time and closes them. It returns nil after a clean
// shutdown.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		return errors.New("kvshm/daemon: Serve before Listen")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- s.acceptLoop() }()
	if s.httpS != nil {
		go func() {
			if err := s.httpS.Serve(s.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve http: %w", err)
			}
		}()
	}
	if s.cfg.ParentPID > 0 {
		go s.watchParent(ctx, cancel)
	}
	reaped := make(chan struct{})
	go s.reapLoop(ctx, reaped)
	s.log.Info("kvshmd serving", "socket", s.cfg.SocketPath, "http", s.HTTPAddr(), "version", s.cfg.Version, "parent_pid", s.cfg.ParentPID, "state_dir", s.cfg.StateDir,
		"on_loss", s.cfg.OnLoss.String(), "dump_shape", s.cfg.DumpShape.String(), "rank_ports", s.cfg.RankPortsBase)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	<-reaped // no stream is reclaimed during the shutdown
	s.shutdown()
	s.unlockState()
	if s.cleanup != nil {
		if cerr := s.cleanup.remove(); cerr != nil {
			s.log.Error("cleanup directory not removed", "err", cerr)
		} else {
			s.log.Info("cleanup directory removed", "dir", s.cfg.CleanupDir)
		}
	}
	return err
}

// unlockState releases the state directory's lock (closing the file drops the flock).
func (s *Server) unlockState() {
	if s.stateLock != nil {
		_ = s.stateLock.Close()
		s.stateLock = nil
	}
}

// watchParent shuts the daemon down (cancel) once the --parent-pid process is gone: waited on through a pidfd, or,
// without one, polled every Config.ParentPoll.
func (s *Server) watchParent(ctx context.Context, cancel context.CancelFunc) {
	st, _ := shm.ReadProcStat(s.cfg.ParentPID) // start time 0 when unreadable: processAlive then checks the pid only
	start := st.StartTime
	if exited, ok := waitExit(ctx, s.cfg.ParentPID, start); ok {
		if exited {
			s.parentExited(cancel)
		}
		return
	}
	t := time.NewTicker(s.cfg.ParentPoll) // no pidfd: poll /proc
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !processAlive(s.cfg.ParentPID, start) {
				s.parentExited(cancel)
				return
			}
		}
	}
}

// parentExited starts the shutdown of a daemon whose --parent-pid is gone (its incarnations end: shutdown).
func (s *Server) parentExited(cancel context.CancelFunc) {
	s.log.Info("parent process is gone: shutting down", "parent_pid", s.cfg.ParentPID)
	s.parentGone.Store(true)
	cancel()
}

func (s *Server) shutdown() {
	s.mu.Lock()
	s.closed = true
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	// The attachments live now are checkpointed after their final drain, whichever way it comes (closing the
	// producer connections below usually ends them first). No attachment can start once closed is set.
	type live struct {
		st *entry
		a  *stream.Attachment
	}
	var attached []live
	for _, st := range s.streams {
		if _, a := st.Current(); a != nil {
			attached = append(attached, live{st, a})
		}
	}
	s.mu.Unlock()
	_ = s.ln.Close() // unlinks the socket file
	if s.httpS != nil {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		_ = s.httpS.Shutdown(sctx)
		c()
	}
	s.rankPorts.close()
	s.cancel() // queries in flight end with an error reply
	for _, c := range conns {
		_ = c.c.Close()
	}
	s.wg.Wait()
	for _, st := range s.streamList() {
		if _, a := st.Current(); a != nil {
			a.Finish(stream.CauseShutdown, "daemon shutting down")
			<-a.Done()
		}
	}
	if s.parentGone.Load() {
		// A private daemon's engine is gone: so is every producer incarnation still live without an attachment (a
		// connection that broke while the engine died, whose pid watch ends with the daemon).
		for _, st := range s.streamList() {
			st.EndDetached("the daemon's --parent-pid is gone")
		}
	}
	// After every final drain (and end of incarnation) handed its batches over: give connected subscribers up to
	// a second in all to receive them, then close.
	flushBy := time.Now().Add(time.Second)
	for _, st := range s.streamList() {
		if p := st.Publisher(); p != nil {
			p.Flush(max(0, time.Until(flushBy)))
		}
		st.ClosePublisher()
	}
	if s.cfg.StateDir != "" && s.cfg.CheckpointInterval == 0 { // with an interval, each final drain wrote its checkpoint
		sort.Slice(attached, func(i, j int) bool { return compareKeys(attached[i].st.key, attached[j].st.key) < 0 })
		for _, l := range attached {
			<-l.a.Done()
			_ = s.ckpt.save(l.st.key, l.a.Header().Epoch, l.a.Index(), l.a.FinalHead(), "shutdown") // after the final drain and head release: the index matches the ring head
		}
	}
	s.sched.Close() // every attachment has ended: the workers exit
	s.log.Info("kvshmd stopped: rings drained")
}

func (s *Server) acceptLoop() error {
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				s.log.Warn("accept failed; retrying", "err", err)
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		s.admit(c)
	}
}

// conn is one client connection, served by one goroutine.
type conn struct {
	c   *net.UnixConn
	uid uint32
	pid int32
	att *stream.Attachment // set by ATTACH on this connection. Owned by the connection goroutine.
	buf []byte
}

// Close closes the connection: a producer's connection is its attachment's lease (stream.AttachSpec.Lease),
// closed when its ring faults so that the producer learns of it.
func (cc *conn) Close() error { return cc.c.Close() }

func (s *Server) admit(c *net.UnixConn) {
	cred, err := sock.PeerCred(c)
	if err != nil {
		s.m.rejected.WithLabelValues("peercred").Inc()
		s.log.Warn("refusing connection: cannot read peer credentials", "err", err)
		_ = c.Close()
		return
	}
	if int(cred.Uid) != s.uid {
		s.m.rejected.WithLabelValues("forbidden").Inc()
		s.log.Warn("refusing connection from another user", "peer_uid", cred.Uid, "peer_pid", cred.Pid, "uid", s.uid)
		s.refuse(c, sock.CodeForbidden, fmt.Sprintf("peer uid %d is not the daemon's uid %d", cred.Uid, s.uid))
		return
	}
	cc := &conn{c: c, uid: cred.Uid, pid: cred.Pid}
	if !s.admitPeer(cc) {
		return
	}
	if s.nconns.Add(1) > int64(s.cfg.MaxConns) {
		s.nconns.Add(-1)
		s.peers.remove(peerKey{cc.uid, cc.pid})
		s.m.rejected.WithLabelValues("busy").Inc()
		s.refuse(c, sock.CodeBusy, fmt.Sprintf("connection limit %d reached; retry later", s.cfg.MaxConns))
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.nconns.Add(-1)
		s.peers.remove(peerKey{cc.uid, cc.pid})
		_ = c.Close()
		return
	}
	s.conns[cc] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go s.serveConn(cc)
}

// refuse sends one unsolicited error frame (kind 0) and closes, without reading anything.
func (s *Server) refuse(c *net.UnixConn, code, msg string) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_ = sock.WriteFrame(c, 0, sock.StatusError, sock.EncodeErrorBody(code, msg))
	_ = c.Close()
}

func (s *Server) serveConn(cc *conn) {
	defer func() {
		_ = cc.c.Close()
		s.mu.Lock()
		delete(s.conns, cc)
		s.mu.Unlock()
		s.nconns.Add(-1)
		s.peers.remove(peerKey{cc.uid, cc.pid})
		if cc.att != nil {
			s.mu.Lock()
			cause, why := stream.CauseEOF, "producer connection closed"
			if s.closed {
				cause, why = stream.CauseShutdown, "daemon shutting down"
			}
			s.mu.Unlock()
			cc.att.Finish(cause, why)
			<-cc.att.Done()
		}
		s.wg.Done()
	}()
	br := bufio.NewReaderSize(cc.c, 16<<10)
	for {
		// Wait for the first byte of the next frame: forever for a producer's connection (its EOF is the death
		// signal), at most IdleTimeout for others.
		var dl time.Time
		if cc.att == nil {
			dl = time.Now().Add(s.cfg.IdleTimeout)
		}
		_ = cc.c.SetReadDeadline(dl)
		if _, err := br.Peek(1); err != nil {
			if isTimeout(err) {
				s.m.rejected.WithLabelValues("idle").Inc()
				s.log.Debug("closing idle connection", "peer_pid", cc.pid)
			}
			return
		}
		_ = cc.c.SetReadDeadline(time.Now().Add(s.cfg.FrameTimeout))
		f, buf, err := sock.ReadFrame(br, s.cfg.MaxRequestBytes, cc.buf)
		cc.buf = buf
		if err != nil {
			s.frameError(cc, f, err)
			return
		}
		if !s.handleFrame(cc, f) {
			return
		}
	}
}

// frameError answers a frame that could not be read and is followed by closing the connection.
func (s *Server) frameError(cc *conn, f sock.Frame, err error) {
	var code string
	switch {
	case errors.Is(err, sock.ErrUnsupportedVersion):
		code = sock.CodeUnsupportedVersion
	case errors.Is(err, sock.ErrFrameTooLarge):
		code = sock.CodeTooLarge
	case errors.Is(err, sock.ErrFrameTooShort):
		code = sock.CodeBadRequest
	case isTimeout(err):
		s.m.rejected.WithLabelValues("frame_timeout").Inc()
		s.log.Warn("closing connection: frame not completed in time", "peer_pid", cc.pid, "timeout", s.cfg.FrameTimeout)
		return
	default: // EOF inside a frame, reset: nobody to answer
		s.log.Debug("connection ended inside a frame", "peer_pid", cc.pid, "err", err)
		return
	}
	s.m.requests.WithLabelValues("socket", f.Kind.String(), code).Inc()
	s.log.Warn("bad frame: replying with an error and closing", "peer_pid", cc.pid, "code", code, "err", err)
	s.reply(cc, f.Kind, sock.StatusError, sock.EncodeErrorBody(code, err.Error()))
}

// handleFrame serves one request; false closes the connection.
func (s *Server) handleFrame(cc *conn, f sock.Frame) bool {
	start := time.Now()
	var body []byte
	var err error
	switch {
	case f.Status != sock.StatusOK:
		err = errorf(sock.CodeBadRequest, "request status must be 0, got %d", f.Status)
	case !f.Kind.Known():
		err = errorf(sock.CodeUnknownKind, "unknown request kind %d (this daemon speaks kinds 1-%d of version %d)", f.Kind, sock.KindForget, sock.Version)
	default:
		body, err = s.dispatch(cc, f.Kind, f.Body)
	}
	code := "ok"
	status := sock.StatusOK
	if err != nil {
		var re *replyError
		if !errors.As(err, &re) {
			re = &replyError{code: sock.CodeInternal, msg: err.Error()}
			s.log.Error("request failed", "kind", f.Kind, "err", err)
		}
		code, status, body = re.code, sock.StatusError, sock.EncodeErrorBody(re.code, re.msg)
	}
	s.m.requests.WithLabelValues("socket", f.Kind.String(), code).Inc()
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("request", "kind", f.Kind, "code", code, "bytes", len(body), "duration", time.Since(start))
	}
	ok := s.reply(cc, f.Kind, status, body)
	n := len(body)
	releaseAfterReply(n)
	return ok
}

func (s *Server) reply(cc *conn, kind sock.Kind, status sock.Status, body []byte) bool {
	_ = cc.c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if err := sock.WriteFrame(cc.c, kind, status, body); err != nil {
		s.log.Warn("closing connection: cannot write reply", "peer_pid", cc.pid, "kind", kind, "err", err)
		return false
	}
	return true
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}

// indexConfig is the index configuration of a new stream: the ring's geometry and the daemon's policies.
func (s *Server) indexConfig(worker uint64, blockSize, maxBuffer uint32, publish *sock.Publish) index.Config {
	return index.Config{WorkerID: worker, BlockSize: blockSize, MaxBufferSize: int(maxBuffer), OnLoss: s.cfg.OnLoss,
		DumpShape: s.cfg.DumpShape, KeepTokens: s.eng.KeepTokens(publish != nil)}
}

// streamList returns the streams sorted by key (worker, then ALL, then ranks).
func (s *Server) streamList() []*entry {
	s.mu.Lock()
	out := make([]*entry, 0, len(s.streams))
	for _, st := range s.streams {
		out = append(out, st)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return compareKeys(out[i].key, out[j].key) < 0 })
	return out
}
