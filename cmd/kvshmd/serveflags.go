package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/kvshm/kvshm/daemon"
)

// serveOptions are kvshmd serve's flags as given, before any check: each one from the command line, else from its
// environment variable, else its default. register is the one place that names a flag, its environment variable,
// its default and its help; config (serveconfig.go) turns the options into what serve runs with.
type serveOptions struct {
	socket, socketMode, http, stateDir string
	checkpointInterval                 time.Duration
	parentPID, rankPorts               int
	parentPoll                         time.Duration
	onLoss, dumpShape                  string
	cleanupDir, cleanupToken           string
	deadRetention                      time.Duration
	maxDeadStreams                     int

	// The socket's and HTTP's bounds and deadlines.
	maxRequestBytes                     uint
	maxConns, httpMaxConns              int
	idle, frame, write, query, pidCheck time.Duration

	// Publishing on ZMQ.
	zmqHeartbeat                                       time.Duration
	zmqSnapshots                                       bool
	zmqSnapshotBuilds, zmqSnapshotChunk, zmqReplayFill int
	zmqSeqBase                                         string

	// Per-producer bounds (daemon.Bounds); sizes are strings with a unit (parseSize).
	maxBufferSteps, maxHWM, maxStreamsPerPeer, maxConnsPerPeer, zmqConnsPerAddr int
	maxRingBytes, zmqBufferBytes                                                string

	// The process: memory and logs.
	gcHeadroom, maxMemory string
	logLevel, logFormat   string

	// given holds the names of the flags set on the command line or by their environment variable
	// (parseServeFlags): a default that depends on whether another flag was given (--state-dir's interval) asks it.
	given map[string]bool
}

// defaultCkptInterval is --checkpoint-interval's default with the default --state-dir.
const defaultCkptInterval = 10 * time.Second

// defaultStateDir stands for "the default" in --state-dir's flag value; config and resolveStateDir resolve it.
const defaultStateDir = "(tmpfs default)"

// defaultGCHeadroom is --gc-headroom's default (gcpolicy.go).
const defaultGCHeadroom = 64 << 20

// register defines every flag of serve on fs, each with its default and help (the help names its environment
// variable), and returns each flag's environment variable by flag name.
func (o *serveOptions) register(fs *flag.FlagSet) map[string]string {
	def, b := daemon.DefaultConfig(), daemon.DefaultBounds()
	r := flagRegistrar{fs: fs, env: map[string]string{}}
	r.str(&o.socket, "socket", "KVSHMD_SOCKET", def.SocketPath, "Unix socket path; its directory is created 0700 and must be owned by you and not group/other writable")
	r.str(&o.socketMode, "socket-mode", "KVSHMD_SOCKET_MODE", fmt.Sprintf("%04o", def.SocketMode), "socket file mode, octal")
	r.str(&o.http, "http", "KVSHMD_HTTP", "", "HTTP listen address for /kv_recover, /metrics, /healthz, e.g. 127.0.0.1:9400; off when empty")
	r.str(&o.stateDir, "state-dir", "KVSHMD_STATE_DIR", defaultStateDir, "directory for index checkpoints: written at SIGTERM/SIGINT after the final drain, restored when a producer reattaches the same ring, so a planned restart loses nothing; created 0700, must be owned by you with no group/other permissions; the default is on tmpfs (with another --socket: <socket>.state beside it, so two daemons never share one) and comes with --checkpoint-interval "+defaultCkptInterval.String()+"; --state-dir '' turns checkpoints off")
	r.dur(&o.checkpointInterval, "checkpoint-interval", "KVSHMD_CHECKPOINT_INTERVAL", 0, "with --state-dir: also checkpoint each stream while it runs, when this long has passed since its last checkpoint with records applied since, or when they fill half its ring, and release the ring head only up to a written checkpoint, so a crash (SIGKILL, OOM) loses nothing either; 0 = only at shutdown; default "+defaultCkptInterval.String()+" with the default --state-dir, else 0")
	r.dur(&o.zmqHeartbeat, "zmq-heartbeat", "KVSHMD_ZMQ_HEARTBEAT", def.ZMQHeartbeat, "a stream published on ZMQ that published nothing for this long publishes an empty batch with the next seq, so an idle engine's restarted router finds its gap and replays (docs/lifecycle.md); 0 = off")
	r.bool(&o.zmqSnapshots, "zmq-snapshots", "KVSHMD_ZMQ_SNAPSHOTS", true, "a publishing stream keeps its blocks' tokens (~(block_size+2)*4 bytes per block) and answers a replay request older than its replay buffer with the state as of its last batch, then the batches after it, so a router that was away longer than the buffer converges (docs/replay-snapshots.md); false = the buffer only, as vLLM's publisher")
	r.int(&o.zmqSnapshotChunk, "zmq-snapshot-chunk", "KVSHMD_ZMQ_SNAPSHOT_CHUNK", 0, "split a replay snapshot's batch of a rank into batches of about this many bytes, all under its seq (Dynamo 1.6.1 applies them all; a consumer that keeps one batch per seq would not); 0: one batch per rank")
	r.int(&o.zmqReplayFill, "zmq-replay-fill", "KVSHMD_ZMQ_REPLAY_FILL", def.ZMQReplayFill, "a replay reply carries every seq from the requested one to the newest, as vLLM's do: the seqs of heartbeats, of a wiped incarnation and before a snapshot go as empty batches, at most this many per reply (a reply needing more keeps its gaps, counted); llm-d's replay consumer refuses a reply with a gap (docs/replay-snapshots.md); 0 = off")
	r.str(&o.zmqSeqBase, "zmq-seq-base", "KVSHMD_ZMQ_SEQ_BASE", "clock", "where a stream's wire seqs start in this daemon: clock = above the clock in µs (and again at each engine incarnation), so no restart of anything reuses a seq (Dynamo's routers); zero = from 1, continuing across incarnations and restored checkpoints, as llm-d's replay consumer needs (it asks from seq 0 on connect); a daemon restarted without its state then starts from 1 again (docs/lifecycle.md)")
	r.int(&o.zmqSnapshotBuilds, "zmq-snapshot-builds", "KVSHMD_ZMQ_SNAPSHOT_BUILDS", daemon.DefaultSnapshotBuilds, "replay snapshots built at once across all streams; a replay needing one beyond it waits for a slot, and replies on one stream share one build while its buffer covers the batches after it")
	r.str(&o.cleanupDir, "cleanup-dir", "KVSHMD_CLEANUP_DIR", "", "at exit, after everything is closed, remove this directory recursively: only a directory made for this daemon (the Python launcher's private directory), owned by you, mode 0700, holding the file "+daemon.CleanupTokenFile+" whose content is --cleanup-token; without that the daemon refuses to start and deletes nothing")
	r.str(&o.cleanupToken, "cleanup-token", "KVSHMD_CLEANUP_TOKEN", "", "the token --cleanup-dir's "+daemon.CleanupTokenFile+" must hold (at least 16 characters)")
	r.dur(&o.deadRetention, "dead-stream-retention", "KVSHMD_DEAD_STREAM_RETENTION", def.DeadRetention, "a stream whose producer is gone and that no consumer asked for (a recovery or match query, a ZMQ replay request) during this long is forgotten as by FORGET: its ZMQ ports closed, its index, metric series and checkpoints dropped")
	r.int(&o.maxDeadStreams, "max-dead-streams", "KVSHMD_MAX_DEAD_STREAMS", def.MaxDeadStreams, "dead streams kept at most; beyond it the ones longest not asked for are forgotten at once")
	r.str(&o.onLoss, "on-loss", "KVSHMD_ON_LOSS", def.OnLoss.String(), "answer to a recovery query that misses events kvshm lost (ring full, corrupt record, unknown history): best-effort = what Dynamo would answer from the events applied, marked with the Kvshm-State: incomplete and Kvshm-Lost-Events headers, counted and logged; error = the Error variant naming the loss until a Cleared")
	r.str(&o.dumpShape, "dump-shape", "KVSHMD_DUMP_SHAPE", def.DumpShape.String(), "TreeDump shape: chains = Dynamo 1.6.1's merged chains with reset_scope and residency_domain; blocks = one single-block Stored event per block, as older Dynamo")
	r.int(&o.rankPorts, "rank-ports", "KVSHMD_RANK_PORTS", 0, "with --http: port BASE+r on the --http host answers /kv_recover for dp_rank r of the only worker (what pod discovery calls: recover_port + dp_rank), opened when the daemon first holds a stream covering r; a bind failure is logged and counted; 0 = off")
	r.int(&o.parentPID, "parent-pid", "KVSHMD_PARENT_PID", 0, "drain and exit when this process is gone: its pidfd is waited on (no polling), or, without pidfds, it is polled every --parent-poll")
	r.dur(&o.parentPoll, "parent-poll", "KVSHMD_PARENT_POLL", def.ParentPoll, "poll period of --parent-pid where the kernel has no pidfd")
	r.uint(&o.maxRequestBytes, "max-request-bytes", "KVSHMD_MAX_REQUEST_BYTES", uint(def.MaxRequestBytes), "largest request frame accepted; larger ones get too_large and the connection is closed")
	r.int(&o.maxConns, "max-conns", "KVSHMD_MAX_CONNS", def.MaxConns, "concurrent socket connections; beyond it clients get busy")
	r.int(&o.httpMaxConns, "http-max-conns", "KVSHMD_HTTP_MAX_CONNS", def.HTTPMaxConns, "concurrent HTTP connections; beyond it clients get 503")
	r.dur(&o.idle, "idle-timeout", "KVSHMD_IDLE_TIMEOUT", def.IdleTimeout, "close a non-producer connection that sends nothing for this long")
	r.dur(&o.frame, "frame-timeout", "KVSHMD_FRAME_TIMEOUT", def.FrameTimeout, "a started request frame must arrive completely within this")
	r.dur(&o.write, "write-timeout", "KVSHMD_WRITE_TIMEOUT", def.WriteTimeout, "a reply must be written within this, else the connection is closed")
	r.dur(&o.query, "query-timeout", "KVSHMD_QUERY_TIMEOUT", def.QueryTimeout, "bound on one query, including waiting for a dump build")
	r.dur(&o.pidCheck, "pid-check-interval", "KVSHMD_PID_CHECK_INTERVAL", def.PIDCheckInterval, "backstop check that each producer's pid is alive")
	r.int(&o.maxBufferSteps, "max-buffer-steps", "KVSHMD_MAX_BUFFER_STEPS", b.MaxBufferSteps, "largest publish buffer_steps an ATTACH may ask; beyond it the ATTACH is refused with limit")
	r.int(&o.maxHWM, "max-hwm", "KVSHMD_MAX_HWM", b.MaxHWM, "largest publish hwm an ATTACH may ask; beyond it the ATTACH is refused with limit")
	r.str(&o.maxRingBytes, "max-ring-bytes", "KVSHMD_MAX_RING_BYTES", formatSize(b.MaxRingBytes), "largest ring capacity an ATTACH may bring (bytes, or with KiB/MiB/GiB); beyond it the ATTACH is refused with limit")
	r.int(&o.maxStreamsPerPeer, "max-streams-per-peer", "KVSHMD_MAX_STREAMS_PER_PEER", b.MaxStreamsPerPeer, "streams one producer process (uid+pid) may have attached at once; beyond it the ATTACH is refused with limit")
	r.int(&o.maxConnsPerPeer, "max-conns-per-peer", "KVSHMD_MAX_CONNS_PER_PEER", b.MaxConnsPerPeer, "socket connections one process (uid+pid) may have open at once, within --max-conns; beyond it the connection gets limit and is closed")
	r.str(&o.zmqBufferBytes, "zmq-buffer-bytes", "KVSHMD_ZMQ_BUFFER_BYTES", formatSize(uint64(b.ZmqBufferBytes)), "each publishing stream's replay buffer holds at most this many payload bytes (and at most buffer_steps batches); the oldest are evicted, and a replay from before them is counted incomplete")
	r.int(&o.zmqConnsPerAddr, "zmq-conns-per-addr", "KVSHMD_ZMQ_CONNS_PER_ADDR", b.ZmqConnsPerAddr, "connections one remote address (an IPv4 address, an IPv6 /64) may have open on each ZMQ PUB and replay socket, handshakes included: its share of the socket's 1024, so one host's connections leave room for every other host's routers; one more is closed at accept and counted in kvshm_zmq_peers_cut_total{reason=\"addr_conns\"}; ipc:// sockets have none (zmqpub/doc.go)")
	r.str(&o.gcHeadroom, "gc-headroom", "KVSHMD_GC_HEADROOM", formatSize(defaultGCHeadroom), "garbage the collector lets the heap grow by over its live data (bytes, or with KiB/MiB/GiB): GOGC is set after each collection to about this, within 12..50 (so between 1/8 and 1/2 of the live heap); 0 or a GOGC environment variable: Go's GOGC alone")
	r.str(&o.maxMemory, "max-memory", "KVSHMD_MAX_MEMORY", "", "the Go runtime's soft memory limit (debug.SetMemoryLimit): the GC works harder near it instead of letting the heap double; set it below the daemon's cgroup limit. Empty: GOMEMLIMIT if set, else none")
	r.str(&o.logLevel, "log-level", "KVSHMD_LOG_LEVEL", "info", "debug, info, warn or error")
	r.str(&o.logFormat, "log-format", "KVSHMD_LOG_FORMAT", "text", "text or json")
	return r.env
}

// flagRegistrar defines flags whose help ends with their environment variable and records it.
type flagRegistrar struct {
	fs  *flag.FlagSet
	env map[string]string // flag name -> environment variable
}

// help records name's environment variable and returns its help ending with it.
func (r *flagRegistrar) help(name, env, help string) string {
	r.env[name] = env
	return help + " (env " + env + ")"
}

func (r *flagRegistrar) str(p *string, name, env, def, help string) {
	r.fs.StringVar(p, name, def, r.help(name, env, help))
}

func (r *flagRegistrar) int(p *int, name, env string, def int, help string) {
	r.fs.IntVar(p, name, def, r.help(name, env, help))
}

func (r *flagRegistrar) uint(p *uint, name, env string, def uint, help string) {
	r.fs.UintVar(p, name, def, r.help(name, env, help))
}

func (r *flagRegistrar) dur(p *time.Duration, name, env string, def time.Duration, help string) {
	r.fs.DurationVar(p, name, def, r.help(name, env, help))
}

func (r *flagRegistrar) bool(p *bool, name, env string, def bool, help string) {
	r.fs.BoolVar(p, name, def, r.help(name, env, help))
}

// parseServeFlags parses serve's command line into options: a flag given on the command line wins; any other flag
// whose environment variable (getenv; empty counts as unset) is set takes its value, parsed as the flag's own
// (a bool as strconv.ParseBool, an integer as the flag package does, a duration as time.ParseDuration). A command
// line the flag package refuses returns nil options and its error (it printed why, with usage, on out), or
// flag.ErrHelp (usage printed); otherwise err joins every bad environment variable (errBadEnv) and a stray argument
// (errBadFlag), and the options hold the rest.
func parseServeFlags(args []string, getenv func(string) string, usage func(fs *flag.FlagSet), out io.Writer) (*serveOptions, error) {
	fs := flag.NewFlagSet("kvshmd serve", flag.ContinueOnError)
	fs.SetOutput(out)
	o := &serveOptions{}
	envs := o.register(fs)
	fs.Usage = func() { usage(fs) }
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var errs []error
	if fs.NArg() != 0 {
		errs = append(errs, fmt.Errorf("%w: unexpected argument %q", errBadFlag, fs.Arg(0)))
	}
	o.given = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.given[f.Name] = true })
	for _, name := range slices.Sorted(maps.Keys(envs)) { // in name order, as the errors are reported
		env := envs[name]
		v := getenv(env)
		if o.given[name] || v == "" {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			f := fs.Lookup(name)
			_ = f.Value.Set(f.DefValue) // the flag package's Set stores a zero on error: back to the default
			errs = append(errs, fmt.Errorf("%w: %s=%q: want %s", errBadEnv, env, v, valueKind(f)))
			continue
		}
		o.given[name] = true
	}
	return o, errors.Join(errs...)
}

// valueKind names what a flag's value must be, for an environment variable that is not one.
func valueKind(f *flag.Flag) string {
	switch f.Value.(flag.Getter).Get().(type) {
	case bool:
		return "true or false"
	case time.Duration:
		return "a duration such as 10s"
	case int:
		return "an integer"
	case uint:
		return "a non-negative integer"
	}
	return "a valid value"
}
