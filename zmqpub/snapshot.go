package zmqpub

import (
	"sync"
	"sync/atomic"
)

// Snapshot is the compacted state of a stream as of the batch with wire seq Seq: batches that, applied by a
// consumer in order, leave it holding exactly the producer's state after that batch (kvshmd: per dp_rank
// [AllBlocksCleared, BlockStored...], docs/replay-snapshots.md). Every batch goes out with seq Seq, or with Seq-m+1..Seq in a
// contiguous reply (fill.go). Its payloads are shared by every reply that uses it and must not be modified.
//
// Fresh, when not nil, is what a reply from seq 0 sends instead: the same state without what only clears (kvshmd:
// the AllBlocksCleared events). A consumer that asks from seq 0 has applied nothing of this stream (Dynamo 1.6.1's
// listener asks from 0 only while its watermark for the worker is unset, which a new registration starts with and
// a deregistration's removal of the worker's blocks restores; llm-d resets the pod itself before it does), so the
// Cleared has nothing to drop there, and it costs Dynamo a walk of its whole tree: a router restarted against 64
// workers paid 64 such walks, ~40% of its CPU for the restart (docs/deploy.md).
type Snapshot struct {
	Seq     uint64
	Batches [][]byte
	Fresh   [][]byte
}

// Snapshotter builds a Snapshot of the stream's current state. It runs in a replay client's reply goroutine,
// never on the publishing path; an error means no snapshot (the reply is the buffer's, counted incomplete).
type Snapshotter func() (Snapshot, error)

// SnapshotLimit bounds how many snapshot builds run at once across the publishers that share it (the daemon: one
// for all its streams).
type SnapshotLimit struct{ slots chan struct{} }

// NewSnapshotLimit returns a limit of n concurrent builds (at least 1).
func NewSnapshotLimit(n int) *SnapshotLimit {
	return &SnapshotLimit{slots: make(chan struct{}, max(n, 1))}
}

// Snapshot outcomes (the label values of kvshm_zmq_snapshots_total), one per reply that needed a snapshot.
const (
	SnapshotBuilt       = "built"       // this reply built it
	SnapshotShared      = "shared"      // an earlier or concurrent build served it (cached while the buffer covers its tail)
	SnapshotWaited      = "waited"      // the build found every daemon-wide slot busy and waited for one (also built)
	SnapshotUnavailable = "unavailable" // no snapshot (build error, or the client left while waiting): buffer only
	numSnapshotOutcomes = 4
)

// SnapshotOutcomes lists the outcomes in a fixed order (metrics export).
var SnapshotOutcomes = [numSnapshotOutcomes]string{SnapshotBuilt, SnapshotShared, SnapshotWaited, SnapshotUnavailable}

// snapCacheMax is the largest snapshot (payload bytes) kept once no reply uses it, as the index keeps a dump's
// JSON up to 16 MiB: a larger one is shared only by the replies that overlap its use (N routers asking at once),
// so an idle stream never holds more than this on top of its index.
const snapCacheMax = 16 << 20

// snapState is a publisher's snapshot source, its cached snapshot and its single-flight build.
type snapState struct {
	src      atomic.Pointer[snapSource]
	mu       sync.Mutex
	cached   *Snapshot
	size     int     // cached's payload bytes
	users    int     // replies sending cached now
	cacheMax int     // snapCacheMax when 0 (tests lower it)
	building *flight // the build in flight; nil when none
	outcomes [numSnapshotOutcomes]atomic.Uint64
	waiting  atomic.Int32 // builds waiting for a slot of the limit
	joined   atomic.Int32 // replies waiting for the build in flight
}

// flight is one build: done is closed when it ends, sn is then its snapshot (nil: none).
type flight struct {
	done chan struct{}
	sn   *Snapshot
}

type snapSource struct {
	build Snapshotter
	limit *SnapshotLimit
}

// SetSnapshotter gives the publisher a snapshot source for replay requests its buffer cannot answer completely
// (nil: none, vLLM's replies), with the limit shared by the publishers it should be bounded with (nil: a limit of
// 1 of its own). A cached snapshot is dropped.
func (p *Publisher) SetSnapshotter(f Snapshotter, lim *SnapshotLimit) {
	if f == nil {
		p.snap.src.Store(nil)
	} else {
		if lim == nil {
			lim = NewSnapshotLimit(1)
		}
		p.snap.src.Store(&snapSource{build: f, limit: lim})
	}
	p.snap.mu.Lock()
	p.snap.cached, p.snap.users = nil, 0
	p.snap.mu.Unlock()
}

// covers reports whether the buffer holds every batch after seq that this publisher kept (nothing after seq was
// evicted or too large since the last reset): a snapshot as of seq plus the buffer's tail is the whole state.
func (p *Publisher) covers(seq uint64) bool {
	p.bufMu.Lock()
	defer p.bufMu.Unlock()
	return !p.buf.lost || p.buf.lostMax <= seq
}

// snapshot returns a snapshot for a reply: the cached one while the buffer covers its tail, else the one a build
// in flight returns, else one it builds (waiting for a slot of the shared limit). It gives up (nil) when the
// build fails or done is closed while it waits.
func (p *Publisher) snapshot(done <-chan struct{}) *Snapshot {
	s := &p.snap
	src := s.src.Load()
	if src == nil {
		return nil
	}
	s.mu.Lock()
	if c := s.cached; c != nil && p.covers(c.Seq) {
		s.users++
		s.mu.Unlock()
		s.outcomes[1].Add(1)
		return c
	}
	if f := s.building; f != nil {
		s.mu.Unlock()
		s.joined.Add(1)
		select {
		case <-f.done:
			s.joined.Add(-1)
			if f.sn == nil { // it failed: so would ours (no tokens, say); the next request tries again
				s.outcomes[3].Add(1)
				return nil
			}
			s.mu.Lock()
			if s.cached == f.sn {
				s.users++
			}
			s.mu.Unlock()
			s.outcomes[1].Add(1)
			return f.sn // shared even if it was dropped from the cache meanwhile (release ignores it then)
		case <-done:
			s.joined.Add(-1)
			s.outcomes[3].Add(1)
			return nil
		}
	}
	f := &flight{done: make(chan struct{})}
	s.building, s.cached = f, nil
	s.mu.Unlock()
	sn, outcome := p.build(src, done)
	s.mu.Lock()
	s.building, f.sn = nil, sn
	if sn != nil {
		s.cached, s.size, s.users = sn, 0, 1
		for _, b := range sn.Batches {
			s.size += len(b)
		}
		for _, b := range sn.Fresh { // shared batches count twice: the bound errs on the small side
			s.size += len(b)
		}
	}
	close(f.done)
	s.mu.Unlock()
	s.outcomes[outcome].Add(1)
	return sn
}

// release ends a reply's use of sn (returned by snapshot): a snapshot past snapCacheMax is dropped once no reply
// uses it.
func (p *Publisher) release(sn *Snapshot) {
	s := &p.snap
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cached != sn {
		return // replaced meanwhile
	}
	limit := s.cacheMax
	if limit == 0 {
		limit = snapCacheMax
	}
	if s.users--; s.users == 0 && s.size > limit {
		s.cached = nil
	}
}

// build runs src.build in a slot of src.limit and returns the snapshot and its outcome index.
func (p *Publisher) build(src *snapSource, done <-chan struct{}) (*Snapshot, int) {
	outcome := 0
	select {
	case src.limit.slots <- struct{}{}:
	default:
		outcome = 2
		p.snap.waiting.Add(1)
		select {
		case src.limit.slots <- struct{}{}:
			p.snap.waiting.Add(-1)
		case <-done:
			p.snap.waiting.Add(-1)
			return nil, 3
		}
	}
	sn, err := src.build()
	<-src.limit.slots
	if err != nil {
		p.snapLog.warn(p.log, "zmq replay snapshot unavailable: the reply holds the replay buffer only", "err", err)
		return nil, 3
	}
	return &sn, outcome
}
