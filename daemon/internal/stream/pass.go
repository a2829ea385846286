package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
)

// The drain pass (doc.go, "Drain loop"): up to maxBatch records read in place, decoded, applied to the index and
// released with one head store; a record's panic contained; corruption skipped to the tail; the ring snapshot.

// drainBatch applies up to maxBatch records and releases them with one head store. It returns the number of
// records consumed.
//
// Known losses: a producer that finds the ring full counts the drop in the header (loss_pending, the
// seq range) and reports it with a LOSS record only with its next event that fits. If the engine then goes idle,
// the LOSS record never comes; so the drain marks the header's range lost itself once the ring is empty: the
// header was loaded before the pass and the tail after it (Next's ErrEmpty), so every record published before the
// drops has been applied, and the ids cannot arrive later. The LOSS record that eventually reports the same
// episode (same first seq) adds only the ids beyond what the header showed.
func (a *Attachment) drainBatch() int {
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
func (a *Attachment) drainRecords(n *int, c *batchCounts, empty *bool) (retry bool) {
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

// isMemoryFault reports whether a recovered panic is a memory fault (SetPanicOnFault): the runtime's error for
// it carries the faulting address. Such a panic in the drain path is left to the worker (package drain), which
// hands it to the attachment's Fault.
func isMemoryFault(r any) bool {
	_, ok := r.(interface{ Addr() uintptr })
	return ok
}

// recordPanic handles a panic recovered in the drain path: inRecord, while applying the record at pos.
func (a *Attachment) recordPanic(pos uint64, inRecord bool, r any) {
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

// ApplyHook, when set (tests only), is called with the worker id and seq of every decoded event before it is
// applied; tests make it panic to exercise drainRecords' containment.
var ApplyHook atomic.Pointer[func(worker, seq uint64)]

func (a *Attachment) applyEvent(rec shm.Record, c *batchCounts) {
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
func (a *Attachment) malformedRecord(pos uint64, err error) {
	a.st.malformed.Add(1)
	a.log.Warn("malformed record in ring: state before the next event is unknown", "pos", pos, "err", err)
	a.ix.MarkUnknownHistory(fmt.Sprintf("malformed record at ring position %d", pos))
}

// countReceived counts an event received (indexed or not) in the batch counters. It returns the kind index and
// the number of blocks.
func (a *Attachment) countReceived(v *fbs.EventView, c *batchCounts) (int, uint64) {
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
func (a *Attachment) applyView(v *fbs.EventView, c *batchCounts) {
	if h := ApplyHook.Load(); h != nil {
		(*h)(a.st.key.Worker, v.Seq)
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
		if n, ok := a.st.mismatchLog.Allow(time.Now()); ok {
			a.log.Warn("stored event's token count is not blocks × block_size: hashed as Dynamo does (complete windows, zipped with the block hashes)",
				"seq", v.Seq, "blocks", nb, "tokens", v.NumTokens(), "kv_block_size", a.hdr.KVBlockSize, "suppressed", n)
		}
	}
	if a.ranks.on && !a.ranks.has(v.DpRank) {
		a.ranks.add(v.DpRank)
		a.eng.env.RankSeen(v.DpRank) // first event of this rank on an ALL stream: opened off the drain path
	}
	if err != nil && a.log.Enabled(context.Background(), slog.LevelDebug) {
		// Tree errors (parent/block not found) are normal under eviction races and counted by the index.
		a.log.Debug("event applied with error", "seq", v.Seq, "kind", v.Kind, "err", err)
	}
}

// corruption handles a *CorruptionError from Next: count and log it (once per position: an unrepairable tail
// word repeats the error until the producer publishes a valid tail), skip to the tail and mark the history unknown.
// The drain loop then treats the pass as idle, so a broken ring cannot make it spin.
func (a *Attachment) corruption(err error) {
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

// snapshot publishes the ring statistics for STATS and metrics.
func (a *Attachment) snapshot() {
	a.r.Heartbeat(time.Now().UnixNano())
	rs := a.r.Stats()
	a.snapLoss.Store(rs.LossPending)
	a.st.mu.Lock()
	a.st.lastRing = rs
	a.st.mu.Unlock()
}

func (a *Attachment) hdrClosed() bool {
	return a.r.Header().State == shm.StateClosed
}
