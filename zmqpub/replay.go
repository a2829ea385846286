package zmqpub

import (
	"net"
)

// endSeq is vLLM's END_SEQ: -1 as 8 signed big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// maxRequestFrames bounds a replay request's frames (a valid one has 2); a peer sending more in one message is cut
// (errRequest).
const maxRequestFrames = 16

// maxSeqBytes is the longest start seq kvshm reads (vLLM reads any length; kvshm a u64).
const maxSeqBytes = 8

// replyChunk is how many batches a reply takes from the buffer per lock.
const replyChunk = 64

// serveReplayClient reads one replay client's requests and PINGs until the connection ends (the read error, or a
// *cutError). Each client has a connection of its own, a reply goroutine of its own and a bounded queue: a client
// that does not read holds only its own reply (paced by its queue, cut by the stall timeout), never another
// client's. Of a request's frames only what a valid one needs is kept (the second frame's seq, at most 8 bytes):
// an unfinished request holds no more, however many and large its frames (at most maxRequestFrames of at most
// maxCommand bytes each).
func (p *Publisher) serveReplayClient(c *conn) error {
	reqs := make(chan uint64, 4) // a client that floods requests waits for its own replies: its reads stop
	go p.replyLoop(c, reqs)
	defer close(reqs)
	var buf []byte
	frames, seqLen := 0, 0 // of the request being read
	var start uint64       // its second frame as a big-endian integer, when at most 8 bytes
	for {
		flags, size, err := readHeader(c.r, maxCommand)
		if err != nil {
			return err
		}
		keep := maxSeqBytes
		if flags&flagCommand != 0 {
			keep = 1 + maxCommandName + 2 + maxPingContext
		}
		if buf, err = readPrefix(c.r, size, keep, buf); err != nil {
			return err
		}
		if flags&flagCommand != 0 { // commands (PING) are not requests
			name, data, err := parseCommand(buf)
			if err != nil {
				return err
			}
			if err := c.command(name, data, size-1-len(name)); err != nil {
				return err
			}
			continue
		}
		if frames++; frames == 2 {
			seqLen, start = size, 0
			for _, b := range buf {
				start = start<<8 | uint64(b)
			}
		}
		if flags&flagMore != 0 {
			if frames >= maxRequestFrames {
				p.badReqs.Add(1)
				p.badReqLog.warn(p.log, "invalid zmq replay request: too many frames, client cut", "frames", frames)
				return errRequest
			}
			continue
		}
		// [identity, "", start_seq] on vLLM's ROUTER, so ["", start_seq] here (no identity frame: each client is
		// its own connection). vLLM checks the frame count only and reads the seq as a big-endian integer; kvshm
		// also requires 1..8 seq bytes.
		n := frames
		frames = 0
		if n != 2 || seqLen == 0 || seqLen > maxSeqBytes {
			p.badReqs.Add(1)
			p.badReqLog.warn(p.log, "invalid zmq replay request: ignored", "frames", n+1)
			continue
		}
		select {
		case reqs <- start:
		case <-c.done:
			return nil
		}
	}
}

// replyLoop answers one client's requests in order (reply), until one cannot be queued.
func (p *Publisher) replyLoop(c *conn, reqs <-chan uint64) {
	endMarker := net.Buffers{append(appendFrame(appendFrame(appendFrame(nil, flagMore, nil), flagMore, nil), flagMore,
		endSeq), 0, 0)}
	var buf []entry
	for start := range reqs {
		p.replayReqs.Add(1)
		var err error
		if buf, err = p.reply(c, start, buf); err != nil || c.putWait(endMarker) != nil {
			return
		}
	}
}

// reply queues the answer to a request from start, without its end marker: every buffered batch with seq >= start
// or, when the buffer does not reach back to start, a snapshot's batches and the buffered batches after its seq L
// (docs/replay-snapshots.md; a consumer already past L needs no snapshot); with a filler, the empty batches that make its seqs
// contiguous (fill.go). buf is scratch space, returned for reuse.
func (p *Publisher) reply(c *conn, start uint64, buf []entry) ([]entry, error) {
	p.bufMu.Lock()
	_, _, _, complete := p.buf.replyRange(start)
	var oldest uint64
	if p.buf.len() > 0 {
		oldest = p.buf.q[p.buf.head].seq
	}
	p.bufMu.Unlock()
	var sn *Snapshot              // the snapshot the reply sends, if any
	tail, snapped := start, false // the first seq the buffer's part may carry; whether a snapshot was had
	if !complete {
		if s := p.snapshot(c.done); s != nil {
			defer p.release(s)
			snapped = true
			if s.Seq >= start {
				sn, tail = s, s.Seq+1
			}
		}
	}
	p.bufMu.Lock()
	cursor, end, gen, _ := p.buf.replyRange(tail)
	if snapped { // the state as of L is had: the reply is whole if nothing after L (or after start) was lost
		complete = !p.buf.lost || p.buf.lostMax < tail
	}
	newest, kept := p.newest.Load(), p.buf.countFrom(tail)
	// A consumer that asks from seq 0 holds nothing of this stream (Snapshot.Fresh says why that matters): the
	// reset batch that may open the buffer only clears (PublishReset), so the reply leaves it out (its seq filled,
	// with a filler).
	skipReset := start == 0 && p.buf.len() > 0 && p.buf.q[p.buf.head].reset && p.buf.q[p.buf.head].seq >= tail
	if skipReset {
		kept--
	}
	p.bufMu.Unlock()
	if !complete {
		p.countIncomplete(start, oldest)
	}

	var batches [][]byte // the snapshot's part
	if sn != nil {
		batches = sn.Batches
		if start == 0 && sn.Fresh != nil {
			batches = sn.Fresh
		}
	}
	// With a filler, a reply that knows every seq from start to newest-1 carries each (fill.go).
	f := p.fill.Load()
	if f != nil {
		seqs := int64(newest) - int64(start) // the seqs the reply would carry, contiguous
		m := len(batches)
		switch fillers := seqs - int64(m) - int64(kept); {
		case seqs <= 0:
			f = nil // nothing was published from start on: nothing to fill
		case !complete || fillers > int64(f.max) || sn != nil && sn.Seq-start+1 < uint64(m):
			f = nil
			p.gapped.Add(1)
		}
	}
	next := start // with f, the seq the reply carries next
	if sn != nil {
		first := sn.Seq // every batch under L, or under L-m+1..L when filled
		if f != nil {
			first = sn.Seq + 1 - uint64(len(batches))
			if err := p.sendFill(c, f, next, first); err != nil {
				return buf, err
			}
		}
		for i, b := range batches {
			seq := sn.Seq
			if f != nil {
				seq = first + uint64(i)
			}
			if err := c.putWait(p.replyMessage(entry{seq: seq, payload: b})); err != nil {
				return buf, err
			}
			p.replayed.Add(1)
		}
		next = sn.Seq + 1
	}
	for cursor < end {
		var st chunkStatus
		p.bufMu.Lock()
		buf, cursor, st = p.buf.chunk(buf[:0], cursor, end, gen, tail, replyChunk)
		p.bufMu.Unlock()
		if st == chunkEvicted && complete {
			p.countIncomplete(start, oldest)
		}
		if st != chunkOK {
			return buf, nil // the reply ends here, unfilled: the rest is unknown
		}
		for i, e := range buf {
			if e.reset && skipReset {
				continue
			}
			if f != nil && e.seq > next {
				if err := p.sendFill(c, f, next, e.seq); err != nil {
					return buf, err
				}
			}
			if err := c.putWait(p.replyMessage(e)); err != nil {
				return buf, err
			}
			buf[i] = entry{}
			p.replayed.Add(1)
			next = e.seq + 1
		}
	}
	if f != nil && newest > next {
		return buf, p.sendFill(c, f, next, newest) // the heartbeats after the last kept batch
	}
	return buf, nil
}

// replyMessage is ["", topic, seq, payload] (vLLM's reply after the ROUTER's identity frame).
func (p *Publisher) replyMessage(e entry) net.Buffers {
	hdr := p.appendMsgHeader(appendFrame(make([]byte, 0, 2+p.msgOverhead()), flagMore, nil), e)
	return net.Buffers{hdr, e.payload}
}

func (p *Publisher) countIncomplete(start, oldest uint64) {
	p.incomplete.Add(1)
	p.incompleteLog.warn(p.log, "zmq replay reply incomplete: the requested seq is older than the replay buffer "+
		"(rolled over, or kvshmd restarted since the engine incarnation began)", "start", start, "oldest", oldest)
}
