package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvshm/kvshm/drain"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// Drain loop tuning.
const (
	maxBatch       = 256                    // records per Release
	snapshotPeriod = 100 * time.Millisecond // ring stats refresh while idle
)

// stream is the state of one (worker, scope): its index (kept across producer deaths) and the current attachment,
// if any.
type stream struct {
	key streamKey // immutable

	// Rate limits of the warn lines about incomplete answers and token-count mismatches. Safe for concurrent use.
	incompleteLog, mismatchLog, zmqDropLog rateLog

	// Counters updated by the drain goroutine once per batch. Updated atomically.
	eventsRecv  [3]atomic.Uint64 // by kind-1
	blocksRecv  [3]atomic.Uint64
	blocksAppl  [3][index.NumStatuses]atomic.Uint64 // blocks of applied events, by kind-1 and tree status
	corrupt     atomic.Uint64
	malformed   atomic.Uint64
	batches     atomic.Uint64
	resets      atomic.Uint64
	lossRecords atomic.Uint64
	notIndexed  [numNotIndexed]atomic.Uint64 // events published but not indexed (decision 4), by reason

	// pub is the stream's ZMQ publisher (nil: not publishing). Stored by ATTACH (s.mu held, no drain goroutine
	// running), FORGET and shutdown; loaded by the drain goroutine once per record. Updated atomically.
	pub atomic.Pointer[zmqpub.Publisher]
	// pubWire is the vllmwire.Wire of the last ATTACH that asked to publish (the incarnation Cleared's layout, which
	// resetIncarnation publishes after that attachment may be gone). Stored with pub by ATTACH.
	pubWire atomic.Uint32
	// groups are the KV-cache group kinds learned from the stream's events (indexReason). Owned by the current
	// attachment's drain goroutine (attachments of a stream run one after the other).
	groups map[groupKey]bool
	// wire is the last wire seq published on the stream (0: none yet; docs/lifecycle.md, "Wire seqs"), rank the dp_rank
	// of its last published batch (heartbeats and Cleared batches carry it). Owned as incarnation.go says: the
	// current attachment's drain goroutine, or the holder of mu while no attachment is installed. Updated
	// atomically (readers: STATS, tests).
	wire atomic.Uint64
	rank atomic.Uint32
	// snap keeps a replay snapshot's tree copy between two batches (snapshot.go).
	snap snapGate

	mu          sync.Mutex // protects every field below
	ix          *index.Indexer
	base        index.Stats // cumulative counters of indexes replaced by resets
	blockSize   uint32
	maxBuffer   uint32
	ringPath    string
	epoch       uint64
	streamEpoch uint32
	att         *attachment // nil when no producer is attached
	lastRing    shm.RingStats
	lastHeader  shm.Header
	alive       bool         // producer believed alive (attached and not seen dead)
	zmqBase     zmqpub.Stats // counters of the stream's closed publishers
	// live: an incarnation of the ring epoch in epoch has started and has not been seen to end (incarnation.go).
	live bool
	// engSeen, engLast: the last engine seq the previous attachment applied, for a publishing stream (whose index
	// speaks wire seqs): the next attachment's loss bookkeeping continues from it.
	engSeen bool
	engLast uint64
	gone    bool // forgotten (FORGET): a pid watcher stops
}

// attachment is one producer's ring, followed by a drain worker (package drain: it is a drain.Stream). "The drain
// goroutine" below is the worker that owns the attachment: one at a time, from drain.Scheduler.Add until Final or
// Fault returns.
type attachment struct {
	st       *stream
	r        *shm.Reader // owned by the drain goroutine
	hdr      shm.Header
	ix       *index.Indexer // the index this attachment feeds
	checkPID bool           // the header's producer_pid is valid in our pid namespace
	log      *slog.Logger
	// lease is the producer's ATTACH connection. Only the producer ends its stream: by closing it, or by DETACH
	// on it (another client's DETACH is refused). The daemon itself ends an attachment only when the lease is
	// gone, the producer's pid is gone, or at shutdown (which closes every connection).
	lease        *conn
	srv          *Server       // the daemon (clock, heartbeat period, pid watchers)
	publishing   bool          // the stream had a publisher when this attachment was installed (constant: see pub)
	cause        atomic.Int32  // endCause of finish; set once
	ckpt         *ckptStore    // where checkpoints go (--state-dir)
	rankPorts    *rankPorts    // --rank-ports: a rank's first event on an ALL stream asks for its port
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
	h        *drain.Handle // set by install before any other goroutine sees the attachment; Wake and Stop only
	doneOnce sync.Once     // closes done (Final, or Fault, which may follow a Final that faulted)
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
	pidw     pidWatch  // the producer's pid (when checkPID), owned by the drain goroutine
	// Scratch of BATCH records and ZMQ encoding, owned by the drain goroutine.
	batch   shm.Batch
	bevs    []batchEvent // the decoded events of the BATCH record being applied
	wire    []byte
	wireFmt vllmwire.Wire // the layout the producer's ATTACH asked for (sock.Publish.Wire)
	wev     vllmwire.Event
	whashes []uint64
	wtoks   []uint32
}

// syncReq asks the drain goroutine to apply everything published before the request, and to know every loss the
// producer had reported in the ring header by then; done is closed after.
type syncReq struct {
	target uint64 // tail observed by the drain goroutine when it received the request
	// The drop episode the ring header reported pending when the request was received (valid when loss): the
	// barrier also waits until it is marked on the index (by its LOSS record, or by the drain from the header).
	loss                bool
	lossFirst, lossLast uint64
	done                chan struct{}
}

// finish asks the drain goroutine to drain one last time and close the ring. It is idempotent; the first cause
// and reason are the ones kept (the cause decides whether the incarnation ends: incarnationEnds).
func (a *attachment) finish(cause endCause, reason string) {
	a.stopOnce.Do(func() {
		a.cause.Store(int32(cause))
		a.why.Store(&reason)
		close(a.stop)
		a.h.Stop()
	})
}

// sync blocks until every record published before the call has been applied, the attachment ended, or ctx ends.
func (a *attachment) sync(ctx context.Context) error {
	if a.appliedAll() {
		return nil
	}
	a.syncWaits.Add(1)
	req := syncReq{done: make(chan struct{})}
	select {
	case a.syncs <- req:
		a.h.Wake() // the worker serves it at once, asleep or not
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-req.done:
		return nil
	case <-a.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// appliedAll reports whether every record the producer has published is applied and no loss is pending in the
// ring header: then sync has nothing to wait for. It reads two header words, so it runs with SetPanicOnFault (a
// truncated ring file faults: the answer is then false, and sync takes the drain goroutine's path).
func (a *attachment) appliedAll() (all bool) {
	a.mapMu.RLock()
	defer a.mapMu.RUnlock()
	if a.mapGone {
		return false
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if !isMemoryFault(r) {
				panic(r)
			}
			all = false
		}
	}()
	tail, lossPending := a.r.Published()
	// snapLoss: the last snapshot (STATS' source) still shows a loss the header no longer does; a pass refreshes it.
	return !lossPending && tail == a.applied.Load() && !a.snapLoss.Load()
}

// closeRing closes the Reader (drain goroutine only), once no appliedAll is reading its mapping.
func (a *attachment) closeRing() {
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
func (a *attachment) Ring() *shm.Reader { return a.r }

// Ready reports whether a pass has work: records published, a pending loss in the ring header that the index
// has not marked yet (drainBatch marks it once the ring is found empty), or the end of a burst (the empty pass
// after one that applied records snapshots the ring header once more).
func (a *attachment) Ready() bool {
	if a.burst || a.r.Pending() || a.ckptPending() {
		return true
	}
	pending, first, last := a.r.PendingLoss()
	return pending && first <= last && !(a.cov && a.covFirst == first && a.covLast >= last) &&
		!(a.seqSeen && first <= a.lastSeq)
}

// Pass is one drain pass (drain.Stream): up to maxBatch records applied and released, the barriers received so
// far served, a continuous checkpoint written when due.
func (a *attachment) Pass(now time.Time) int {
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
// publishWarmFor, which needs its worker only at idleEvery and for its heartbeats (idle.go).
func (a *attachment) housekeepEvery(now time.Time) time.Duration {
	if a.publishing && now.Sub(a.lastRec) >= publishWarmFor {
		return max(a.every, idleEvery)
	}
	return a.every
}

// Housekeep is the attachment's periodic work (drain.Stream), due every a.every (idle.go): the heartbeat of a
// publishing stream silent for --zmq-heartbeat, the ring snapshot and truncation check (at most every
// snapshotPeriod), the CLOSED-state warning, the producer pid backstop, and a continuous checkpoint whose interval
// passed without records. A ring file found truncated is an error: the worker calls Fault with it.
func (a *attachment) Housekeep(now time.Time) (time.Time, error) {
	every := a.housekeepEvery(now)
	hb := a.srv.cfg.ZMQHeartbeat
	if a.publishing && hb > 0 && now.Sub(a.lastPub) >= hb-every/4 {
		if pub := a.st.pub.Load(); pub != nil {
			a.heartbeat(pub)
		}
		a.lastPub = now
	}
	if now.Sub(a.lastSnap) >= min(snapshotPeriod, every-every/4) {
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
			if !a.pidw.alive() {
				a.finish(causePIDGone, fmt.Sprintf("producer pid %d is gone", a.hdr.ProducerPID))
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
func (a *attachment) Final() {
	defer a.closeDone()
	a.finalDrain()
}

// Fault ends an attachment whose ring faulted (drain.Stream): see ringFault.
func (a *attachment) Fault(cause any) {
	defer a.closeDone()
	a.ringFault(cause)
}

func (a *attachment) closeDone() {
	a.doneOnce.Do(func() {
		a.pidw.close()
		close(a.done)
	})
}

// drainBatch applies up to maxBatch records and releases them with one head store. It returns the number of
// records consumed.
//
// Known losses (issue 10): a producer that finds the ring full counts the drop in the header (loss_pending, the
// seq range) and reports it with a LOSS record only with its next event that fits. If the engine then goes idle,
// the LOSS record never comes; so the drain marks the header's range lost itself once the ring is empty: the
// header was loaded before the pass and the tail after it (Next's ErrEmpty), so every record published before the
// drops has been applied, and the ids cannot arrive later. The LOSS record that eventually reports the same
// episode (same first seq) adds only the ids beyond what the header showed.
func (a *attachment) drainBatch() int {
	st := a.st
	hdr := a.r.Stats() // before the records: see above
	var c batchCounts
	var n int
	var empty bool
	for n < maxBatch && a.drainRecords(&n, &c, &empty) {
		// drainRecords returned true: a record panicked and was skipped; go on with the next one.
	}
	if empty && hdr.LossPending {
		a.headerLoss(hdr.LossFirstSeq, hdr.LossLastSeq)
	}
	if n == 0 {
		a.applied.Store(a.r.Stats().ReadPos) // release: everything before it is applied and counted
		return 0
	}
	if a.ckptEvery == 0 {
		a.r.Release()
	} else if rs := a.r.Stats(); rs.ReadPos-rs.Head > rs.Capacity/2 && !a.ckptBusy {
		// One in flight: this one waits until it finishes; if the ring fills meanwhile the producer's drops are
		// counted as always.
		a.startCheckpoint("half-ring")
	}
	for k := range c.evs {
		if c.evs[k] != 0 {
			st.eventsRecv[k].Add(c.evs[k])
			st.blocksRecv[k].Add(c.blks[k])
			for j := range c.appl[k] {
				if c.appl[k][j] != 0 {
					st.blocksAppl[k][j].Add(c.appl[k][j])
				}
			}
		}
	}
	st.batches.Add(1)
	a.snapshot()
	// Release: every record before it is applied, counted and (half-ring) checkpointed, as a barrier completed
	// after this pass would promise; sync's fast path relies on that.
	a.applied.Store(a.r.Stats().ReadPos)
	return n
}

// headerLoss marks the pending drop episode the ring header shows (first..last), once the ring was found empty
// after loading it. The header's fields are gauges loaded one by one: a read torn across two episodes (the first
// seq of one, the last of the next, or the reverse) is refused: a pending episode's drops all follow the last event
// applied, and it can only grow while no event is applied after it (an applied event carries its LOSS record).
func (a *attachment) headerLoss(first, last uint64) {
	switch {
	case first > last:
		return
	case a.cov && first == a.covFirst:
		if a.covLast < a.lastSeq {
			return
		}
	case a.seqSeen && first <= a.lastSeq:
		return
	}
	a.lossSeen(first, last, 0)
}

// headerLossReason is the loss reason of a drop episode marked from the ring header.
const headerLossReason = "producer dropped events (ring full; seen in the ring header before its LOSS record)"

// lossSeen marks the drop episode first..last on the index, without the part already marked (count 0: seen in the
// ring header; else a LOSS record's count). An episode is identified by its first seq.
func (a *attachment) lossSeen(first, last, count uint64) {
	if a.cov && first == a.covFirst {
		if last <= a.covLast {
			return
		}
		first = a.covLast + 1
		a.covLast = last
	} else {
		a.cov, a.covFirst, a.covLast = true, first, last
	}
	reason := fmt.Sprintf("producer dropped %d events (ring full)", count)
	if count == 0 {
		reason = headerLossReason
	}
	a.markLost(first, last, reason)
	if !a.seqSeen || last > a.lastSeq {
		a.seqSeen, a.lastSeq = true, last
	}
}

// markLost marks the engine seqs first..last lost on the index. A publishing stream's index speaks wire seqs: the
// lost batches take the next wire seqs (never published, so a subscriber sees the gap) and those are marked.
func (a *attachment) markLost(first, last uint64, reason string) {
	if !a.publishing {
		a.ix.MarkLost(first, last, reason)
		return
	}
	n := last - first + 1
	if n > maxLostWire || n == 0 {
		a.ix.MarkUnknownHistory(fmt.Sprintf("%s: %d..%d, too many to number on the wire", reason, first, last))
		n = maxLostWire // n == 0: the whole u64 range
	}
	w := a.st.wire.Load() + 1
	a.st.wire.Store(w + n - 1) // publishes the counter to readers
	a.ix.MarkLost(w, w+n-1, fmt.Sprintf("%s (engine seqs %d..%d)", reason, first, last))
	if pub := a.st.pub.Load(); pub != nil {
		pub.MarkLost(w, w+n-1) // a reply must not fill them (zmqpub: contiguous replies)
	}
}

// lossKnown reports whether the drop episode a barrier waits for is marked on the index (or a later one is: the
// producer reports episodes in order), or cannot be pending (its first seq is not after the last event applied:
// a read torn across episodes, see headerLoss).
func (a *attachment) lossKnown(p syncReq) bool {
	switch {
	case !p.loss:
		return true
	case a.cov && a.covFirst == p.lossFirst:
		return a.covLast >= p.lossLast
	case a.cov && a.covFirst > p.lossFirst:
		return true
	}
	return a.seqSeen && p.lossFirst <= a.lastSeq
}

// batchCounts are the per-batch counters of drainBatch, added to the stream's atomics once per batch.
type batchCounts struct {
	evs, blks [3]uint64                    // events and blocks received, by kind-1
	appl      [3][index.NumStatuses]uint64 // blocks of applied events, by kind-1 and the event's tree status
}

// drainRecords applies records until the batch is full (n reaches maxBatch), the ring is empty or corrupt; then
// it returns false. A panic while applying one record (a bug in the decoder or the index) is contained here: the
// record is counted as malformed, logged with its stack, the history is marked unknown, and it returns true so
// drainBatch continues with the next record. The deferred recover costs once per batch, not per record. A panic
// outside a record's decode/apply (in the Reader) ends the batch instead: retrying at once could repeat it forever.
func (a *attachment) drainRecords(n *int, c *batchCounts, empty *bool) (retry bool) {
	var pos uint64
	inRecord := false
	defer func() {
		if r := recover(); r != nil {
			if isMemoryFault(r) {
				panic(r) // the mapping itself is gone: the worker hands it to Fault, which ends the attachment
			}
			a.recordPanic(pos, inRecord, r)
			retry = inRecord
		}
	}()
	for *n < maxBatch {
		rec, err := a.r.Next()
		if err != nil {
			if errors.Is(err, shm.ErrEmpty) {
				*empty = true
			} else {
				a.corruption(err)
			}
			return false
		}
		*n++
		pos, inRecord = rec.Pos, true
		switch rec.Type {
		case shm.TypeEvent:
			a.applyEvent(rec, c)
		case shm.TypeBatch:
			a.applyBatch(rec, c)
		case shm.TypeLoss:
			first, last, count, _ := rec.Loss() // length validated by the Reader
			a.lossSeen(first, last, max(count, 1))
			a.st.lossRecords.Add(1)
		}
		inRecord = false
	}
	return false
}

// recordPanic handles a panic recovered in the drain path: inRecord, while applying the record at pos.
// isMemoryFault reports whether a recovered panic is a memory fault (SetPanicOnFault): the runtime's error for
// it carries the faulting address. Such a panic in the drain path is left to the worker (package drain), which
// hands it to the attachment's Fault.
func isMemoryFault(r any) bool {
	_, ok := r.(interface{ Addr() uintptr })
	return ok
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
func (a *attachment) ringFault(r any) {
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
		st.att, st.alive = nil, false
	}
	st.mu.Unlock()
	if a.lease != nil {
		_ = a.lease.c.Close()
	}
}

func (a *attachment) recordPanic(pos uint64, inRecord bool, r any) {
	a.st.malformed.Add(1)
	if inRecord {
		a.log.Error("panic while applying a ring record: record skipped, state before the next event is unknown",
			"pos", pos, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		a.ix.MarkUnknownHistory(fmt.Sprintf("internal error applying the record at ring position %d", pos))
		return
	}
	a.log.Error("panic while reading the ring: batch ended, state before the next event is unknown",
		"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	a.ix.MarkUnknownHistory("internal error reading the ring")
}

// applyHook, when set (tests only), is called with the worker id and seq of every decoded event before it is
// applied; tests make it panic to exercise drainRecords' containment.
var applyHook atomic.Pointer[func(worker, seq uint64)]

func (a *attachment) applyEvent(rec shm.Record, c *batchCounts) {
	v := &a.view
	if err := fbs.Decode(rec.Payload, v); err != nil {
		a.malformedRecord(rec.Pos, err)
		return
	}
	a.id = v.Seq
	if a.publishing {
		a.id = a.st.nextWire()
	}
	a.applyView(v, c)
	a.publishEvent(v)
}

// malformedRecord counts and logs a record that failed validation (an EVENT's FlatBuffer, a BATCH's layout or
// sub-records) and marks the history unknown: the record is skipped, the rest of the ring is fine.
func (a *attachment) malformedRecord(pos uint64, err error) {
	a.st.malformed.Add(1)
	a.log.Warn("malformed record in ring: state before the next event is unknown", "pos", pos, "err", err)
	a.ix.MarkUnknownHistory(fmt.Sprintf("malformed record at ring position %d", pos))
}

// countReceived counts an event received (indexed or not) in the batch counters. It returns the kind index and
// the number of blocks.
func (a *attachment) countReceived(v *fbs.EventView, c *batchCounts) (int, uint64) {
	k := int(v.Kind) - 1
	if k < 0 || k > 2 {
		return -1, 0 // Decode accepts only the three kinds
	}
	c.evs[k]++
	nb := uint64(v.NumBlocks())
	c.blks[k] += nb
	return k, nb
}

// applyView applies one decoded event to the index.
func (a *attachment) applyView(v *fbs.EventView, c *batchCounts) {
	if h := applyHook.Load(); h != nil {
		(*h)(a.st.key.worker, v.Seq)
	}
	k, nb := a.countReceived(v, c)
	if k < 0 {
		return
	}
	a.seqSeen, a.lastSeq = true, v.Seq
	var res index.ApplyResult
	var err error
	switch v.Kind {
	case fbs.KindStored:
		res, err = a.ix.ApplyStoredTokens(a.id, v.DpRank, v.HasParent, v.ParentHash, v.BlockHashes, v.TokenIDs, v.LoraName, v.IsEagle)
	case fbs.KindRemoved:
		a.hashes = a.hashes[:0]
		for i := range int(nb) {
			a.hashes = append(a.hashes, v.BlockHash(i))
		}
		res, err = a.ix.Apply(&index.Event{ID: a.id, DpRank: v.DpRank, Kind: index.KindRemoved, Hashes: a.hashes})
	case fbs.KindCleared:
		res, err = a.ix.Apply(&index.Event{ID: a.id, DpRank: v.DpRank, Kind: index.KindCleared})
	}
	// An error with status OK is an input rejection (not applied); a tree status other than OK was applied (and
	// logged) with that status. Each block counts under its event's status.
	if err == nil || res.Status != index.StatusOK {
		c.appl[k][res.Status] += nb
	}
	if res.TokenMismatch {
		if n, ok := a.st.mismatchLog.allow(time.Now()); ok {
			a.log.Warn("stored event's token count is not blocks × block_size: hashed as Dynamo does (complete windows, zipped with the block hashes)",
				"seq", v.Seq, "blocks", nb, "tokens", v.NumTokens(), "kv_block_size", a.hdr.KVBlockSize, "suppressed", n)
		}
	}
	if a.ranks.on && !a.ranks.has(v.DpRank) {
		a.ranks.add(v.DpRank)
		a.rankPorts.request(v.DpRank) // first event of this rank on an ALL stream: opened off the drain path
	}
	if err != nil && a.log.Enabled(context.Background(), slog.LevelDebug) {
		// Tree errors (parent/block not found) are normal under eviction races and counted by the index.
		a.log.Debug("event applied with error", "seq", v.Seq, "kind", v.Kind, "err", err)
	}
}

// corruption handles a *CorruptionError from Next: count and log it (once per position: an unrepairable tail
// word repeats the error until the producer publishes a valid tail), skip to the tail and mark the history unknown.
// The drain loop then treats the pass as idle, so a broken ring cannot make it spin.
func (a *attachment) corruption(err error) {
	var ce *shm.CorruptionError
	pos := uint64(1<<64 - 1)
	if errors.As(err, &ce) {
		pos = ce.Pos
	}
	a.corruptPass = true
	a.pollCheckpoint(true) // its file must not be renamed over the forced checkpoint that follows
	if !a.corruptSeen || pos != a.lastCorrupt {
		a.corruptSeen, a.lastCorrupt = true, pos
		a.st.corrupt.Add(1)
		a.log.Error("ring corruption: skipping to the tail; state before the next event is unknown", "err", err)
		a.ix.MarkUnknownHistory(fmt.Sprintf("ring corruption: %v", err))
	}
	// SkipToTail releases the head past the last checkpoint: with --checkpoint-interval the next pass writes one at
	// the new head (not again while an unrepairable tail word repeats the error without moving the head).
	a.r.SkipToTail()
	a.ckptForce = a.ckptEvery > 0 && a.r.Stats().Head != a.ckptHead
}

// takeSyncs records the barriers received so far without blocking. Each is satisfied once the read position
// reaches the tail observed now (the request was sent before this point, so that tail covers everything published
// before the request) and the drop episode the header reports now, if any, is marked on the index. The header is
// loaded before the tail: a LOSS record published before loss_pending went back to 0 is then inside the target.
func (a *attachment) takeSyncs() {
	for {
		select {
		case req := <-a.syncs:
			h := a.r.Stats()
			req.target = a.r.Stats().Tail
			if h.LossPending && h.LossFirstSeq <= h.LossLastSeq {
				req.loss, req.lossFirst, req.lossLast = true, h.LossFirstSeq, h.LossLastSeq
			}
			a.pending = append(a.pending, req)
			continue
		default:
		}
		return
	}
}

// completeSyncs picks up new barriers and closes the satisfied ones.
func (a *attachment) completeSyncs() {
	a.takeSyncs()
	if len(a.pending) == 0 {
		return
	}
	head := a.r.Stats().ReadPos // applied (released or not)
	keep := a.pending[:0]
	for _, p := range a.pending {
		if head >= p.target && a.lossKnown(p) {
			close(p.done)
		} else {
			keep = append(keep, p)
		}
	}
	a.pending = keep
}

// finalDrain applies what the producer published before the stop, releases, and closes the ring.
func (a *attachment) finalDrain() {
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
	if st.att == a {
		st.att = nil
		st.alive = false
		st.engSeen, st.engLast = a.seqSeen, a.lastSeq
	}
	st.mu.Unlock()
	a.log.Info("producer detached; ring drained, index stays queryable", "reason", why, "head", rs.Head, "tail", rs.Tail,
		"incarnation_ended", ends)
	if watch && !ends {
		go a.srv.watchDetached(st, a.hdr.Epoch, a.hdr.ProducerPID, a.hdr.ProducerStartTime)
	}
}

// periodicCheckpoint writes a checkpoint (and releases) when the interval has passed since the last one and records
// were applied since, or when one is forced.
func (a *attachment) periodicCheckpoint(now time.Time) {
	if a.ckptForce {
		a.pollCheckpoint(true)
		a.checkpoint("corruption")
		return
	}
	if a.ckptBusy || now.Sub(a.lastCkpt) < a.ckptEvery {
		return
	}
	rs := a.r.Stats()
	if rs.ReadPos == rs.Head {
		a.lastCkpt = now // nothing to cover: the checkpoint on disk (if any) still matches the head
		return
	}
	if rs.ReadPos-rs.Head < ckptBytesPerNode*uint64(a.ix.Stats().Nodes) {
		a.lastCkpt = now // not worth it yet: look again after another interval (see ckptBytesPerNode)
		return
	}
	a.startCheckpoint("interval")
}

// ckptBytesPerNode: an interval checkpoint is written only once the records it covers (the applied bytes the ring
// holds back) reach this many bytes per live node of the index. A checkpoint costs ~0.5 µs of CPU per live node
// (the copy and the encoding: ~55 ms at 100 k blocks), re-applying a record ~1 µs per ~100-150 bytes, so below this
// a restart would replay the records faster than the checkpoint took to write. Without it an idle stream that
// only sees a probe now and then (a router's, an engine's health traffic) rewrote its whole index every interval:
// a third of 64 idle daemons' CPU at 100 k blocks each (docs/deploy.md). The ring still holds every record not
// checkpointed, and the half-ring trigger bounds how many.
const ckptBytesPerNode = 16

// checkpoint writes the index as the checkpoint of the read position (every record before it is applied and none
// after) and then releases the head to exactly that position, so the persisted head always equals the head of the
// newest checkpoint on disk. It is the synchronous form (final, corruption; the caller waited for the asynchronous
// one in flight, ckptasync.go) and runs on the drain goroutine between two passes. If the write fails the head is
// released anyway (the producer must not stall on a full disk) and the worker's checkpoints are deleted first: a
// crash before the next good checkpoint then reports unknown history instead of restoring an index that lacks the
// released records (the head check at restore would refuse it too).
func (a *attachment) checkpoint(trigger string) {
	head := a.r.Stats().ReadPos
	if err := a.ckpt.save(a.st.key, a.hdr.Epoch, a.ix, head, trigger); err != nil {
		a.ckpt.remove(a.st.key)
	}
	a.r.Release()
	a.lastCkpt, a.ckptHead, a.ckptForce = time.Now(), head, false
}

// snapshot publishes the ring statistics for STATS and metrics.
func (a *attachment) snapshot() {
	a.r.Heartbeat(time.Now().UnixNano())
	rs := a.r.Stats()
	a.snapLoss.Store(rs.LossPending)
	a.st.mu.Lock()
	a.st.lastRing = rs
	a.st.mu.Unlock()
}

func (a *attachment) hdrClosed() bool {
	return a.r.Header().State == shm.StateClosed
}
