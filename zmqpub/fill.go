package zmqpub

import (
	"encoding/binary"
	"net"
)

// Contiguous replies (SetFiller; docs/replay-snapshots.md "Contiguous replies"). vLLM's replies carry consecutive seqs from the
// requested one: its publisher keeps every batch it numbers. kvshm's do not by themselves: a heartbeat takes a seq
// and is never kept, a reset batch starts an incarnation above seqs that were wiped, and a snapshot stands under
// the seq L of the state it holds. A consumer that requires seq == start, start+1, ... in a reply (llm-d-router's
// replay consumer: anything else is an incomplete replay, after which it drops the pod's blocks) would refuse all
// three. With a filler, a reply fills every such seq with an empty batch, so it carries every seq from start to
// the newest the publisher had published:
//
//   - a heartbeat's seq: the heartbeat was an empty batch; the filler is the same batch (exact);
//   - seqs before a reset batch that opens the buffer: the reset batch's AllBlocksCleared wipes whatever they did;
//   - seqs before a snapshot: start..L-m are empty and the snapshot's m batches take L-m+1..L, its last at L. A
//     consumer that applies the reply holds the state as of L after L, as before; between them it holds its old
//     state (a compaction: seqs below L no longer name their own states, only L does).
//
// A reply is filled only where every seq it covers is known: a reply that is incomplete without a snapshot (the
// batches before the buffer had content, or seqs of lost batches: MarkLost) keeps its gap, and so does a reply
// that would need more than the filler's max empty batches (a consumer far behind an old stream: the bound keeps a
// router restart from costing one message per seq ever published), or a snapshot of more batches than seqs from
// start to L. Such replies are counted (Stats.ReplayGapped).

// filler is the empty batch fillers carry and the most one reply may send.
type filler struct {
	payload []byte
	max     int
}

// SetFiller makes the publisher's replies contiguous with payload (an empty batch in the stream's wire layout,
// shared, not copied) as the filler, at most max fillers per reply (max <= 0 or a nil payload: off, the buffer's
// seqs as kept).
func (p *Publisher) SetFiller(payload []byte, max int) {
	if len(payload) == 0 || max <= 0 {
		p.fill.Store(nil)
		return
	}
	p.fill.Store(&filler{payload: payload, max: max})
}

// MarkLost records that the seqs first..last were numbered but will never be published (kvshmd: batches the
// producer lost before the daemon read them, numbered so that a subscriber sees the gap): a reply from a seq at or
// before last is incomplete, and none fills them. Called by the publishing goroutine, in order with Publish.
func (p *Publisher) MarkLost(first, last uint64) {
	if last < first {
		return
	}
	p.bufMu.Lock()
	p.buf.markLost(last)
	p.bufMu.Unlock()
}

// fillChunk is how many bytes of fillers a reply queues at once (many messages per queue entry).
const fillChunk = 64 << 10

// sendFill queues fillers for seqs [from, to) to c.
func (p *Publisher) sendFill(c *conn, f *filler, from, to uint64) error {
	var buf []byte
	var seq [8]byte
	for s := from; s < to; s++ {
		binary.BigEndian.PutUint64(seq[:], s)
		buf = appendFrame(buf, flagMore, nil)
		buf = appendFrame(buf, flagMore, p.topic)
		buf = appendFrame(buf, flagMore, seq[:])
		buf = appendFrame(buf, 0, f.payload)
		if len(buf) >= fillChunk || s == to-1 {
			if err := c.putWait(net.Buffers{buf}); err != nil {
				return err
			}
			buf = nil // queued: owned by the connection now
		}
	}
	p.filled.Add(to - from)
	return nil
}
