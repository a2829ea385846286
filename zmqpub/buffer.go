package zmqpub

import "sort"

// replayBuffer holds the batches kept for replay, oldest first: at most steps batches and at most maxBytes payload
// bytes (the oldest are evicted first). It grows as used: nothing is allocated for the steps not yet filled, so a
// huge buffer_steps costs nothing until batches arrive (a 2^31-entry ring allocated up front once killed the
// daemon). Not safe for concurrent use (Publisher.bufMu).
type replayBuffer struct {
	steps, maxBytes int
	q               []entry // q[head:] is the content
	head            int
	bytes           int
	base            uint64 // the index of q[head] among every batch ever kept (a reply's cursor)
	gen             uint64 // +1 per clear: a reply in progress stops at a reset
	// begun: a reset batch came (the buffer holds the incarnation from its start, less what it lost); a buffer
	// that never saw one began mid-incarnation (a restarted daemon, a replaced publisher).
	begun bool
	// lost: since the last reset batch (or since the buffer was made) a batch was evicted or was too large to keep.
	// lostMax is the highest seq of those batches.
	lost    bool
	lostMax uint64
}

// entry is one batch. reset marks a reset batch (PublishReset): the start or the end of an engine incarnation.
type entry struct {
	seq     uint64
	payload []byte
	reset   bool
}

func (b *replayBuffer) len() int { return len(b.q) - b.head }

// reset empties the buffer (the batches before it belong to an incarnation that ended).
func (b *replayBuffer) clear() {
	clear(b.q) // drop the payload references
	b.base += uint64(b.len())
	b.gen++
	b.q, b.head, b.bytes, b.lost, b.lostMax = b.q[:0], 0, 0, false, 0
	b.begun = true
}

// add appends e, evicting the oldest batches past the step or byte cap.
func (b *replayBuffer) add(e entry) {
	if b.steps == 0 || len(e.payload) > b.maxBytes {
		b.markLost(e.seq)
		return
	}
	for b.len() > 0 && (b.len() >= b.steps || b.bytes+len(e.payload) > b.maxBytes) {
		b.evict()
	}
	if b.head > 0 && b.head >= len(b.q)/2 && len(b.q) == cap(b.q) {
		// Compact instead of growing: the live part is at most half the slice.
		n := copy(b.q, b.q[b.head:])
		clear(b.q[n:])
		b.q, b.head = b.q[:n], 0
	}
	b.q = append(b.q, e)
	b.bytes += len(e.payload)
}

func (b *replayBuffer) evict() {
	e := b.q[b.head]
	b.q[b.head] = entry{}
	b.head++
	b.base++
	b.bytes -= len(e.payload)
	b.markLost(e.seq)
}

func (b *replayBuffer) markLost(seq uint64) {
	if !b.lost || seq > b.lostMax {
		b.lostMax = seq
	}
	b.lost = true
}

// A reply walks the buffer with a cursor, a chunk at a time under the lock, so that a client that reads slowly holds
// no copy of the buffer: [from, end) are the indices of the batches held when the request came.

// replyRange returns the cursor range of a request from start, the buffer's generation, and whether the reply is
// complete: the oldest batch is a reset batch or not after start, and nothing at or after start was lost (a batch
// too large to keep leaves a hole); empty, a reset came and nothing at or after start was lost since (an empty
// buffer that never saw a reset began mid-incarnation: incomplete).
func (b *replayBuffer) replyRange(start uint64) (from, end, gen uint64, complete bool) {
	live := b.q[b.head:]
	switch {
	case len(live) == 0:
		complete = b.begun && (!b.lost || b.lostMax < start)
	default:
		// A batch lost at or after start (too large to keep) is a hole the buffer cannot fill.
		complete = (live[0].reset || start >= live[0].seq) && (!b.lost || b.lostMax < start)
	}
	return b.base, b.base + uint64(len(live)), b.gen, complete
}

// newest returns a copy of the newest buffered batches, oldest first: at most max of them, and no more than fit in
// maxBytes with overhead bytes added to each payload (a late joiner's, join.go).
func (b *replayBuffer) newest(max, maxBytes, overhead int) []entry {
	live := b.q[b.head:]
	i, bytes := len(live), 0
	for i > 0 && len(live)-i < max && bytes+len(live[i-1].payload)+overhead <= maxBytes {
		i--
		bytes += len(live[i].payload) + overhead
	}
	return append([]entry(nil), live[i:]...)
}

// countFrom returns how many buffered batches have seq >= seq (seqs ascend in the buffer).
func (b *replayBuffer) countFrom(seq uint64) int {
	live := b.q[b.head:]
	return len(live) - sort.Search(len(live), func(i int) bool { return live[i].seq >= seq })
}

// chunkStatus says why chunk returned what it did.
type chunkStatus uint8

const (
	chunkOK      chunkStatus = iota
	chunkReset               // the buffer was reset since the request: the reply ends (the reset batch goes live)
	chunkEvicted             // the batch at the cursor was evicted (rolled over during the reply)
)

// chunk appends to out the batches with seq >= start at cursor indices [cursor, min(end, cursor+max)) and returns
// the next cursor.
func (b *replayBuffer) chunk(out []entry, cursor, end, gen, start uint64, max int) ([]entry, uint64, chunkStatus) {
	if gen != b.gen {
		return out, cursor, chunkReset
	}
	if cursor < b.base {
		return out, cursor, chunkEvicted
	}
	for ; cursor < end && max > 0; cursor, max = cursor+1, max-1 {
		if e := b.q[b.head+int(cursor-b.base)]; e.seq >= start {
			out = append(out, e)
		}
	}
	return out, cursor, chunkOK
}
