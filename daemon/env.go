package daemon

import (
	"time"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/drain"
	"github.com/kvshm/kvshm/index"
)

// engineEnv is the stream engine's environment (stream.Env) over the Server: the configured clock, the reaper's
// clock and wakeup, --parent-pid, the pid watches (pidwatch.go), the rank ports and the checkpoint files.
type engineEnv struct{ s *Server }

var _ stream.Env = engineEnv{}

func (e engineEnv) Now() time.Time        { return e.s.cfg.Clock() }
func (e engineEnv) Mono() int64           { return e.s.mono() }
func (e engineEnv) ParentGone() bool      { return e.s.parentGone.Load() }
func (e engineEnv) StreamIdle()           { e.s.wakeReaper() }
func (e engineEnv) Done() <-chan struct{} { return e.s.ctx.Done() }
func (e engineEnv) RankSeen(rank uint32)  { e.s.rankPorts.request(rank) }

func (e engineEnv) WatchPID(pid int, start uint64) stream.PIDWatch {
	w := openPIDWatch(pid, start)
	return &w
}

func (e engineEnv) ProcessAlive(pid int, start uint64) bool { return processAlive(pid, start) }

func (e engineEnv) Save(k stream.Key, epoch uint64, ix *index.Indexer, head uint64, trigger string) error {
	return e.s.ckpt.save(k, epoch, ix, head, trigger)
}

func (e engineEnv) SaveCopy(k stream.Key, epoch uint64, cp *index.CheckpointCopy, head uint64, trigger string) error {
	return e.s.ckpt.saveCopy(k, epoch, cp, head, trigger)
}

func (e engineEnv) Remove(k stream.Key) { e.s.ckpt.remove(k) }

// drainScheduler is the engine's Scheduler over the daemon's drain.Scheduler.
type drainScheduler struct{ *drain.Scheduler }

func (d drainScheduler) Add(a drain.Stream) (stream.Worker, error) {
	h, err := d.Scheduler.Add(a)
	if err != nil {
		return nil, err
	}
	return h, nil
}

// engineConfig is the engine's part of the daemon's configuration.
func (s *Server) engineConfig() stream.Config {
	c := s.cfg
	return stream.Config{Heartbeat: c.ZMQHeartbeat, SeqZero: c.ZMQSeqZero, EagerDrain: c.EagerDrain,
		PIDCheckInterval: c.PIDCheckInterval, CheckpointInterval: c.CheckpointInterval, ReplayFill: c.ZMQReplayFill,
		NoSnapshots: c.ZMQNoSnapshots, SnapshotChunk: c.ZMQSnapshotChunk, SnapshotLimit: s.snapLimit,
		RankPorts: s.rankPorts.base != 0}
}
