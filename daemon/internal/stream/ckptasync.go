package stream

import (
	"sync/atomic"
	"time"
)

// Asynchronous continuous checkpoints (doc.go, "Continuous checkpoints"). The drain worker takes the checkpoint's
// first half between two passes, where the index holds exactly the records before the read position P: a copy of
// the index (index.CheckpointCopy). A per-attachment writer goroutine then encodes it, writes, fsyncs and renames the file while the worker
// goes on draining and publishing; the worker (which owns the Reader) picks up the outcome on a later pass and
// releases the head to exactly P (shm.Reader.ReleaseTo). At most one checkpoint is in flight per stream: a due one
// waits until it finishes. The synchronous ones (final, corruption) first wait for the one in flight, so files are
// renamed in the order of their heads.

// ckptResult is the outcome of an asynchronous checkpoint write, posted by the writer goroutine.
type ckptResult struct {
	head uint64 // the read position the checkpoint covers
	ok   bool
}

// CheckpointWriteHook, when set (tests only), is called by the writer goroutine before it writes a checkpoint of head.
var CheckpointWriteHook atomic.Pointer[func(head uint64)]

// startCheckpoint takes the first half of a continuous checkpoint of the read position and hands the write to a
// writer goroutine. The caller checked that none is in flight.
func (a *Attachment) startCheckpoint(trigger string) {
	head := a.r.Stats().ReadPos
	key, epoch := a.st.key, a.hdr.Epoch
	cp := a.ix.CheckpointCopy() // ~1/3 of the encoding's cost (index: BenchmarkCheckpointCopy)
	a.ckptBusy = true
	a.lastCkpt = time.Now()
	done := a.ckptDone
	go func() {
		if h := CheckpointWriteHook.Load(); h != nil {
			(*h)(head)
		}
		ok := a.eng.env.SaveCopy(key, epoch, cp, head, trigger) == nil
		if !ok {
			a.eng.env.Remove(key) // see checkpoint: a crash then reports unknown history
		}
		done <- ckptResult{head: head, ok: ok}
		a.h.Wake()
	}()
}

// ckptPending reports whether a finished write waits for the worker (Ready).
func (a *Attachment) ckptPending() bool { return len(a.ckptDone) > 0 }

// pollCheckpoint releases the head to the position of a checkpoint whose write finished (failed or not: the
// producer must not stall on a full disk, and the files were removed). wait: block until the one in flight ends.
func (a *Attachment) pollCheckpoint(wait bool) {
	if !a.ckptBusy {
		return
	}
	var res ckptResult
	if wait {
		res = <-a.ckptDone
	} else {
		select {
		case res = <-a.ckptDone:
		default:
			return
		}
	}
	a.ckptBusy = false
	// The head is behind res.head unless a corruption skip moved it past (its forced checkpoint follows).
	if a.r.Stats().Head <= res.head {
		if err := a.r.ReleaseTo(res.head); err != nil {
			a.log.Error("release to the checkpoint's position", "err", err) // a bug: ReleaseTo's contract
			return
		}
		a.ckptHead = res.head
	}
}
