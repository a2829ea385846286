package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/kvshm/kvshm/daemon"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/sock"
)

type serveOpts struct {
	socket, http, mode, logLevel, logFormat, stateDir   string
	cleanupDir                                          string
	zmqHeartbeat                                        time.Duration
	zmqSnapshots                                        bool
	zmqSnapshotBuilds, zmqSnapshotChunk, zmqReplayFill  int
	onLoss, dumpShape, zmqSeqBase                       string
	parentPID, maxConns, httpMaxConns, rankPorts        int
	maxRequest                                          uint
	idle, frame, write, query, pidCheck, parentInterval time.Duration
	ckptInterval                                        time.Duration
}

func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvshmd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o serveOpts
	def := daemon.DefaultConfig()
	var envErr error
	dur := func(env string, def time.Duration) time.Duration {
		if v := os.Getenv(env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				envErr = fmt.Errorf("%s=%q: %v", env, v, err)
				return def
			}
			return d
		}
		return def
	}
	num := func(env string, def int) int {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				envErr = fmt.Errorf("%s=%q: not an integer", env, v)
				return def
			}
			return n
		}
		return def
	}
	fs.StringVar(&o.socket, "socket", envOr(def.SocketPath, "KVSHMD_SOCKET"), "Unix socket path; its directory is created 0700 and must be owned by you and not group/other writable (env KVSHMD_SOCKET)")
	fs.StringVar(&o.mode, "socket-mode", envOr(fmt.Sprintf("%04o", def.SocketMode), "KVSHMD_SOCKET_MODE"), "socket file mode, octal (env KVSHMD_SOCKET_MODE)")
	fs.StringVar(&o.http, "http", envOr("", "KVSHMD_HTTP"), "HTTP listen address for /kv_recover, /metrics, /healthz, e.g. 127.0.0.1:9400; off when empty (env KVSHMD_HTTP)")
	fs.StringVar(&o.stateDir, "state-dir", envOr(defaultStateDir, "KVSHMD_STATE_DIR"), "directory for index checkpoints: written at SIGTERM/SIGINT after the final drain, restored when a producer reattaches the same ring, so a planned restart loses nothing; created 0700, must be owned by you with no group/other permissions; the default is on tmpfs (with another --socket: <socket>.state beside it, so two daemons never share one) and comes with --checkpoint-interval "+defaultCkptInterval.String()+"; --state-dir '' turns checkpoints off (env KVSHMD_STATE_DIR)")
	fs.DurationVar(&o.ckptInterval, "checkpoint-interval", dur("KVSHMD_CHECKPOINT_INTERVAL", 0), "with --state-dir: also checkpoint each stream while it runs, when this long has passed since its last checkpoint with records applied since, or when they fill half its ring, and release the ring head only up to a written checkpoint, so a crash (SIGKILL, OOM) loses nothing either; 0 = only at shutdown; default "+defaultCkptInterval.String()+" with the default --state-dir, else 0 (env KVSHMD_CHECKPOINT_INTERVAL)")
	fs.DurationVar(&o.zmqHeartbeat, "zmq-heartbeat", dur("KVSHMD_ZMQ_HEARTBEAT", def.ZMQHeartbeat), "a stream published on ZMQ that published nothing for this long publishes an empty batch with the next seq, so an idle engine's restarted router finds its gap and replays (docs/lifecycle.md); 0 = off (env KVSHMD_ZMQ_HEARTBEAT)")
	fs.BoolVar(&o.zmqSnapshots, "zmq-snapshots", envOr("true", "KVSHMD_ZMQ_SNAPSHOTS") != "false", "a publishing stream keeps its blocks' tokens (~(block_size+2)*4 bytes per block) and answers a replay request older than its replay buffer with the state as of its last batch, then the batches after it, so a router that was away longer than the buffer converges (docs/replay-snapshots.md); false = the buffer only, as vLLM's publisher (env KVSHMD_ZMQ_SNAPSHOTS)")
	fs.IntVar(&o.zmqSnapshotChunk, "zmq-snapshot-chunk", num("KVSHMD_ZMQ_SNAPSHOT_CHUNK", 0), "split a replay snapshot's batch of a rank into batches of about this many bytes, all under its seq (Dynamo 1.6.1 applies them all; a consumer that keeps one batch per seq would not); 0: one batch per rank (env KVSHMD_ZMQ_SNAPSHOT_CHUNK)")
	fs.IntVar(&o.zmqReplayFill, "zmq-replay-fill", num("KVSHMD_ZMQ_REPLAY_FILL", def.ZMQReplayFill), "a replay reply carries every seq from the requested one to the newest, as vLLM's do: the seqs of heartbeats, of a wiped incarnation and before a snapshot go as empty batches, at most this many per reply (a reply needing more keeps its gaps, counted); llm-d's replay consumer refuses a reply with a gap (docs/replay-snapshots.md); 0 = off (env KVSHMD_ZMQ_REPLAY_FILL)")
	fs.StringVar(&o.zmqSeqBase, "zmq-seq-base", envOr("clock", "KVSHMD_ZMQ_SEQ_BASE"), "where a stream's wire seqs start in this daemon: clock = above the clock in µs (and again at each engine incarnation), so no restart of anything reuses a seq (Dynamo's routers); zero = from 1, continuing across incarnations and restored checkpoints, as llm-d's replay consumer needs (it asks from seq 0 on connect); a daemon restarted without its state then starts from 1 again (docs/lifecycle.md) (env KVSHMD_ZMQ_SEQ_BASE)")
	fs.IntVar(&o.zmqSnapshotBuilds, "zmq-snapshot-builds", num("KVSHMD_ZMQ_SNAPSHOT_BUILDS", daemon.DefaultSnapshotBuilds), "replay snapshots built at once across all streams; a replay needing one beyond it waits for a slot, and replies on one stream share one build while its buffer covers the batches after it (env KVSHMD_ZMQ_SNAPSHOT_BUILDS)")
	fs.StringVar(&o.cleanupDir, "cleanup-dir", envOr("", "KVSHMD_CLEANUP_DIR"), "at exit, after everything is closed, remove this directory recursively, only if it is a directory owned by you with mode 0700 (the private directory the Python launcher made); anything else is refused and logged (env KVSHMD_CLEANUP_DIR)")
	fs.StringVar(&o.onLoss, "on-loss", envOr(def.OnLoss.String(), "KVSHMD_ON_LOSS"), "answer to a recovery query that misses events kvshm lost (ring full, corrupt record, unknown history): best-effort = what Dynamo would answer from the events applied, marked with the Kvshm-State: incomplete and Kvshm-Lost-Events headers, counted and logged; error = the Error variant naming the loss until a Cleared (env KVSHMD_ON_LOSS)")
	fs.StringVar(&o.dumpShape, "dump-shape", envOr(def.DumpShape.String(), "KVSHMD_DUMP_SHAPE"), "TreeDump shape: chains = Dynamo 1.6.1's merged chains with reset_scope and residency_domain; blocks = one single-block Stored event per block, as older Dynamo (env KVSHMD_DUMP_SHAPE)")
	fs.IntVar(&o.rankPorts, "rank-ports", num("KVSHMD_RANK_PORTS", 0), "with --http: port BASE+r on the --http host answers /kv_recover for dp_rank r of the only worker (what pod discovery calls: recover_port + dp_rank), opened when the daemon first holds a stream covering r; a bind failure is logged and counted; 0 = off (env KVSHMD_RANK_PORTS)")
	fs.IntVar(&o.parentPID, "parent-pid", num("KVSHMD_PARENT_PID", 0), "drain and exit when this process is gone: its pidfd is waited on (no polling), or, without pidfds, it is polled every --parent-poll (env KVSHMD_PARENT_PID)")
	fs.DurationVar(&o.parentInterval, "parent-poll", dur("KVSHMD_PARENT_POLL", def.ParentPoll), "poll period of --parent-pid where the kernel has no pidfd (env KVSHMD_PARENT_POLL)")
	fs.UintVar(&o.maxRequest, "max-request-bytes", uint(num("KVSHMD_MAX_REQUEST_BYTES", int(def.MaxRequestBytes))), "largest request frame accepted; larger ones get too_large and the connection is closed (env KVSHMD_MAX_REQUEST_BYTES)")
	fs.IntVar(&o.maxConns, "max-conns", num("KVSHMD_MAX_CONNS", def.MaxConns), "concurrent socket connections; beyond it clients get busy (env KVSHMD_MAX_CONNS)")
	fs.IntVar(&o.httpMaxConns, "http-max-conns", num("KVSHMD_HTTP_MAX_CONNS", def.HTTPMaxConns), "concurrent HTTP connections; beyond it clients get 503 (env KVSHMD_HTTP_MAX_CONNS)")
	fs.DurationVar(&o.idle, "idle-timeout", dur("KVSHMD_IDLE_TIMEOUT", def.IdleTimeout), "close a non-producer connection that sends nothing for this long (env KVSHMD_IDLE_TIMEOUT)")
	fs.DurationVar(&o.frame, "frame-timeout", dur("KVSHMD_FRAME_TIMEOUT", def.FrameTimeout), "a started request frame must arrive completely within this (env KVSHMD_FRAME_TIMEOUT)")
	fs.DurationVar(&o.write, "write-timeout", dur("KVSHMD_WRITE_TIMEOUT", def.WriteTimeout), "a reply must be written within this, else the connection is closed (env KVSHMD_WRITE_TIMEOUT)")
	fs.DurationVar(&o.query, "query-timeout", dur("KVSHMD_QUERY_TIMEOUT", def.QueryTimeout), "bound on one query, including waiting for a dump build (env KVSHMD_QUERY_TIMEOUT)")
	fs.DurationVar(&o.pidCheck, "pid-check-interval", dur("KVSHMD_PID_CHECK_INTERVAL", def.PIDCheckInterval), "backstop check that each producer's pid is alive (env KVSHMD_PID_CHECK_INTERVAL)")
	var bo boundsOpts
	bo.register(fs, num)
	fs.StringVar(&o.logLevel, "log-level", envOr("info", "KVSHMD_LOG_LEVEL"), "debug, info, warn or error (env KVSHMD_LOG_LEVEL)")
	fs.StringVar(&o.logFormat, "log-format", envOr("text", "KVSHMD_LOG_FORMAT"), "text or json (env KVSHMD_LOG_FORMAT)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: kvshmd serve [flags]

Runs the daemon. Producers attach their rings over the socket; queries (events, dump, stats, match, health) use
the same socket. Readiness: the socket answers HEALTH. SIGTERM or SIGINT: stop accepting, drain every ring one
last time, exit 0. Every flag has an environment variable; the flag wins.

Streams: a producer that attaches with a dp_rank owns that rank's stream of its worker (one producer per rank, its
own seq space); without one, the worker's ALL stream. With --http, GET /kv_recover answers the only stream,
/workers/{W}/kv_recover worker W, /workers/{W}/dp/{R}/kv_recover rank R (its stream, or the rank's view of the ALL
stream); --rank-ports BASE adds port BASE+R for rank R of the only worker.

Losses: an answer that misses events kvshm lost (ring full, corrupt record, unknown history) is by default the best
state kvshm has, marked (headers Kvshm-State: incomplete and Kvshm-Lost-Events, kvshm_incomplete_answers_total, a
warn log line, "incomplete" in stats) until a Cleared; --on-loss=error answers the Error variant instead.

Engines: when a producer's engine ends (DETACH, ring CLOSED, its pid gone; a new ring epoch ends the previous one)
its stream's index applies a Cleared, and a stream published on ZMQ publishes [AllBlocksCleared] with the next seq
and again when a new engine starts on it. Seqs on the wire are kvshmd's (+1 per batch, starting above the clock in
µs), an idle stream heartbeats (--zmq-heartbeat), and with --parent-pid gone every engine's end is published and
flushed before exit. docs/lifecycle.md is the contract.

Restarts: a new daemon resumes each ring at the head the old one stored. By default the state directory is on
tmpfs with --checkpoint-interval 10s (see --state-dir), so nothing is lost. Without --state-dir ('') the index
state before that head is gone: the stream reports unknown history (answers incomplete, or Error with --on-loss=error) until the
engine sends a Cleared. With --state-dir, a SIGTERM/SIGINT shutdown writes one checkpoint per attached stream
(w<worker>-<ring epoch>.ckpt, w<worker>r<rank>-<ring epoch>.ckpt for a per-rank stream) and
the next daemon restores it when that producer reattaches the same ring at the same head: nothing is lost. A crash
(SIGKILL, OOM) writes none and still reports unknown history, unless --checkpoint-interval D is set too: then each
stream is also checkpointed while it runs (D after its last checkpoint when records were applied since, or as soon
as the applied-but-unreleased records fill half its ring) and the ring head is released only right after a
checkpoint of exactly that head is on disk. The ring keeps every record since the newest checkpoint, so after a
crash the next daemon restores it and replays the ring: nothing is lost. The price: up to half of each ring (more
while a checkpoint is written) holds applied records, so a stopped daemon is absorbed by correspondingly less ring
before the producer drops events. A checkpoint that is corrupt or does not match the ring is logged, counted
(kvshm_checkpoint_restores_total) and ignored; a failed write is counted (kvshm_checkpoint_writes_total) and the head
is released anyway, so a crash before the next good checkpoint reports unknown history.

Diagnostics: KVSHMD_TRACE=FILE writes Go's execution trace, with CPU profile samples, of the whole serve to FILE
(go tool trace FILE): which goroutine waited on what, and what a long-running one was doing.

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "kvshmd serve: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if envErr != nil {
		fmt.Fprintf(stderr, "kvshmd serve: bad environment variable: %v\n", envErr)
		return exitUsage
	}
	mode, err := strconv.ParseUint(o.mode, 8, 32)
	if err != nil || mode == 0 || mode > 0o777 {
		fmt.Fprintf(stderr, "kvshmd serve: --socket-mode %q: want an octal mode such as 0600\n", o.mode)
		return exitUsage
	}
	if o.maxRequest < 64 || o.maxRequest > sock.MaxResponse {
		fmt.Fprintf(stderr, "kvshmd serve: --max-request-bytes %d: want 64..%d\n", o.maxRequest, sock.MaxResponse)
		return exitUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintf(stderr, "kvshmd serve: --log-level %q: want debug, info, warn or error\n", o.logLevel)
		return exitUsage
	}
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch o.logFormat {
	case "text":
		h = slog.NewTextHandler(stderr, hopts)
	case "json":
		h = slog.NewJSONHandler(stderr, hopts)
	default:
		fmt.Fprintf(stderr, "kvshmd serve: --log-format %q: want text or json\n", o.logFormat)
		return exitUsage
	}
	if o.zmqHeartbeat < 0 {
		fmt.Fprintf(stderr, "kvshmd serve: --zmq-heartbeat %v: want 0 (off) or a positive duration\n", o.zmqHeartbeat)
		return exitUsage
	}
	if o.zmqSeqBase != "clock" && o.zmqSeqBase != "zero" {
		fmt.Fprintf(stderr, "kvshmd serve: --zmq-seq-base %q: want clock or zero\n", o.zmqSeqBase)
		return exitUsage
	}
	if o.zmqReplayFill < 0 {
		fmt.Fprintf(stderr, "kvshmd serve: --zmq-replay-fill %d: want 0 (off) or a positive count\n", o.zmqReplayFill)
		return exitUsage
	}
	onLoss, ok := byName(o.onLoss, index.LossBestEffort, index.LossError)
	if !ok {
		fmt.Fprintf(stderr, "kvshmd serve: --on-loss %q: want best-effort or error\n", o.onLoss)
		return exitUsage
	}
	shape, ok := byName(o.dumpShape, index.DumpChains, index.DumpBlocks)
	if !ok {
		fmt.Fprintf(stderr, "kvshmd serve: --dump-shape %q: want chains or blocks\n", o.dumpShape)
		return exitUsage
	}
	if o.rankPorts != 0 && (o.rankPorts < 1 || o.rankPorts > 65535 || o.http == "") {
		fmt.Fprintf(stderr, "kvshmd serve: --rank-ports %d: want a base port in 1..65535 together with --http (its host is used)\n", o.rankPorts)
		return exitUsage
	}
	bounds, mem, err := bo.bounds()
	if err != nil {
		fmt.Fprintf(stderr, "kvshmd serve: %v\n", err)
		return exitUsage
	}
	headroom, err := bo.gcHeadroomBytes()
	if err != nil {
		fmt.Fprintf(stderr, "kvshmd serve: %v\n", err)
		return exitUsage
	}
	applyMemoryLimit(mem)
	if o.ckptInterval < 0 || (o.ckptInterval > 0 && o.stateDir == "") {
		fmt.Fprintf(stderr, "kvshmd serve: --checkpoint-interval %v: want 0 (off) or a positive duration together with --state-dir\n", o.ckptInterval)
		return exitUsage
	}
	if err := o.stateDefaults(fs); err != nil {
		fmt.Fprintf(stderr, "kvshmd serve: %v\n", err)
		return exitFailure
	}
	startGCPolicy(headroom)
	log := slog.New(h)
	if stopTrace := startTrace(os.Getenv("KVSHMD_TRACE"), log); stopTrace != nil {
		defer stopTrace()
	}
	srv, err := daemon.New(daemon.Config{
		SocketPath: o.socket, SocketMode: os.FileMode(mode), HTTPAddr: o.http, ParentPID: o.parentPID,
		MaxRequestBytes: uint32(o.maxRequest), MaxConns: o.maxConns, HTTPMaxConns: o.httpMaxConns, IdleTimeout: o.idle, FrameTimeout: o.frame,
		WriteTimeout: o.write, QueryTimeout: o.query, PIDCheckInterval: o.pidCheck, ParentPoll: o.parentInterval,
		StateDir: o.stateDir, CheckpointInterval: o.ckptInterval, OnLoss: onLoss, DumpShape: shape, RankPortsBase: o.rankPorts,
		ZMQHeartbeat: o.zmqHeartbeat, ZMQNoSnapshots: !o.zmqSnapshots, ZMQSnapshotBuilds: o.zmqSnapshotBuilds,
		ZMQSnapshotChunk: o.zmqSnapshotChunk, ZMQReplayFill: o.zmqReplayFill, ZMQSeqZero: o.zmqSeqBase == "zero",
		CleanupDir: o.cleanupDir,
		Bounds:     bounds, Version: buildVersion(), Logger: log,
	})
	if err != nil {
		log.Error("cannot start", "err", err)
		return exitFailure
	}
	if err := srv.Listen(); err != nil {
		hint := ""
		switch {
		case errors.Is(err, daemon.ErrAlreadyRunning):
			hint = "stop the other daemon or use another --socket"
		case errors.Is(err, sock.ErrUnsafeDir):
			hint = "use a directory you own with mode 0700 (or let kvshmd create it)"
		case errors.Is(err, daemon.ErrUnsafeStateDir):
			hint = "--state-dir must be a directory you own with mode 0700 (or let kvshmd create it)"
		case errors.Is(err, daemon.ErrNotSocket):
			hint = "the path is a regular file or directory; remove it or choose another --socket"
		}
		log.Error("cannot listen", "err", err, "hint", hint)
		return exitFailure
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := srv.Serve(ctx); err != nil {
		log.Error("serve failed", "err", err)
		return exitFailure
	}
	return exitOK
}

// defaultCkptInterval is --checkpoint-interval's default with the default --state-dir.
const defaultCkptInterval = 10 * time.Second

// defaultStateDir stands for "the default" in --state-dir's flag value; stateDefaults resolves it.
const defaultStateDir = "(tmpfs default)"

// stateDefaults resolves the default state directory (docs/lifecycle.md, "Daemon modes": a shared kvshmd keeps
// checkpoints on tmpfs, so a SIGKILLed daemon's successor restores the index): $XDG_RUNTIME_DIR/kvshm/state, else
// /dev/shm/kvshm-<uid>/state, for the default socket; <socket>.state for any other, so that two daemons (tests,
// several shared daemons) never share one. With it, --checkpoint-interval defaults to 10 s. Its parent, when
// kvshmd creates it, is created 0700 and must be yours and not group/other writable.
func (o *serveOpts) stateDefaults(fs *flag.FlagSet) error {
	if o.stateDir != defaultStateDir {
		return nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["checkpoint-interval"] && os.Getenv("KVSHMD_CHECKPOINT_INTERVAL") == "" {
		o.ckptInterval = defaultCkptInterval
	}
	if o.socket != sock.DefaultSocketPath() {
		o.stateDir = o.socket + ".state" // the socket's directory is checked (0700, ours) by Listen
		return nil
	}
	parent := filepath.Join(os.TempDir(), "kvshm-"+strconv.Itoa(os.Getuid()))
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		parent = filepath.Join(d, "kvshm")
	} else if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		parent = filepath.Join("/dev/shm", "kvshm-"+strconv.Itoa(os.Getuid()))
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return fmt.Errorf("default state directory: %w", err)
	}
	if err := sock.CheckSocketDir(parent); err != nil {
		return fmt.Errorf("default state directory: %w (pass --state-dir)", err)
	}
	o.stateDir = filepath.Join(parent, "state")
	return nil
}

// byName returns the value among vals whose String() is name (a flag naming an enum value).
func byName[T fmt.Stringer](name string, vals ...T) (T, bool) {
	for _, v := range vals {
		if v.String() == name {
			return v, true
		}
	}
	var zero T
	return zero, false
}
