package zmqpub

// replayBuffer holds the batches kept for replay, oldest first: at most steps batches and at most maxBytes payload
// bytes (the oldest are evicted first). It grows as used: nothing is allocated for the steps not yet filled, so a
// huge buffer_steps costs nothing until batches arrive (issue 19: a 2^31-entry ring allocated up front killed the
// daemon). Not safe for concurrent use (Publisher.bufMu).
type replayBuffer struct {
	steps, maxBytes int
	q               []entry // q[head:] is the content
	head            int
	bytes           int
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
	b.q, b.head, b.bytes, b.lost, b.lostMax = b.q[:0], 0, 0, false, 0
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
	b.bytes -= len(e.payload)
	b.markLost(e.seq)
}

func (b *replayBuffer) markLost(seq uint64) {
	if !b.lost || seq > b.lostMax {
		b.lostMax = seq
	}
	b.lost = true
}

// since returns the batches with seq >= start, in publication order, and whether that is everything published
// since the incarnation began from start on: false when start is before the oldest batch and that batch is not a
// reset batch (the buffer rolled over, or this publisher began mid-incarnation: a restarted daemon), or, with an
// empty buffer, when a batch at or after start was evicted.
func (b *replayBuffer) since(start uint64) (out []entry, complete bool) {
	live := b.q[b.head:]
	for _, e := range live { // vLLM's rule: every batch with seq >= start (wire seqs only grow: a suffix)
		if e.seq >= start {
			out = append(out, e)
		}
	}
	if len(live) == 0 {
		return nil, !b.lost || b.lostMax < start
	}
	return out, live[0].reset || start >= live[0].seq
}
