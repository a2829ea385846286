package stream

import (
	"fmt"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// Incarnations, wire seqs and heartbeats: docs/lifecycle.md is the contract; doc.go ("Streams and their lifecycle",
// "Publishing on ZMQ") says how this package keeps it.
//
// Ownership of a stream's wire counter (Stream.wire) and incarnation state (Stream.live): the drain goroutine of
// the stream's current attachment, or, while no attachment is installed, whoever holds st.mu (Attach and Restart,
// which start or end incarnations; Reclaim and EndDetached, which end one for the daemon; watchDetached, which ends
// one whose producer died after a broken connection). An
// attachment is installed and uninstalled under st.mu, so the two never overlap.

// EndCause is why an attachment ends (Attachment.Finish); it decides whether the producer's incarnation ends with it.
type EndCause int32

const (
	CauseEOF      EndCause = iota + 1 // the producer's connection closed: an end only if its pid is gone or the ring CLOSED
	CauseDetach                       // DETACH on the lease: an end
	CausePIDGone                      // the producer's pid is gone: an end
	CauseShutdown                     // the daemon stops: an end only for a private daemon whose parent is gone (or as EOF)
	causeFault                        // the ring mapping faulted: not an end (nothing more is known)
)

// maxLostWire bounds the wire seqs one LOSS record can take (a corrupt range must not push the counter far past
// the clock); beyond it the rest of the range is reported as unknown history.
const maxLostWire = 1 << 24

// rebaseWire makes the stream's next wire seq max(last + 1, the clock in µs). Called by the counter's owner.
func (st *Stream) rebaseWire(floor uint64) {
	if floor > st.wire.Load()+1 {
		st.wire.Store(floor - 1) // publishes the counter to readers (tests, STATS)
	}
}

// nextWire takes the stream's next wire seq. Called by the counter's owner.
func (st *Stream) nextWire() uint64 {
	w := st.wire.Load() + 1
	st.wire.Store(w) // publishes the counter to readers
	return w
}

// clearedBatch encodes [now, [AllBlocksCleared], rank] into buf, the event in layout w (the stream's).
func clearedBatch(buf []byte, rank uint32, w vllmwire.Wire) []byte {
	buf = vllmwire.AppendBatchHeader(buf[:0], batchTS(0), 1)
	buf = w.AppendEvent(buf, &vllmwire.Event{Kind: vllmwire.KindCleared})
	return vllmwire.AppendBatchTrailer(buf, int64(rank))
}

// resetIncarnation publishes the Cleared batch that starts or ends an incarnation with the next wire seq
// (Publisher.PublishReset: the replay buffer then holds only it) and applies the same Cleared to ix under that id.
// On a stream that is not published the Cleared takes the id after the index's last one (the engine's numbering);
// an index that has seen no id holds no block and is left alone. Called by the wire counter's owner (see above).
// It returns the id used.
func (st *Stream) resetIncarnation(ix *index.Indexer) uint64 {
	var id uint64
	if pub := st.pub.Load(); pub != nil {
		id = st.nextWire()
		pub.PublishReset(id, clearedBatch(nil, st.rank.Load(), vllmwire.Wire(st.pubWire.Load()))) // never dropped for a full queue
	} else if is := ix.Stats(); is.SeenAny {
		id = is.LastSeenID + 1
	} else {
		return 0
	}
	_, _ = ix.Apply(&index.Event{ID: id, DpRank: st.rank.Load(), Kind: index.KindCleared})
	return id
}

// endIncarnationLocked ends the stream's live incarnation (docs/lifecycle.md, "Incarnations": the end Cleared on the
// wire and in the index). Called with st.mu held by the wire counter's owner.
func (st *Stream) endIncarnationLocked(why string, log func(msg string, args ...any)) {
	if !st.live {
		return
	}
	st.live = false
	id := st.resetIncarnation(st.ix)
	log("producer incarnation ended: its blocks are cleared (published and in the index)", "why", why, "id", id,
		"publishing", st.pub.Load() != nil)
}

// incarnationEnds reports, at the end of an attachment, whether the producer's incarnation ends with it (a new
// epoch or its death is then certain), and whether its pid must be watched instead (a broken connection while
// the pid lives: the producer may reattach the same ring epoch, or die later). Runs on the drain goroutine.
func (a *Attachment) incarnationEnds() (ends, watch bool) {
	gone := func() bool {
		return a.checkPID && !a.pidw.Alive()
	}
	switch EndCause(a.cause.Load()) {
	case CauseDetach, CausePIDGone:
		return true, false
	case CauseShutdown:
		if a.eng.env.ParentGone() {
			return true, false // a private daemon: its engine (the parent) is gone
		}
		return a.hdrClosed() || gone(), false
	case CauseEOF:
		if a.hdrClosed() || gone() {
			return true, false
		}
		return false, a.checkPID
	}
	return false, false
}

// watchDetached follows the pid of a producer whose connection broke while it lived: when the pid is gone before
// the stream is attached again (or forgotten), the incarnation ends. Its caller counted it in st.watchers. It
// polls every 5 ms for the first second (a dying process closes its descriptors before it is reaped: the common
// case of a SIGKILL) and every Config.PIDCheckInterval after that, and stops with the daemon (Env.Done).
func (st *Stream) watchDetached(epoch uint64, pid uint32, start uint64) {
	e := st.eng
	began := time.Now()
	t := time.NewTimer(5 * time.Millisecond)
	defer t.Stop()
	defer func() { // the stream may be dead from now on (Dead)
		st.mu.Lock()
		st.watchers--
		if st.att == nil {
			st.deadSince = e.env.Mono()
		}
		st.mu.Unlock()
		e.env.StreamIdle()
	}()
	for {
		select {
		case <-e.env.Done():
			return
		case <-t.C:
		}
		alive := e.env.ProcessAlive(int(pid), start)
		st.mu.Lock()
		if st.att != nil || st.epoch != epoch || !st.live || st.gone {
			st.mu.Unlock()
			return
		}
		if !alive {
			st.endIncarnationLocked(fmt.Sprintf("producer pid %d is gone (after its connection closed)", pid), e.log.With(st.key.LogAttrs()...).Info)
			st.mu.Unlock()
			return
		}
		st.mu.Unlock()
		next := 5 * time.Millisecond
		if time.Since(began) > time.Second {
			next = e.cfg.PIDCheckInterval
		}
		t.Reset(next)
	}
}

// heartbeat publishes an empty batch [now, [], rank] with the next wire seq (Publisher.PublishHeartbeat: not kept
// for replay, not in the index). Runs on the drain goroutine of a publishing stream.
func (a *Attachment) heartbeat(pub *zmqpub.Publisher) {
	pub.PublishHeartbeat(a.st.nextWire(), emptyBatch(a.st.rank.Load()))
}

// emptyBatch is [now, [], rank]: a heartbeat, and the filler of contiguous replies (the same batch: a filler at a
// heartbeat's seq is what was published there). Its layout is the same in every wire.
func emptyBatch(rank uint32) []byte {
	return vllmwire.AppendBatchTrailer(vllmwire.AppendBatchHeader(nil, batchTS(0), 0), int64(rank))
}
