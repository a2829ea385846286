package stream

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/vllmwire"
)

// An attachment: one producer's ring followed by a drain worker, its drain.Stream methods (the pass, the
// housekeeping, the final drain, a ring fault) and its end.

// Attachment is one producer's ring, followed by a drain worker (package drain: it is a drain.Stream). "The drain
// goroutine" below is the worker that owns the attachment: one at a time, from Scheduler.Add until Final or
// Fault returns.
type Attachment struct {
	st       *Stream
	r        *shm.Reader // owned by the drain goroutine
	hdr      shm.Header
	ix       *index.Indexer // the index this attachment feeds
	checkPID bool           // the header's producer_pid is valid in our pid namespace
	log      *slog.Logger
	// lease is the producer's ATTACH connection. Only the producer ends its stream: by closing it, or by DETACH
	// on it (another client's DETACH is refused). The daemon itself ends an attachment only when the lease is
	// gone, the producer's pid is gone, or at shutdown (which closes every connection).
	lease        io.Closer
	eng          *Engine       // the stream's engine (configuration and environment)
	publishing   bool          // the stream had a publisher when this attachment was installed (constant: see pub)
	cause        atomic.Int32  // EndCause of finish; set once
	pidEvery     time.Duration // producer pid check period (backstop to the lease)
	closedLogged bool          // owned by the drain goroutine: the CLOSED-while-leased warning was logged
	// applied is the ring position up to which every record is applied, stored by the drain goroutine after each
	// pass (updated atomically); with the producer's tail equal to it and no loss pending, a query needs no round
	// trip to the drain goroutine (sync's fast path). mapMu guards the mapping's lifetime for that read: the drain
	// goroutine write-locks it to close the Reader, sync's fast path read-locks it.
	applied   atomic.Uint64
	syncWaits atomic.Uint64 // syncs that needed the drain goroutine (tests read it)
	snapLoss  atomic.Bool   // the last ring snapshot showed loss_pending (sync's fast path). Updated atomically.
	mapMu     sync.RWMutex
	mapGone   bool // protected by mapMu: the Reader is closed

	stopOnce sync.Once
	stop     chan struct{} // closed to ask the drain goroutine to finish (final drain, close ring)
	done     chan struct{} // closed when the drain goroutine has closed the ring
	syncs    chan syncReq  // read-your-writes barriers, served by the drain goroutine
	why      atomic.Pointer[string]
	h        Worker    // set by Attach before any other goroutine sees the attachment; Wake and Stop only
	doneOnce sync.Once // closes done (Final, or Fault, which may follow a Final that faulted)
	// every is how often the attachment needs its worker without records (Housekeep): the lost-doorbell bound and
	// the pace of the idle housekeeping (idle.go). Constant.
	every time.Duration

	// Owned by the drain goroutine.
	lastCorrupt uint64          // position of the last corruption reported
	corruptSeen bool            // lastCorrupt is valid
	corruptPass bool            // the current drain pass hit corruption
	finalHead   uint64          // ring head released by the final drain; read by others after done is closed
	ckptEvery   time.Duration   // --checkpoint-interval; 0: release after every batch (no continuous checkpoints)
	lastCkpt    time.Time       // last continuous checkpoint (or the attach)
	ckptHead    uint64          // head of the last continuous checkpoint (or the attach head)
	ckptForce   bool            // the head moved without a checkpoint (corruption skip): write one at once
	ckptBusy    bool            // an asynchronous checkpoint is in flight (ckptasync.go)
	ckptDone    chan ckptResult // its outcome, posted by its writer goroutine (buffer 1)
	// The producer's pending loss (ring header) already marked on the index, by a LOSS record or by the header
	// itself: the drop episode starting at seq covFirst, known up to covLast. Valid when cov.
	cov               bool
	covFirst, covLast uint64
	// seqSeen, lastSeq: the last event id applied (or highest id marked lost) on the index, as the index's
	// LastSeenID (seeded from it at attach).
	seqSeen  bool
	lastSeq  uint64
	ranks    rankSet // dp_ranks seen on an ALL stream (for --rank-ports)
	view     fbs.EventView
	hashes   []uint64
	pending  []syncReq
	id       uint64    // the index id of the record being applied: its wire seq on a publishing stream, else its seq
	lastPub  time.Time // the last batch handed to the publisher (or the attach): heartbeats after --zmq-heartbeat
	lastRec  time.Time // the last pass that applied records (or the attach): a publishing stream is warm after it (idle.go)
	pubbed   bool      // a batch was handed to the publisher in this pass
	lastSnap time.Time // the last idle ring snapshot and truncation check (Housekeep)
	lastPID  time.Time // the last producer pid check (Housekeep)
	burst    bool      // the last pass applied records (the next empty one snapshots the ring)
	pidw     PIDWatch  // the producer's pid (when checkPID; else nil), owned by the drain goroutine
	// Scratch of BATCH records and ZMQ encoding, owned by the drain goroutine.
	batch   shm.Batch
	bevs    []batchEvent // the decoded events of the BATCH record being applied
	wire    []byte
	wireFmt vllmwire.Wire // the layout the producer's ATTACH asked for (sock.Publish.Wire)
	wev     vllmwire.Event
	whashes []uint64
	wtoks   []uint32
}

// finish asks the drain goroutine to drain one last time and close the ring. It is idempotent; the first cause
// and reason are the ones kept (the cause decides whether the incarnation ends: incarnationEnds).
func (a *Attachment) finish(cause EndCause, reason string) {
	a.stopOnce.Do(func() {
		a.cause.Store(int32(cause))
		a.why.Store(&reason)
		close(a.stop)
		a.h.Stop()
	})
}

// closeRing closes the Reader (drain goroutine only), once no appliedAll is reading its mapping.
func (a *Attachment) closeRing() {
	a.mapMu.Lock()
	a.mapGone = true
	err := a.r.Close()
	a.mapMu.Unlock()
	if err != nil {
		a.log.Warn("close ring", "err", err)
	}
}

// Ring, Ready, Pass, Housekeep, Final and Fault make the attachment a drain.Stream; they run on its worker.

// Ring is the attachment's ring (drain.Stream).
func (a *Attachment) Ring() *shm.Reader { return a.r }

// Ready reports whether a pass has work: records published, a pending loss in the ring header that the index
// has not marked yet (drainBatch marks it once the ring is found empty), or the end of a burst (the empty pass
// after one that applied records snapshots the ring header once more).
func (a *Attachment) Ready() bool {
	if a.burst || a.r.Pending() || a.ckptPending() {
		return true
	}
	pending, first, last := a.r.PendingLoss()
	return pending && first <= last && !(a.cov && a.covFirst == first && a.covLast >= last) &&
		!(a.seqSeen && first <= a.lastSeq)
}

// Pass is one drain pass (drain.Stream): up to maxBatch records applied and released, the barriers received so
// far served, a continuous checkpoint written when due.
func (a *Attachment) Pass(now time.Time) int {
	a.corruptPass = false
	a.pollCheckpoint(false)
	n := a.drainBatch()
	a.takeSyncs()
	if n == 0 && (a.burst || len(a.pending) > 0) {
		// The end of a burst, or a query waiting: the header's producer-side words (loss_pending, drop counters)
		// may have changed since the last snapshot (the producer clears loss_pending just after publishing its
		// LOSS record), and a query answers STATS from the snapshot.
		a.snapshot()
	}
	a.burst = n > 0
	if n > 0 {
		a.lastRec = now
	}
	a.completeSyncs() // after an empty poll every barrier received so far is satisfied
	if a.ckptEvery > 0 {
		a.periodicCheckpoint(now)
	}
	if a.pubbed {
		a.lastPub, a.pubbed = now, false
	}
	if n == 0 && a.corruptPass && len(a.pending) > 0 {
		// The ring is corrupt and nothing is readable (an unrepairable tail word): waiting cannot help the
		// barriers, so answer them with what has been applied.
		for _, p := range a.pending {
			close(p.done)
		}
		a.pending = a.pending[:0]
	}
	return n
}

// housekeepEvery is the stream's housekeeping period at now: a.every, except for a publishing stream silent for
// publishWarmFor, which needs its worker only at IdleEvery and for its heartbeats (idle.go).
func (a *Attachment) housekeepEvery(now time.Time) time.Duration {
	if a.publishing && now.Sub(a.lastRec) >= publishWarmFor {
		return max(a.every, IdleEvery)
	}
	return a.every
}

// Housekeep is the attachment's periodic work (drain.Stream), due every a.every (idle.go): the heartbeat of a
// publishing stream silent for --zmq-heartbeat, the ring snapshot and truncation check (at most every
// SnapshotPeriod), the CLOSED-state warning, the producer pid backstop, and a continuous checkpoint whose interval
// passed without records. A ring file found truncated is an error: the worker calls Fault with it.
func (a *Attachment) Housekeep(now time.Time) (time.Time, error) {
	every := a.housekeepEvery(now)
	hb := a.eng.cfg.Heartbeat
	if a.publishing && hb > 0 && now.Sub(a.lastPub) >= hb-every/4 {
		if pub := a.st.pub.Load(); pub != nil {
			a.heartbeat(pub)
		}
		a.lastPub = now
	}
	if now.Sub(a.lastSnap) >= min(SnapshotPeriod, every-every/4) {
		a.lastSnap = now
		if cut, size := a.r.Truncated(); cut {
			// An idle stream touches only the header page, which may outlive the truncation: without this
			// check the producer's drops (which it can no longer count in the header) would go unreported.
			return time.Time{}, ringTruncated{size}
		}
		a.snapshot()
		if a.hdrClosed() && !a.closedLogged {
			// The producer says goodbye by closing its connection (or DETACH on it); a state word that reads
			// CLOSED while that connection is open is corruption (or a goodbye about to come): keep reading.
			a.closedLogged = true
			a.log.Warn("ring state is CLOSED while the producer's connection is open: ignored, still draining")
		}
	}
	// The worker runs a deadline up to a quarter period early to coalesce it with its other streams' (drain/doc.go):
	// a check due within that slack runs now, so the stream's checks follow the worker's ticks instead of keeping
	// the phase of its attach.
	next := now.Add(every)
	if a.publishing && hb > 0 {
		next = minTime(next, a.lastPub.Add(hb))
	}
	if a.checkPID {
		if now.Sub(a.lastPID) >= a.pidEvery-every/4 {
			a.lastPID = now
			if !a.pidw.Alive() {
				a.finish(CausePIDGone, fmt.Sprintf("producer pid %d is gone", a.hdr.ProducerPID))
			}
		}
		if a.pidEvery < every {
			next = minTime(next, a.lastPID.Add(a.pidEvery))
		}
	}
	if a.ckptEvery > 0 {
		a.pollCheckpoint(false)
		a.periodicCheckpoint(now)
		if rs := a.r.Stats(); rs.ReadPos != rs.Head {
			next = minTime(next, a.lastCkpt.Add(a.ckptEvery))
		}
	}
	return next, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Final is the attachment's end (drain.Stream): the final drain, the ring closed, done closed.
func (a *Attachment) Final() {
	defer a.closeDone()
	a.finalDrain()
}

// Fault ends an attachment whose ring faulted (drain.Stream): see ringFault.
func (a *Attachment) Fault(cause any) {
	defer a.closeDone()
	a.ringFault(cause)
}

func (a *Attachment) closeDone() {
	a.doneOnce.Do(func() {
		if a.pidw != nil {
			a.pidw.Close()
		}
		close(a.done)
	})
}

// ringTruncated is the cause ringFault reports when the idle check finds the ring file shorter than its mapping.
type ringTruncated struct{ size int64 }

func (e ringTruncated) Error() string {
	return fmt.Sprintf("the ring file was truncated to %d bytes", e.size)
}

// ringFault ends an attachment whose ring mapping faulted, or whose file the idle check found truncated: nothing
// more can be read, so the
// history after the last applied record is unknown (kept queryable, marked, counted), the mapping is released without
// touching it again (no final drain, no head store), and the producer's connection is closed so that it learns of
// it. Runs on the drain goroutine (Fault), possibly after a Final that faulted midway.
func (a *Attachment) ringFault(r any) {
	a.st.corrupt.Add(1)
	a.log.Error("ring unusable (its file was truncated): attachment ended, state after the last applied event is "+
		"unknown", "cause", fmt.Sprint(r))
	a.ix.MarkUnknownHistory(fmt.Sprintf("ring unusable: %v", r))
	a.finish(causeFault, "ring unusable") // barriers waiting on it are released by run closing done
	a.pollCheckpoint(true)                // no write outlives the attachment
	a.closeRing()
	st := a.st
	st.mu.Lock()
	if st.att == a {
		st.att, st.alive, st.deadSince = nil, false, a.eng.env.Mono()
	}
	st.mu.Unlock()
	a.eng.env.StreamIdle()
	if a.lease != nil {
		_ = a.lease.Close()
	}
}

// finalDrain applies what the producer published before the stop, releases, and closes the ring.
func (a *Attachment) finalDrain() {
	target := a.r.Stats().Tail
	for a.r.Stats().ReadPos < target {
		if a.drainBatch() == 0 {
			break
		}
	}
	a.drainBatch() // one pass that ends empty marks a loss the header still reports (see drainBatch)
	st := a.st
	why := ""
	if p := a.why.Load(); p != nil {
		why = *p
	}
	// The end of the producer's incarnation, after its last records and before the final checkpoint (which then
	// holds the cleared index).
	ends, watch := a.incarnationEnds()
	if ends {
		st.mu.Lock()
		st.endIncarnationLocked(why, a.log.Info)
		st.mu.Unlock()
	}
	if a.ckptEvery > 0 {
		a.pollCheckpoint(true)
		a.checkpoint("final") // even with nothing unreleased: the shutdown's checkpoint (Shutdown writes none then)
	}
	a.snapshot()
	a.takeSyncs()
	for _, p := range a.pending {
		close(p.done)
	}
	a.pending = nil
	rs := a.r.Stats()
	a.finalHead = rs.Head
	a.closeRing()
	st.mu.Lock()
	watched := false
	if st.att == a {
		st.att = nil
		st.alive = false
		st.engSeen, st.engLast = a.seqSeen, a.lastSeq
		st.deadSince = a.eng.env.Mono()
		if watched = watch && !ends; watched {
			st.watchers++ // before the lock is released: the reaper never sees a watched stream as dead
		}
	}
	st.mu.Unlock()
	a.eng.env.StreamIdle()
	a.log.Info("producer detached; ring drained, index stays queryable", "reason", why, "head", rs.Head, "tail", rs.Tail,
		"incarnation_ended", ends)
	if watched {
		go st.watchDetached(a.hdr.Epoch, a.hdr.ProducerPID, a.hdr.ProducerStartTime)
	}
}
