package stream

import (
	"log/slog"
	"time"

	"github.com/kvshm/kvshm/drain"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/zmqpub"
)

// Config is the engine's part of the daemon's configuration: constant for the daemon's life. Zero values are off
// (the daemon fills its defaults before it builds the engine).
type Config struct {
	// Heartbeat > 0: a publishing stream that published nothing for this long publishes an empty batch with the
	// next wire seq (--zmq-heartbeat; docs/lifecycle.md, "Heartbeats").
	Heartbeat time.Duration
	// SeqZero numbers wire seqs from 1 instead of from the clock in µs (--zmq-seq-base zero).
	SeqZero bool
	// EagerDrain: no stream is drained lazily (idle.go, lazyLevelMax).
	EagerDrain bool
	// PIDCheckInterval is the producer pid backstop's period, and the watch-detached poll after its first second.
	PIDCheckInterval time.Duration
	// CheckpointInterval > 0: continuous checkpoints (--checkpoint-interval): the head is released only up to a
	// written checkpoint.
	CheckpointInterval time.Duration
	// ReplayFill is the filler budget of a publisher's replies (--zmq-replay-fill; 0: off).
	ReplayFill int
	// NoSnapshots turns replay snapshots off (--zmq-snapshots=false); SnapshotChunk splits a snapshot's batches
	// (--zmq-snapshot-chunk); SnapshotLimit bounds the builds daemon-wide.
	NoSnapshots   bool
	SnapshotChunk int
	SnapshotLimit *zmqpub.SnapshotLimit
	// RankPorts: --rank-ports is on; an ALL stream reports each dp_rank's first event to Env.RankSeen.
	RankPorts bool
}

// Env is what the engine needs from the daemon around it and cannot decide itself: the clocks, the producer's
// pid, the checkpoint files, the rank ports and the reaper. The daemon implements it over its Server; the engine's
// tests implement it with a fake clock, fake pids and checkpoints in memory. An interface rather than a struct of
// funcs: every method is needed, and a missing one is a compile error instead of a nil call on a drain worker.
type Env interface {
	// Now is the wall clock wire seqs start from (unix µs; docs/lifecycle.md, "Wire seqs").
	Now() time.Time
	// Mono is the reaper's monotonic clock: when a stream's last attachment (or pid watch) ended.
	Mono() int64
	// ParentGone reports whether the daemon's --parent-pid process is gone: a shutdown then ends every
	// incarnation (a private daemon's engine is its parent).
	ParentGone() bool
	// StreamIdle is called when an attachment or a watch-detached ends: the stream may be dead from now on.
	StreamIdle()
	// WatchPID opens the producer pid backstop of an attachment (pid started at start, 0: unknown).
	WatchPID(pid int, start uint64) PIDWatch
	// ProcessAlive reports whether pid (started at start) runs: watch-detached's poll.
	ProcessAlive(pid int, start uint64) bool
	// Done is closed when the daemon stops: watch-detached returns.
	Done() <-chan struct{}
	// RankSeen is called on a drain worker with a dp_rank's first event on an ALL stream (Config.RankPorts). It
	// must not block.
	RankSeen(rank uint32)
	Checkpoints
}

// PIDWatch follows a producer's process for the pid backstop. Owned by the attachment's drain goroutine.
type PIDWatch interface {
	Alive() bool
	Close()
}

// Checkpoints writes and deletes a stream's checkpoint files (--state-dir). Save and SaveCopy write the index (or
// its copy) as the checkpoint of the ring epoch at ring position head; Remove deletes every checkpoint of the key.
// Failures are the store's to log and count: the engine only needs to know whether the write held.
type Checkpoints interface {
	Save(k Key, epoch uint64, ix *index.Indexer, head uint64, trigger string) error
	SaveCopy(k Key, epoch uint64, cp *index.CheckpointCopy, head uint64, trigger string) error
	Remove(k Key)
}

// Scheduler runs attachments: the daemon's drain.Scheduler (Add's handle is the Worker), or a test's hand.
type Scheduler interface {
	// Add hands the attachment to a worker, which calls its drain.Stream methods (Pass, Housekeep, then Final or
	// Fault) one at a time; an error means the scheduler is closed.
	Add(a drain.Stream) (Worker, error)
}

// Worker is an attachment's handle on its worker (drain.Handle).
type Worker interface {
	Wake() // run the attachment soon: a barrier or a finished checkpoint waits
	Stop() // run Final soon: Finish was called
}

// Engine is the stream engine of one daemon: its configuration, its environment, and the scheduler whose workers
// run the attachments. Safe for concurrent use.
type Engine struct {
	cfg   Config
	env   Env
	log   *slog.Logger
	sched Scheduler
}

// New returns the engine of a daemon. The caller owns sched (it closes it after every attachment ended).
func New(cfg Config, env Env, sched Scheduler, log *slog.Logger) *Engine {
	return &Engine{cfg: cfg, env: env, log: log, sched: sched}
}

// KeepTokens reports whether a stream attached with a publisher keeps token windows in its index (replay
// snapshots).
func (e *Engine) KeepTokens(publishing bool) bool { return publishing && !e.cfg.NoSnapshots }

// wireFloor is the lowest wire seq a daemon may start a stream or an incarnation at: the clock in µs, or 0 with
// Config.SeqZero.
func (e *Engine) wireFloor() uint64 {
	us := e.env.Now().UnixMicro()
	if us < 0 || e.cfg.SeqZero {
		return 0
	}
	return uint64(us)
}
