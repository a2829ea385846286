package zmqpub

import (
	"encoding/binary"
	"net"
)

// endSeq is vLLM's END_SEQ: -1 as 8 signed big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// maxRequestFrames bounds a replay request's frames (a valid one has 2); a peer sending more in one message is a
// protocol error and is disconnected.
const maxRequestFrames = 16

// replyChunk is how many batches a reply takes from the buffer per lock.
const replyChunk = 64

// serveReplayClient reads one replay client's requests and PINGs until the connection ends. Each client has a
// connection of its own, a reply goroutine of its own and a bounded queue: a client that does not read holds only
// its own reply (paced by its queue, cut by the stall timeout), never another client's.
func (p *Publisher) serveReplayClient(c *conn) {
	reqs := make(chan uint64, 4) // a client that floods requests waits for its own replies: its reads stop
	go p.replyLoop(c, reqs)
	defer close(reqs)
	var frames [][]byte
	for {
		flags, body, err := readFrame(c.r, maxCommand)
		if err != nil {
			return
		}
		if flags&flagCommand != 0 { // commands (PING) are not requests
			if _, _, ok := c.command(body); !ok {
				return
			}
			continue
		}
		if frames = append(frames, body); flags&flagMore != 0 {
			if len(frames) >= maxRequestFrames {
				p.badReqs.Add(1)
				p.badReqLog.warn(p.log, "invalid zmq replay request: too many frames, client disconnected",
					"frames", len(frames))
				return
			}
			continue
		}
		// [identity, "", start_seq] on vLLM's ROUTER, so ["", start_seq] here (no identity frame: each client is
		// its own connection). vLLM checks the frame count only and reads the seq as a big-endian integer; kvshm
		// also requires 1..8 seq bytes.
		if len(frames) != 2 || len(frames[1]) == 0 || len(frames[1]) > 8 {
			p.badReqs.Add(1)
			p.badReqLog.warn(p.log, "invalid zmq replay request: ignored", "frames", len(frames)+1)
			frames = frames[:0]
			continue
		}
		var start uint64
		for _, b := range frames[1] {
			start = start<<8 | uint64(b)
		}
		frames = frames[:0]
		select {
		case reqs <- start:
		case <-c.done:
			return
		}
	}
}

// replyLoop answers one client's requests in order: every buffered batch with seq >= start, then the end marker.
func (p *Publisher) replyLoop(c *conn, reqs <-chan uint64) {
	endMarker := net.Buffers{append(appendFrame(appendFrame(appendFrame(nil, flagMore, nil), flagMore, nil), flagMore,
		endSeq), 0, 0)}
	var buf []entry
	for start := range reqs {
		p.replayReqs.Add(1)
		p.bufMu.Lock()
		cursor, end, gen, complete := p.buf.replyRange(start)
		var oldest uint64
		if p.buf.len() > 0 {
			oldest = p.buf.q[p.buf.head].seq
		}
		p.bufMu.Unlock()
		if !complete {
			// The buffer does not reach back to start: the state as of a snapshot's seq L, then the batches
			// after L (SNAPSHOT.md). A consumer already past L (start > L) needs no snapshot.
			if sn := p.snapshot(c.done); sn != nil {
				if sn.Seq >= start {
					for _, b := range sn.Batches {
						if c.putWait(p.replyMessage(entry{seq: sn.Seq, payload: b})) != nil {
							p.release(sn)
							return
						}
						p.replayed.Add(1)
					}
					start = sn.Seq + 1
				}
				p.release(sn)
				p.bufMu.Lock()
				cursor, end, gen, _ = p.buf.replyRange(start)
				complete = !p.buf.lost || p.buf.lostMax < start
				p.bufMu.Unlock()
			}
		}
		if !complete {
			p.countIncomplete(start, oldest)
		}
		for cursor < end {
			var st chunkStatus
			p.bufMu.Lock()
			buf, cursor, st = p.buf.chunk(buf[:0], cursor, end, gen, start, replyChunk)
			p.bufMu.Unlock()
			if st == chunkEvicted && complete {
				p.countIncomplete(start, oldest)
			}
			if st != chunkOK {
				break
			}
			for i, e := range buf {
				if c.putWait(p.replyMessage(e)) != nil {
					return
				}
				buf[i] = entry{}
				p.replayed.Add(1)
			}
		}
		if c.putWait(endMarker) != nil {
			return
		}
	}
}

// replyMessage is ["", topic, seq, payload] (vLLM's reply after the ROUTER's identity frame).
func (p *Publisher) replyMessage(e entry) net.Buffers {
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], e.seq)
	hdr := appendFrame(nil, flagMore, nil)
	hdr = appendFrame(hdr, flagMore, p.topic)
	hdr = appendFrame(hdr, flagMore, seq[:])
	hdr = append(hdr, frameHeader(0, len(e.payload))...)
	return net.Buffers{hdr, e.payload}
}

func (p *Publisher) countIncomplete(start, oldest uint64) {
	p.incomplete.Add(1)
	p.incompleteLog.warn(p.log, "zmq replay reply incomplete: the requested seq is older than the replay buffer "+
		"(rolled over, or kvshmd restarted since the engine incarnation began)", "start", start, "oldest", oldest)
}
