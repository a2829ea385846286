package stream

import (
	"context"
	"io"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// What the front end reads of a stream and an attachment (STATS, metrics, the reaper, DETACH and FORGET), and the
// ends it asks for. Every method is safe for concurrent use.

// Key is the stream's key.
func (st *Stream) Key() Key { return st.key }

// Current returns the stream's index and attachment (nil when detached).
func (st *Stream) Current() (*index.Indexer, *Attachment) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ix, st.att
}

// Epoch returns the ring epoch the stream last followed and its current attachment (nil when detached).
func (st *Stream) Epoch() (uint64, *Attachment) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.epoch, st.att
}

// Status is a stream's state and counters as STATS and the metrics show them.
type Status struct {
	Index       *index.Indexer
	Base        index.Stats // cumulative counters of indexes replaced by resets
	Ring        shm.RingStats
	Header      shm.Header // the last attachment's ring header
	BlockSize   uint32
	MaxBuffer   uint32
	RingPath    string
	Epoch       uint64
	StreamEpoch uint32
	Alive       bool // producer believed alive (attached and not seen dead)
	Attached    bool
	Resets      uint64

	EventsRecv, BlocksRecv [3]uint64                    // by kind-1
	BlocksAppl             [3][index.NumStatuses]uint64 // blocks of applied events, by kind-1 and tree status
	Corrupt, Malformed     uint64
	Batches, LossRecords   uint64
	NotIndexed             [NumNotIndexed]uint64 // events published but not indexed, by reason (NotIndexedLabels)
}

// Status returns the stream's state and counters.
func (st *Stream) Status() Status {
	st.mu.Lock()
	s := Status{Index: st.ix, Base: st.base, Ring: st.lastRing, Header: st.lastHeader, BlockSize: st.blockSize,
		MaxBuffer: st.maxBuffer, RingPath: st.ringPath, Epoch: st.epoch, StreamEpoch: st.streamEpoch, Alive: st.alive,
		Attached: st.att != nil}
	st.mu.Unlock()
	s.Resets = st.resets.Load()
	for k := range st.eventsRecv {
		s.EventsRecv[k], s.BlocksRecv[k] = st.eventsRecv[k].Load(), st.blocksRecv[k].Load()
		for j := range st.blocksAppl[k] {
			s.BlocksAppl[k][j] = st.blocksAppl[k][j].Load()
		}
	}
	s.Corrupt, s.Malformed = st.corrupt.Load(), st.malformed.Load()
	s.Batches, s.LossRecords = st.batches.Load(), st.lossRecords.Load()
	for i := range st.notIndexed {
		s.NotIndexed[i] = st.notIndexed[i].Load()
	}
	return s
}

// Publisher is the stream's ZMQ publisher (nil: not publishing).
func (st *Stream) Publisher() *zmqpub.Publisher { return st.pub.Load() }

// ClosePublisher closes the stream's publisher, if any, keeping its counters (ZMQStats).
func (st *Stream) ClosePublisher() { st.closePublisher() }

// ZMQStats returns the cumulative ZMQ counters of the stream (closed publishers included) and whether it is
// publishing now (the endpoints are then the current publisher's).
func (st *Stream) ZMQStats() (zmqpub.Stats, bool) { return st.zmqStats() }

// WireSeq is the last wire seq published on the stream (0: none yet).
func (st *Stream) WireSeq() uint64 { return st.wire.Load() }

// PubWire is the layout of the stream's incarnation Cleareds: the last ATTACH's that asked to publish.
func (st *Stream) PubWire() vllmwire.Wire { return vllmwire.Wire(st.pubWire.Load()) }

// Dead reports whether the stream has no attachment and no pid watch, and since when (Env.Mono).
func (st *Stream) Dead() (dead bool, since int64) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.att == nil && st.watchers == 0, st.deadSince
}

// Reclaim ends the incarnation of a dead stream before the daemon drops it (its Cleared, as at a pid gone). It
// reports false, changing nothing, when the stream is not dead (an attachment or a pid watch came meanwhile).
func (st *Stream) Reclaim(why string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.att != nil || st.watchers != 0 {
		return false
	}
	// No attachment is installed: the holder of st.mu owns the wire counter (incarnation.go).
	st.endIncarnationLocked(why, st.eng.log.With(st.key.LogAttrs()...).Info)
	return true
}

// EndDetached ends the incarnation of a stream that has no attachment and is not forgotten (a private daemon's
// shutdown: a connection that broke while the engine died, whose pid watch ends with the daemon).
func (st *Stream) EndDetached(why string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.att == nil && !st.gone {
		st.endIncarnationLocked(why, st.eng.log.With(st.key.LogAttrs()...).Info)
	}
}

// Forget marks the stream dropped (a pid watch of it stops) and closes its publisher.
func (st *Stream) Forget() {
	st.mu.Lock()
	st.gone = true
	st.mu.Unlock()
	st.closePublisher()
}

// Finish asks the drain goroutine to drain one last time and close the ring (Done is closed after). It is
// idempotent; the first cause and reason are kept (the cause decides whether the incarnation ends).
func (a *Attachment) Finish(cause EndCause, reason string) { a.finish(cause, reason) }

// Done is closed when the attachment has ended: final drain, ring closed.
func (a *Attachment) Done() <-chan struct{} { return a.done }

// Stopping reports whether Finish was called: the attachment is ending or ended.
func (a *Attachment) Stopping() bool {
	select {
	case <-a.stop:
		return true
	default:
		return false
	}
}

// Stop is closed when Finish is called.
func (a *Attachment) Stop() <-chan struct{} { return a.stop }

// Sync blocks until every record published before the call has been applied (read-your-writes), the attachment
// ended, or ctx ends.
func (a *Attachment) Sync(ctx context.Context) error { return a.sync(ctx) }

// Lease is the producer's ATTACH connection.
func (a *Attachment) Lease() io.Closer { return a.lease }

// Header is the ring's header at attach.
func (a *Attachment) Header() shm.Header { return a.hdr }

// Index is the index the attachment feeds.
func (a *Attachment) Index() *index.Indexer { return a.ix }

// FinalHead is the ring head released by the final drain; valid after Done is closed.
func (a *Attachment) FinalHead() uint64 { return a.finalHead }

// Every is the attachment's housekeeping period (constant; idle.go).
func (a *Attachment) Every() time.Duration { return a.every }

// SyncWaits counts the Syncs that needed the drain goroutine (tests).
func (a *Attachment) SyncWaits() uint64 { return a.syncWaits.Load() }

// Key is the key of the attachment's stream.
func (a *Attachment) Key() Key { return a.st.key }

// RingPath is the path of the ring the stream follows.
func (a *Attachment) RingPath() string {
	a.st.mu.Lock()
	defer a.st.mu.Unlock()
	return a.st.ringPath
}

// CheckPID reports whether the producer pid backstop is armed (the attaching process is the ring's producer_pid).
func (a *Attachment) CheckPID() bool { return a.checkPID }

// AppliedAll reports whether Sync has nothing to wait for: every record the producer published is applied and no
// loss is pending in the ring header (sync's fast path).
func (a *Attachment) AppliedAll() bool { return a.appliedAll() }
