package stream

import "fmt"

// Losses (doc.go, "Losses"): drop episodes from LOSS records and from the ring header, marked once on the index;
// on a publishing stream under wire seqs of their own.

// headerLoss marks the pending drop episode the ring header shows (first..last), once the ring was found empty
// after loading it. The header's fields are gauges loaded one by one: a read torn across two episodes (the first
// seq of one, the last of the next, or the reverse) is refused: a pending episode's drops all follow the last event
// applied, and it can only grow while no event is applied after it (an applied event carries its LOSS record).
func (a *Attachment) headerLoss(first, last uint64) {
	switch {
	case first > last:
		return
	case a.cov && first == a.covFirst:
		if a.covLast < a.lastSeq {
			return
		}
	case a.seqSeen && first <= a.lastSeq:
		return
	}
	a.lossSeen(first, last, 0)
}

// HeaderLossReason is the loss reason of a drop episode marked from the ring header.
const HeaderLossReason = "producer dropped events (ring full; seen in the ring header before its LOSS record)"

// lossSeen marks the drop episode first..last on the index, without the part already marked (count 0: seen in the
// ring header; else a LOSS record's count). An episode is identified by its first seq.
func (a *Attachment) lossSeen(first, last, count uint64) {
	if a.cov && first == a.covFirst {
		if last <= a.covLast {
			return
		}
		first = a.covLast + 1
		a.covLast = last
	} else {
		a.cov, a.covFirst, a.covLast = true, first, last
	}
	reason := fmt.Sprintf("producer dropped %d events (ring full)", count)
	if count == 0 {
		reason = HeaderLossReason
	}
	a.markLost(first, last, reason)
	if !a.seqSeen || last > a.lastSeq {
		a.seqSeen, a.lastSeq = true, last
	}
}

// markLost marks the engine seqs first..last lost on the index. A publishing stream's index speaks wire seqs: the
// lost batches take the next wire seqs (never published, so a subscriber sees the gap) and those are marked.
func (a *Attachment) markLost(first, last uint64, reason string) {
	if !a.publishing {
		a.ix.MarkLost(first, last, reason)
		return
	}
	n := last - first + 1
	if n > maxLostWire || n == 0 {
		a.ix.MarkUnknownHistory(fmt.Sprintf("%s: %d..%d, too many to number on the wire", reason, first, last))
		n = maxLostWire // n == 0: the whole u64 range
	}
	w := a.st.wire.Load() + 1
	a.st.wire.Store(w + n - 1) // publishes the counter to readers
	a.ix.MarkLost(w, w+n-1, fmt.Sprintf("%s (engine seqs %d..%d)", reason, first, last))
	if pub := a.st.pub.Load(); pub != nil {
		pub.MarkLost(w, w+n-1) // a reply must not fill them (zmqpub: contiguous replies)
	}
}
