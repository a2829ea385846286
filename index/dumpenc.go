package index

import (
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
)

// TreeDump encoding from the compact form (dumpSnap.parts). A dump is sized exactly before it is written (each
// event's JSON length follows from its numbers' digit counts), so the answer is one allocation of its final size
// (no growth copies, no slack), and a dump of parallelDumpBlocks blocks or more is written by up to
// maxDumpWorkers goroutines (GOMAXPROCS) straight into their own ranges of that buffer, since formatting the u64s
// is most of its cost.

// Parallel dump encoding: dumps of at least parallelDumpBlocks blocks are encoded by up to maxDumpWorkers
// goroutines.
const (
	parallelDumpBlocks = 16 << 10
	maxDumpWorkers     = 4
)

var pow10tab = [20]uint64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
	1e16, 1e17, 1e18, 1e19}

// u64Len is len(appendU64(nil, v)).
func u64Len(v uint64) int {
	t := bits.Len64(v) * 1233 >> 12 // floor(log10(2^bits)), at most one below the digit count
	if t < len(pow10tab) && v >= pow10tab[t] {
		t++
	}
	return max(t, 1)
}

// eventJSONLen is the length of the RouterEvent JSON appendViewEvents writes for h (its words in words).
func eventJSONLen(shape DumpShape, worker uint64, h *logHdr, words []uint64) int {
	n := len(jsEventHead) + u64Len(worker) + len(jsEventTier) + u64Len(h.id) + u64Len(uint64(h.dp)) + len(jsEventTail)
	if shape.legacy() {
		n += len(jsEventTierV0) - len(jsEventTier)
	}
	switch h.kind {
	case KindStored:
		n += len(jsStoredHead) + len(jsStoredStart) + len(jsStoredTail) + 4 // "null"
		if h.hasParent {
			n += u64Len(h.parent) - 4
		}
		w := words[h.off : h.off+2*h.n]
		n += int(h.n) * (len(jsBlockHead) + len(jsBlockTokens) + len(jsBlockTail) + 1) // a comma each, one too many
		for _, x := range w {
			n += u64Len(x)
		}
		if h.n > 0 {
			n--
		}
	case KindRemoved:
		n += len(jsRemovedHead) + len(jsRemovedTail) + int(h.n)
		for _, x := range words[h.off : h.off+h.n] {
			n += u64Len(x)
		}
		if h.n > 0 {
			n--
		}
	default:
		n += len(jsCleared)
	}
	return n
}

// encode writes the snapshot's TreeDump JSON.
func (s *dumpSnap) encode() []byte {
	total, blocks := 0, 0
	for _, p := range s.parts {
		for k := range p.hdrs {
			total += eventJSONLen(s.shape, s.worker, &p.hdrs[k], p.words)
			blocks += int(p.hdrs[k].n)
		}
	}
	if s.events > 1 {
		total += s.events - 1 // commas between events
	}
	head := len(jsTreeDumpHead)
	buf := make([]byte, head, head+total+dumpTailLen(s.shape, s.last))
	copy(buf, jsTreeDumpHead)
	workers := 1
	if blocks >= parallelDumpBlocks {
		workers = min(runtime.GOMAXPROCS(0), maxDumpWorkers, s.events)
	}
	if workers > 1 && s.encodeParallel(buf[head:head+total], workers, total) {
		buf = buf[:head+total]
	} else {
		buf, _ = appendViewEvents(buf[:head], s.shape, s.worker, s.parts, true, rankFilter{})
		if len(buf) != head+total {
			dumpSizeMisses.Add(1)
		}
	}
	return appendDumpTail(buf, s.shape, s.last)
}

// dumpSizeMisses counts encodings whose size was not the computed one (a bug in eventJSONLen: the answer is still
// right, as appendViewEvents grows its buffer, but parallel encoding falls back to one goroutine). Tests check it
// stays 0.
var dumpSizeMisses atomic.Int64

// encodeParallel writes the events into dst (exactly total bytes) with the given number of goroutines, each a run
// of consecutive events of about total/workers bytes, written in place. False when a run's size was not the
// computed one (dst is then garbage; the caller encodes sequentially).
func (s *dumpSnap) encodeParallel(dst []byte, workers, total int) bool {
	type span struct {
		parts []logPart // the run's events: a sub-slice of each part's headers
		off   int       // where the run starts in dst
		end   int
		first bool // the run starts the list (no leading comma)
	}
	spans := make([]span, 0, workers)
	target := (total + workers - 1) / workers
	cur := span{first: true}
	pos := 0
	for _, p := range s.parts {
		lo := 0
		for k := range p.hdrs {
			sz := eventJSONLen(s.shape, s.worker, &p.hdrs[k], p.words)
			if pos > 0 {
				sz++ // the comma before it
			}
			if pos-cur.off >= target && len(spans) < workers-1 {
				if k > lo {
					cur.parts = append(cur.parts, logPart{hdrs: p.hdrs[lo:k], words: p.words})
				}
				cur.end = pos
				spans = append(spans, cur)
				cur, lo = span{off: pos}, k
			}
			pos += sz
		}
		if len(p.hdrs) > lo {
			cur.parts = append(cur.parts, logPart{hdrs: p.hdrs[lo:], words: p.words})
		}
	}
	cur.end = pos
	spans = append(spans, cur)
	var wg sync.WaitGroup
	var miss atomic.Bool
	for i, sp := range spans {
		enc := func() {
			out, _ := appendViewEvents(dst[sp.off:sp.off:sp.end], s.shape, s.worker, sp.parts, sp.first, rankFilter{})
			if len(out) != sp.end-sp.off || (len(out) > 0 && &out[0] != &dst[sp.off]) {
				miss.Store(true)
			}
		}
		if i == len(spans)-1 {
			enc()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			enc()
		}()
	}
	wg.Wait()
	if miss.Load() {
		dumpSizeMisses.Add(1)
		return false
	}
	return true
}

// viewEvents counts the events of parts.
func viewEvents(parts []logPart) int {
	n := 0
	for _, p := range parts {
		n += len(p.hdrs)
	}
	return n
}
