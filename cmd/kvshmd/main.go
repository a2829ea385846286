// Command kvshmd is the kvshm daemon: it drains the shared-memory rings of KV-cache event producers into per-worker
// indexes and answers recovery queries over a Unix socket (and optionally HTTP). The same binary carries the
// operator subcommands that speak the socket protocol. Run `kvshmd help` for usage.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvshm/kvshm/daemon"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/shm"
)

// version is set at link time (-ldflags "-X main.version=v1.2.3"); otherwise the module version or "dev".
var version = ""

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1 // the daemon answered with an error, or serve failed
	exitUsage       = 2 // bad command line
	exitUnreachable = 3 // cannot connect to the daemon
)

const usageTop = `kvshmd: the kvshm daemon and its operator commands.

Usage:
  kvshmd serve   [flags]                 run the daemon (see kvshmd serve --help)
  kvshmd health  [--socket P]            check that the daemon answers
  kvshmd stats   [--socket P] [--worker W] [--dp-rank R]
  kvshmd events  [--socket P] [--worker W] [--dp-rank R] [--start N] [--end N]
  kvshmd dump    [--socket P] [--worker W] [--dp-rank R]
  kvshmd match   [--socket P] [--worker W] [--dp-rank R] --tokens 1,2,3 [--lora NAME] [--eagle]
  kvshmd forget  [--socket P] --worker W [--dp-rank R]  drop a stream whose producer is gone (index, metrics)
  kvshmd inspect [--json] RINGFILE       read a ring file's header (no daemon needed)
  kvshmd version

The socket defaults to $KVSHMD_SOCKET, then $KVSHM_SOCKET, then $XDG_RUNTIME_DIR/kvshm/kvshmd.sock, then
/tmp/kvshm-<uid>/kvshmd.sock. events/dump print the WorkerKvQueryResponse JSON exactly as the daemon sent it.
--dp-rank selects the per-rank stream of that rank (a producer attached with dp_rank), else the rank's view of the
worker's ALL stream (events/dump); forget --dp-rank drops exactly that per-rank stream.

Exit codes: 0 ok; 1 the daemon answered with an error (or serve failed); 2 usage error; 3 daemon unreachable.
`

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageTop)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(rest, stderr)
	case "health", "stats", "events", "dump", "match", "forget":
		return query(cmd, rest, stdout, stderr)
	case "inspect":
		return inspect(rest, stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, buildVersion())
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageTop)
		return exitOK
	}
	fmt.Fprintf(stderr, "kvshmd: unknown command %q\n\n%s", cmd, usageTop)
	return exitUsage
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// envOr returns the first non-empty environment variable, else def.
func envOr(def string, names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return def
}

type serveOpts struct {
	socket, http, mode, logLevel, logFormat, stateDir   string
	onLoss, dumpShape                                   string
	parentPID, maxConns, httpMaxConns, rankPorts        int
	maxRequest                                          uint
	idle, frame, write, query, pidCheck, parentInterval time.Duration
	ckptInterval                                        time.Duration
}

func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvshmd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o serveOpts
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
	fs.StringVar(&o.socket, "socket", envOr(daemon.DefaultSocketPath(), "KVSHMD_SOCKET"), "Unix socket path; its directory is created 0700 and must be owned by you and not group/other writable (env KVSHMD_SOCKET)")
	fs.StringVar(&o.mode, "socket-mode", envOr("0600", "KVSHMD_SOCKET_MODE"), "socket file mode, octal (env KVSHMD_SOCKET_MODE)")
	fs.StringVar(&o.http, "http", envOr("", "KVSHMD_HTTP"), "HTTP listen address for /kv_recover, /metrics, /healthz, e.g. 127.0.0.1:9400; off when empty (env KVSHMD_HTTP)")
	fs.StringVar(&o.stateDir, "state-dir", envOr("", "KVSHMD_STATE_DIR"), "directory for index checkpoints: written at SIGTERM/SIGINT after the final drain, restored when a producer reattaches the same ring, so a planned restart loses nothing; created 0700, must be owned by you with no group/other permissions; off when empty (env KVSHMD_STATE_DIR)")
	fs.DurationVar(&o.ckptInterval, "checkpoint-interval", dur("KVSHMD_CHECKPOINT_INTERVAL", 0), "with --state-dir: also checkpoint each stream while it runs, when this long has passed since its last checkpoint with records applied since, or when they fill half its ring, and release the ring head only up to a written checkpoint, so a crash (SIGKILL, OOM) loses nothing either; 0 = only at shutdown (env KVSHMD_CHECKPOINT_INTERVAL)")
	fs.StringVar(&o.onLoss, "on-loss", envOr("best-effort", "KVSHMD_ON_LOSS"), "answer to a recovery query that misses events kvshm lost (ring full, corrupt record, unknown history): best-effort = what Dynamo would answer from the events applied, marked with the Kvshm-State: incomplete and Kvshm-Lost-Events headers, counted and logged; error = the Error variant naming the loss until a Cleared (env KVSHMD_ON_LOSS)")
	fs.StringVar(&o.dumpShape, "dump-shape", envOr("chains", "KVSHMD_DUMP_SHAPE"), "TreeDump shape: chains = Dynamo 1.6.1's merged chains with reset_scope and residency_domain; blocks = one single-block Stored event per block, as older Dynamo (env KVSHMD_DUMP_SHAPE)")
	fs.IntVar(&o.rankPorts, "rank-ports", num("KVSHMD_RANK_PORTS", 0), "with --http: port BASE+r on the --http host answers /kv_recover for dp_rank r of the only worker (what pod discovery calls: recover_port + dp_rank), opened when the daemon first holds a stream covering r; a bind failure is logged and counted; 0 = off (env KVSHMD_RANK_PORTS)")
	fs.IntVar(&o.parentPID, "parent-pid", num("KVSHMD_PARENT_PID", 0), "drain and exit when this process is gone, polled every --parent-poll (env KVSHMD_PARENT_PID)")
	fs.DurationVar(&o.parentInterval, "parent-poll", dur("KVSHMD_PARENT_POLL", 200*time.Millisecond), "poll period of --parent-pid (env KVSHMD_PARENT_POLL)")
	fs.UintVar(&o.maxRequest, "max-request-bytes", uint(num("KVSHMD_MAX_REQUEST_BYTES", daemon.DefaultMaxRequest)), "largest request frame accepted; larger ones get too_large and the connection is closed (env KVSHMD_MAX_REQUEST_BYTES)")
	fs.IntVar(&o.maxConns, "max-conns", num("KVSHMD_MAX_CONNS", 1024), "concurrent socket connections; beyond it clients get busy (env KVSHMD_MAX_CONNS)")
	fs.IntVar(&o.httpMaxConns, "http-max-conns", num("KVSHMD_HTTP_MAX_CONNS", 256), "concurrent HTTP connections; beyond it clients get 503 (env KVSHMD_HTTP_MAX_CONNS)")
	fs.DurationVar(&o.idle, "idle-timeout", dur("KVSHMD_IDLE_TIMEOUT", 5*time.Minute), "close a non-producer connection that sends nothing for this long (env KVSHMD_IDLE_TIMEOUT)")
	fs.DurationVar(&o.frame, "frame-timeout", dur("KVSHMD_FRAME_TIMEOUT", 10*time.Second), "a started request frame must arrive completely within this (env KVSHMD_FRAME_TIMEOUT)")
	fs.DurationVar(&o.write, "write-timeout", dur("KVSHMD_WRITE_TIMEOUT", 60*time.Second), "a reply must be written within this, else the connection is closed (env KVSHMD_WRITE_TIMEOUT)")
	fs.DurationVar(&o.query, "query-timeout", dur("KVSHMD_QUERY_TIMEOUT", 120*time.Second), "bound on one query, including waiting for a dump build (env KVSHMD_QUERY_TIMEOUT)")
	fs.DurationVar(&o.pidCheck, "pid-check-interval", dur("KVSHMD_PID_CHECK_INTERVAL", time.Second), "backstop check that each producer's pid is alive (env KVSHMD_PID_CHECK_INTERVAL)")
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

Restarts: a new daemon resumes each ring at the head the old one stored. Without --state-dir the index state before
that head is gone: the stream reports unknown history (answers incomplete, or Error with --on-loss=error) until the
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
	if o.maxRequest < 64 || o.maxRequest > daemon.MaxResponse {
		fmt.Fprintf(stderr, "kvshmd serve: --max-request-bytes %d: want 64..%d\n", o.maxRequest, daemon.MaxResponse)
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
	if o.ckptInterval < 0 || (o.ckptInterval > 0 && o.stateDir == "") {
		fmt.Fprintf(stderr, "kvshmd serve: --checkpoint-interval %v: want 0 (off) or a positive duration together with --state-dir\n", o.ckptInterval)
		return exitUsage
	}
	var onLoss index.LossPolicy
	switch o.onLoss {
	case "best-effort":
		onLoss = index.LossBestEffort
	case "error":
		onLoss = index.LossError
	default:
		fmt.Fprintf(stderr, "kvshmd serve: --on-loss %q: want best-effort or error\n", o.onLoss)
		return exitUsage
	}
	var shape index.DumpShape
	switch o.dumpShape {
	case "chains":
		shape = index.DumpChains
	case "blocks":
		shape = index.DumpBlocks
	default:
		fmt.Fprintf(stderr, "kvshmd serve: --dump-shape %q: want chains or blocks\n", o.dumpShape)
		return exitUsage
	}
	if o.rankPorts != 0 && (o.rankPorts < 1 || o.rankPorts > 65535 || o.http == "") {
		fmt.Fprintf(stderr, "kvshmd serve: --rank-ports %d: want a base port in 1..65535 together with --http (its host is used)\n", o.rankPorts)
		return exitUsage
	}
	log := slog.New(h)
	srv, err := daemon.New(daemon.Config{
		SocketPath: o.socket, SocketMode: os.FileMode(mode), HTTPAddr: o.http, ParentPID: o.parentPID,
		MaxRequestBytes: uint32(o.maxRequest), MaxConns: o.maxConns, HTTPMaxConns: o.httpMaxConns, IdleTimeout: o.idle, FrameTimeout: o.frame,
		WriteTimeout: o.write, QueryTimeout: o.query, PIDCheckInterval: o.pidCheck, ParentPoll: o.parentInterval,
		StateDir: o.stateDir, CheckpointInterval: o.ckptInterval, OnLoss: onLoss, DumpShape: shape, RankPortsBase: o.rankPorts,
		Version: buildVersion(), Logger: log,
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
		case errors.Is(err, daemon.ErrUnsafeDir):
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

// optRank is a flag.Value for an optional u32 dp_rank.
type optRank struct{ v *uint32 }

func (o *optRank) String() string {
	if o.v == nil {
		return ""
	}
	return strconv.FormatUint(uint64(*o.v), 10)
}

func (o *optRank) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("want an unsigned 32-bit integer")
	}
	r := uint32(n)
	o.v = &r
	return nil
}

// optUint is a flag.Value for an optional u64.
type optUint struct{ v *uint64 }

func (o *optUint) String() string {
	if o.v == nil {
		return ""
	}
	return strconv.FormatUint(*o.v, 10)
}

func (o *optUint) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("want an unsigned integer")
	}
	o.v = &n
	return nil
}

func query(cmd string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvshmd "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", envOr(daemon.DefaultSocketPath(), "KVSHMD_SOCKET", "KVSHM_SOCKET"), "daemon socket (env KVSHMD_SOCKET, KVSHM_SOCKET)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	var worker, start, end optUint
	var rank optRank
	if cmd != "health" {
		help := "worker_id (default: the only stream)"
		rhelp := "dp_rank: the per-rank stream of that rank, else the rank's view of the worker's ALL stream"
		switch cmd {
		case "forget":
			help = "worker_id of the stream to drop (required)"
			rhelp = "dp_rank of the per-rank stream to drop (default: the worker's ALL stream, or its only stream)"
		case "stats":
			rhelp = "dp_rank: for each worker its stream of that rank, else its ALL stream"
		}
		fs.Var(&worker, "worker", help)
		fs.Var(&rank, "dp-rank", rhelp)
	}
	if cmd == "events" {
		fs.Var(&start, "start", "first event id (inclusive; omit for a dump)")
		fs.Var(&end, "end", "last event id (inclusive)")
	}
	var tokens, lora *string
	var eagle *bool
	if cmd == "match" {
		tokens = fs.String("tokens", "", "comma-separated token ids (required)")
		lora = fs.String("lora", "", "LoRA adapter name (default: base model)")
		eagle = fs.Bool("eagle", false, "Eagle windows (block_size+1 tokens)")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "kvshmd %s: unexpected argument %q\n", cmd, fs.Arg(0))
		return exitUsage
	}
	if cmd == "forget" && worker.v == nil {
		fmt.Fprintln(stderr, "kvshmd forget: --worker is required (list the streams with `kvshmd stats`)")
		return exitUsage
	}
	var toks []uint32
	if cmd == "match" {
		if *tokens == "" {
			fmt.Fprintln(stderr, "kvshmd match: --tokens is required (e.g. --tokens 1,2,3)")
			return exitUsage
		}
		for _, f := range strings.Split(*tokens, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
			if err != nil {
				fmt.Fprintf(stderr, "kvshmd match: token %q is not a u32\n", f)
				return exitUsage
			}
			toks = append(toks, uint32(n))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c, err := daemon.Dial(ctx, *socket)
	if err != nil {
		fmt.Fprintf(stderr, "kvshmd %s: cannot reach the daemon: %v\n  is `kvshmd serve` running? point --socket (or KVSHMD_SOCKET) at its socket\n", cmd, err)
		return exitUnreachable
	}
	defer c.Close()
	var out []byte
	switch cmd {
	case "health":
		var r daemon.HealthReply
		if r, err = c.Health(ctx); err == nil {
			out, err = json.MarshalIndent(r, "", "  ")
		}
	case "stats":
		var r daemon.StatsReply
		if r, err = c.StatsOf(ctx, daemon.WorkerRequest{WorkerID: worker.v, DpRank: rank.v}); err == nil {
			out, err = json.MarshalIndent(r, "", "  ")
		}
	case "events":
		out, err = c.EventsOf(ctx, daemon.EventsRequest{WorkerID: worker.v, Start: start.v, End: end.v, DpRank: rank.v})
	case "dump":
		out, err = c.DumpOf(ctx, daemon.WorkerRequest{WorkerID: worker.v, DpRank: rank.v})
	case "forget":
		if err = c.ForgetStream(ctx, daemon.WorkerRequest{WorkerID: worker.v, DpRank: rank.v}); err == nil {
			out = []byte("{}")
		}
	case "match":
		req := daemon.MatchRequest{WorkerID: worker.v, Tokens: toks, IsEagle: *eagle, DpRank: rank.v}
		if *lora != "" {
			req.LoraName = lora
		}
		var r daemon.MatchReply
		if r, err = c.Match(ctx, req); err == nil {
			out, err = json.MarshalIndent(r, "", "  ")
		}
	}
	if err != nil {
		var re *daemon.RemoteError
		if errors.As(err, &re) {
			fmt.Fprintf(stderr, "kvshmd %s: the daemon refused: %s (code %s)\n", cmd, re.Message, re.Code)
			if cmd == "forget" && re.Code == daemon.CodeConflict {
				fmt.Fprintf(stderr, "  a producer is attached to that worker: stop it (or let it exit) first\n")
			} else if re.Code == daemon.CodeConflict || re.Code == daemon.CodeNotFound {
				fmt.Fprintf(stderr, "  list the streams with `kvshmd stats` and pick one with --worker (and --dp-rank for a per-rank stream)\n")
			}
			return exitFailure
		}
		fmt.Fprintf(stderr, "kvshmd %s: %v\n", cmd, err)
		return exitUnreachable
	}
	_, _ = stdout.Write(append(out, '\n'))
	return exitOK
}

func inspect(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvshmd inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: kvshmd inspect [--json] RINGFILE")
		return exitUsage
	}
	h, st, err := shm.Inspect(fs.Arg(0))
	if err != nil && h.Capacity == 0 {
		fmt.Fprintf(stderr, "kvshmd inspect: %v\n", err)
		return exitFailure
	}
	if *asJSON {
		b, _ := json.MarshalIndent(struct {
			Header shm.Header    `json:"header"`
			Stats  shm.RingStats `json:"stats"`
			Error  string        `json:"error,omitempty"`
		}{h, st, errString(err)}, "", "  ")
		fmt.Fprintln(stdout, string(b))
	} else {
		alive := "no"
		if h.ProducerPID != 0 && syscall.Kill(int(h.ProducerPID), 0) == nil {
			alive = "yes (pid exists)"
		}
		fill := 0.0
		if st.Capacity > 0 {
			fill = 100 * float64(st.Used) / float64(st.Capacity)
		}
		fmt.Fprintf(stdout, "ring           %s\nversion        %d\nstate          %s\nworker_id      %d\nkv_block_size  %d\nmax_buffer     %d\n",
			fs.Arg(0), h.Version, h.State, h.WorkerID, h.KVBlockSize, h.MaxBufferSize)
		fmt.Fprintf(stdout, "epoch          %d (%s)\nproducer_pid   %d alive=%s\ncapacity       %d bytes, max_record %d\n",
			h.Epoch, time.Unix(0, int64(h.Epoch)).UTC().Format(time.RFC3339Nano), h.ProducerPID, alive, h.Capacity, h.MaxRecord)
		fmt.Fprintf(stdout, "head           %d\ntail           %d\nused           %d bytes (%.1f%%)\ndropped        %d events, %d bytes\n",
			st.Head, st.Tail, st.Used, fill, st.DroppedEvents, st.DroppedBytes)
		if st.LossPending {
			fmt.Fprintf(stdout, "loss pending   seqs %d..%d\n", st.LossFirstSeq, st.LossLastSeq)
		}
		if st.ConsumerHeartbeat != 0 {
			fmt.Fprintf(stdout, "consumer seen  %s\n", time.Unix(0, int64(st.ConsumerHeartbeat)).UTC().Format(time.RFC3339Nano))
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvshmd inspect: the ring is invalid: %v\n", err)
		return exitFailure
	}
	return exitOK
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
