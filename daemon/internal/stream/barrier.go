package stream

import (
	"context"
	"runtime/debug"
)

// Read-your-writes barriers: Sync hands the drain goroutine a target (the tail and the pending loss it sees),
// a pass closes it once both are applied; the fast path needs no round trip when nothing is pending.

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

// sync blocks until every record published before the call has been applied, the attachment ended, or ctx ends.
func (a *Attachment) sync(ctx context.Context) error {
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
func (a *Attachment) appliedAll() (all bool) {
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

// lossKnown reports whether the drop episode a barrier waits for is marked on the index (or a later one is: the
// producer reports episodes in order), or cannot be pending (its first seq is not after the last event applied:
// a read torn across episodes, see headerLoss).
func (a *Attachment) lossKnown(p syncReq) bool {
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

// takeSyncs records the barriers received so far without blocking. Each is satisfied once the read position
// reaches the tail observed now (the request was sent before this point, so that tail covers everything published
// before the request) and the drop episode the header reports now, if any, is marked on the index. The header is
// loaded before the tail: a LOSS record published before loss_pending went back to 0 is then inside the target.
func (a *Attachment) takeSyncs() {
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
func (a *Attachment) completeSyncs() {
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
