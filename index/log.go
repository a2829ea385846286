package index

// The bounded event log (Dynamo's event_buffer): the last MaxBufferSize applied events, ids non-decreasing (equal
// only inside a batch, Indexer.BeginBatch).
//
// Storage is a list of fixed chunks of event headers, each with an append-only word arena holding the blocks of
// its events (Stored: block hash and tokens hash pairs; Removed: hashes). A chunk is never modified below its fill
// mark and never reused, so a reader that captured a chunk's headers and words under Indexer.mu can encode them
// after releasing the lock while the writer appends and evicts (eviction only drops chunk references; appends
// write past the captured lengths, or into a reallocated arena). Steady state costs one chunk allocation per
// chunkEvents events and nothing per event.
//
// Owned by the writer; protected by Indexer.mu.

const chunkEvents = 256

type logHdr struct {
	id        uint64
	parent    uint64
	off       uint32 // first word in chunk.words
	n         uint32 // Stored: blocks (2 words each); Removed: hashes
	dp        uint32
	kind      Kind
	hasParent bool
}

type logChunk struct {
	hdrs  [chunkEvents]logHdr
	words []uint64
}

type eventLog struct {
	max    int
	chunks []*logChunk
	head   int // index of the first live event in chunks[0]
	count  int
	// frontCut: the first events of the batch at the front were evicted (only a batch longer than max is cut;
	// others are evicted whole), so a query from its id must not be answered from the log.
	frontCut bool
}

func (l *eventLog) hdr(i int) *logHdr {
	p := l.head + i
	return &l.chunks[p/chunkEvents].hdrs[p%chunkEvents]
}

func (l *eventLog) firstID() uint64 { return l.hdr(0).id }
func (l *eventLog) lastID() uint64  { return l.hdr(l.count - 1).id }

// reset empties the log (an id went backwards: the log restarts so ids stay non-decreasing).
func (l *eventLog) reset() {
	clear(l.chunks)
	l.chunks = l.chunks[:0]
	l.head, l.count = 0, 0
	l.frontCut = false
}

// append logs one event; blocks and hashes are copied. Evicts from the front beyond max.
func (l *eventLog) append(id uint64, dp uint32, kind Kind, hasParent bool, parent uint64, blocks []Block, hashes []uint64) {
	if l.max <= 0 {
		return
	}
	p := l.head + l.count
	if p/chunkEvents == len(l.chunks) {
		l.chunks = append(l.chunks, &logChunk{})
	}
	c := l.chunks[p/chunkEvents]
	n := len(hashes)
	if kind == KindStored {
		n = len(blocks)
	}
	c.hdrs[p%chunkEvents] = logHdr{id: id, parent: parent, off: uint32(len(c.words)), n: uint32(n), dp: dp,
		kind: kind, hasParent: hasParent}
	if kind == KindStored {
		for _, b := range blocks {
			c.words = append(c.words, b.BlockHash, b.TokensHash)
		}
	} else {
		c.words = append(c.words, hashes...)
	}
	l.count++
	if l.count > l.max {
		// Evict the front batch whole (the events with the front's id), so the log always starts at a batch
		// boundary: an Events answer from that id would miss the evicted ones. A batch longer than max itself
		// (the front is the batch being appended) loses only its oldest event, and frontCut says so.
		front := l.firstID()
		if front == id {
			l.popFront()
			l.frontCut = true
			return
		}
		for l.count > 0 && l.firstID() == front {
			l.popFront()
		}
		l.frontCut = false
	}
}

// popFront evicts the oldest event.
func (l *eventLog) popFront() {
	l.head++
	l.count--
	if l.head == chunkEvents {
		l.chunks[0] = nil
		l.chunks = l.chunks[1:]
		l.head = 0
	}
}

// complete reports whether every buffered event with the front's id is still in the log (false: its batch was cut).
func (l *eventLog) complete() bool { return !l.frontCut }

// search returns the index of the first event with id >= id (l.count when none).
func (l *eventLog) search(id uint64) int {
	lo, hi := 0, l.count
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if l.hdr(m).id < id {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// lastCleared returns the index of the last Cleared event at or after index i, or -1.
func (l *eventLog) lastCleared(i int) int {
	for j := l.count - 1; j >= i; j-- {
		if l.hdr(j).kind == KindCleared {
			return j
		}
	}
	return -1
}

// hasCleared reports whether any event at or after index i is Cleared.
func (l *eventLog) hasCleared(i int) bool {
	for j := i; j < l.count; j++ {
		if l.hdr(j).kind == KindCleared {
			return true
		}
	}
	return false
}

// logPart is an immutable view of consecutive events of one chunk.
type logPart struct {
	hdrs  []logHdr
	words []uint64
}

// view captures events [i, l.count) for encoding outside the lock. It copies slice headers only.
func (l *eventLog) view(i int, dst []logPart) []logPart {
	for i < l.count {
		p := l.head + i
		c := l.chunks[p/chunkEvents]
		lo := p % chunkEvents
		hi := min(chunkEvents, lo+(l.count-i))
		dst = append(dst, logPart{hdrs: c.hdrs[lo:hi:hi], words: c.words[:len(c.words):len(c.words)]})
		i += hi - lo
	}
	return dst
}

// rankFilter selects the events of one dp_rank (and every Cleared, written with that dp_rank) of a multi-rank
// stream; the zero value selects everything.
type rankFilter struct {
	on bool
	dp uint32
}

func (f rankFilter) keep(h *logHdr) bool { return !f.on || h.dp == f.dp || h.kind == KindCleared }

// appendViewEvents appends the RouterEvent JSON of every event in parts that f keeps, comma-separated; first
// says whether the output list is still empty. It returns the number of events written.
func appendViewEvents(dst []byte, shape DumpShape, worker uint64, parts []logPart, first bool, f rankFilter) ([]byte, int) {
	n := 0
	for _, p := range parts {
		for k := range p.hdrs {
			h := &p.hdrs[k]
			if !f.keep(h) {
				continue
			}
			n++
			if !first {
				dst = append(dst, ',')
			}
			first = false
			switch h.kind {
			case KindStored:
				dst = appendStoredWords(dst, shape, worker, h.id, h.dp, h.hasParent, h.parent, p.words[h.off:h.off+2*h.n])
			case KindRemoved:
				dst = AppendRemovedJSON(dst, shape, worker, h.id, h.dp, p.words[h.off:h.off+h.n])
			default:
				dp := h.dp
				if f.on {
					dp = f.dp // in a rank view, the stream's Cleared clears this rank
				}
				dst = AppendClearedJSON(dst, shape, worker, h.id, dp)
			}
		}
	}
	return dst, n
}

// viewSize estimates the JSON size of parts, to size buffers once.
func viewSize(parts []logPart) int {
	n := 0
	for _, p := range parts {
		for k := range p.hdrs {
			h := &p.hdrs[k]
			switch h.kind {
			case KindStored:
				n += 210 + 90*int(h.n)
			case KindRemoved:
				n += 160 + 21*int(h.n)
			default:
				n += 140
			}
		}
	}
	return n
}
