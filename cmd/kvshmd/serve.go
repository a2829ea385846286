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
	"strings"
	"syscall"

	"github.com/kvshm/kvshm/daemon"
	"github.com/kvshm/kvshm/proto/sock"
)

// serve runs the daemon: its flags (serveflags.go) become its configuration (serveconfig.go); what is left here is
// the wiring: the default state directory, the logger, the runtime's memory settings, the trace, the signals.
func serve(args []string, stderr io.Writer) int {
	o, err := parseServeFlags(args, os.Getenv, func(fs *flag.FlagSet) { serveUsage(fs, stderr) }, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if o == nil { // the flag package printed why, with the usage
		return exitUsage
	}
	cfg, cerr := o.config()
	if err = errors.Join(err, cerr); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintln(stderr, line)
		}
		return exitUsage
	}
	applyMemoryLimit(cfg.memoryLimit)
	if cfg.defaultStateDir {
		if cfg.daemon.StateDir, err = resolveStateDir(cfg.daemon.SocketPath); err != nil {
			fmt.Fprintf(stderr, "kvshmd serve: %v\n", err)
			return exitFailure
		}
	}
	startGCPolicy(cfg.gcHeadroom)
	hopts := &slog.HandlerOptions{Level: cfg.logLevel}
	var h slog.Handler = slog.NewTextHandler(stderr, hopts)
	if cfg.logJSON {
		h = slog.NewJSONHandler(stderr, hopts)
	}
	log := slog.New(h)
	if stopTrace := startTrace(os.Getenv("KVSHMD_TRACE"), log); stopTrace != nil {
		defer stopTrace()
	}
	cfg.daemon.Version, cfg.daemon.Logger = buildVersion(), log
	srv, err := daemon.New(cfg.daemon)
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
		case errors.Is(err, daemon.ErrStateDirLocked):
			hint = "another kvshmd uses this --state-dir: stop it, or give this daemon its own --state-dir"
		case errors.Is(err, daemon.ErrUnsafeCleanupDir):
			hint = "--cleanup-dir removes only a directory made for this daemon (the Python launcher passes it with its --cleanup-token); drop --cleanup-dir"
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

// serveUsage prints serve's help: what it does, then every flag with its default (fs.PrintDefaults).
func serveUsage(fs *flag.FlagSet, w io.Writer) {
	fmt.Fprint(w, `Usage: kvshmd serve [flags]

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

// resolveStateDir returns the default state directory (docs/lifecycle.md, "Daemon modes": a shared kvshmd keeps
// checkpoints on tmpfs, so a SIGKILLed daemon's successor restores the index): $XDG_RUNTIME_DIR/kvshm/state, else
// /dev/shm/kvshm-<uid>/state, for the default socket; <socket>.state for any other, so that two daemons (tests,
// several shared daemons) never share one. With it, --checkpoint-interval defaults to defaultCkptInterval
// (config). Its parent, when kvshmd creates it, is created 0700 and must be yours and not group/other writable.
func resolveStateDir(socket string) (string, error) {
	if socket != sock.DefaultSocketPath() {
		return socket + ".state", nil // the socket's directory is checked (0700, ours) by Listen
	}
	parent := filepath.Join(os.TempDir(), "kvshm-"+strconv.Itoa(os.Getuid()))
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		parent = filepath.Join(d, "kvshm")
	} else if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		parent = filepath.Join("/dev/shm", "kvshm-"+strconv.Itoa(os.Getuid()))
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("default state directory: %w", err)
	}
	if err := sock.CheckSocketDir(parent); err != nil {
		return "", fmt.Errorf("default state directory: %w (pass --state-dir)", err)
	}
	return filepath.Join(parent, "state"), nil
}
