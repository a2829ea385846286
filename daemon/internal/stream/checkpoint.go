package stream

import "time"

// Continuous checkpoints on the drain goroutine (doc.go, "Continuous checkpoints"): when one is due, and the
// synchronous form (final, corruption); the asynchronous form is ckptasync.go.

// periodicCheckpoint writes a checkpoint (and releases) when the interval has passed since the last one and records
// were applied since, or when one is forced.
func (a *Attachment) periodicCheckpoint(now time.Time) {
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
	if rs.ReadPos-rs.Head < CheckpointBytesPerNode*uint64(a.ix.Stats().Nodes) {
		a.lastCkpt = now // not worth it yet: look again after another interval (see CheckpointBytesPerNode)
		return
	}
	a.startCheckpoint("interval")
}

// CheckpointBytesPerNode: an interval checkpoint is written only once the records it covers (the applied bytes the ring
// holds back) reach this many bytes per live node of the index. A checkpoint costs ~0.5 µs of CPU per live node
// (the copy and the encoding: ~55 ms at 100 k blocks), re-applying a record ~1 µs per ~100-150 bytes, so below this
// a restart would replay the records faster than the checkpoint took to write. Without it an idle stream that
// only sees a probe now and then (a router's, an engine's health traffic) rewrote its whole index every interval:
// a third of 64 idle daemons' CPU at 100 k blocks each (docs/deploy.md). The ring still holds every record not
// checkpointed, and the half-ring trigger bounds how many.
const CheckpointBytesPerNode = 16

// checkpoint writes the index as the checkpoint of the read position (every record before it is applied and none
// after) and then releases the head to exactly that position, so the persisted head always equals the head of the
// newest checkpoint on disk. It is the synchronous form (final, corruption; the caller waited for the asynchronous
// one in flight, ckptasync.go) and runs on the drain goroutine between two passes. If the write fails the head is
// released anyway (the producer must not stall on a full disk) and the worker's checkpoints are deleted first: a
// crash before the next good checkpoint then reports unknown history instead of restoring an index that lacks the
// released records (the head check at restore would refuse it too).
func (a *Attachment) checkpoint(trigger string) {
	head := a.r.Stats().ReadPos
	if err := a.eng.env.Save(a.st.key, a.hdr.Epoch, a.ix, head, trigger); err != nil {
		a.eng.env.Remove(a.st.key)
	}
	a.r.Release()
	a.lastCkpt, a.ckptHead, a.ckptForce = time.Now(), head, false
}
