package zmqpub

import (
	"encoding/binary"
	"net"
	"time"
)

// Late joiners (doc.go, "Late joiners"): on a publisher that began in the middle of an engine incarnation (its first
// batch not a reset batch: a restarted daemon), a subscriber whose subscription first matches the topic within
// Config.JoinWindow of New gets the batches the replay buffer holds first, in seq order, then the live ones.

// DefaultJoinWindow is the default Config.JoinWindow: libzmq reconnects every 100 ms (ZMQ_RECONNECT_IVL), so a
// subscriber that was connected to the socket's previous life (a daemon SIGKILLed and restarted) is back within a
// few of those, handshake and subscription included, even on a loaded host; 5 s is well past that and short of
// the 15 s a libzmq peer with Dynamo's heartbeat takes to give up a silent connection and reconnect (a consumer
// that reconnects inside the window gets the batches again: doc.go, "Late joiners", says what that does).
const DefaultJoinWindow = 5 * time.Second

// maxJoinBatches bounds the batches one late joiner is given (the newest that the replay buffer holds): the
// messages' headers are built under the publish lock, so this bounds what a join delays Publish by (~100 µs) and
// what a joiner that never reads holds (one ~40-byte header per batch; the payloads are the buffer's, shared).
const maxJoinBatches = 1024

// joinChunk is how many batches one message of a join carries (2 slices each: past maxIovecs, so a chunk is
// queued for the connection's writer goroutine rather than written under the publish lock; a join of at most 4
// batches is written as Publish writes, without waiting).
const joinChunk = 32

// subscribed records that c's subscriptions match the topic (matches) or no longer do. The first time they match,
// within the join window of a publisher that began mid-incarnation, the buffered batches are queued to c before it is marked subscribed, both under the
// publish lock: the joiner gets them before any live batch, and a batch published meanwhile waits for the lock
// (a few µs per chunk; a socket is written under it only as Publish writes one, without waiting). first is false after the first match: a
// subscriber that cancels and subscribes again is not given them twice.
func (p *Publisher) subscribed(c *conn, matches bool, first *bool) error {
	if !matches || !*first {
		c.subscribed.Store(matches)
		return nil
	}
	*first = false
	if time.Since(p.opened) >= p.joinWindow {
		c.subscribed.Store(true)
		return nil
	}
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if !p.closed && p.midStream {
		if err := p.join(c); err != nil {
			return err
		}
	}
	c.subscribed.Store(true) // under pmu: the next publish hands c its batch after what join queued
	return nil
}

// join queues to c the newest batches of the replay buffer (at most maxJoinBatches, and as many as fit in half of
// the subscriber's backlog, headers included, and in half of its Config.HWM messages, so the live batches after
// them have the other half), oldest first, as PUB messages. Called under pmu. A cut (the address's backlog) is returned.
func (p *Publisher) join(c *conn) error {
	most := maxJoinBatches
	if p.cfg.HWM > 0 { // half of the messages the subscriber may have queued (one per chunk)
		most = min(most, joinChunk*(p.cfg.HWM/2))
	}
	p.bufMu.Lock()
	es := p.buf.newest(most, p.backlog/2, p.msgOverhead())
	p.bufMu.Unlock()
	if len(es) == 0 {
		return nil
	}
	for len(es) > 0 {
		n := min(len(es), joinChunk)
		hdrs := make([]byte, 0, n*p.msgOverhead()) // one allocation per chunk; owned by c's queue once put
		m := make(net.Buffers, 0, 2*n)
		for _, e := range es[:n] {
			at := len(hdrs)
			hdrs = p.appendMsgHeader(hdrs, e)
			m = append(m, hdrs[at:len(hdrs):len(hdrs)], e.payload)
		}
		if err := c.put(m, false); err != nil {
			return err
		}
		p.joinedBatches.Add(uint64(n))
		es = es[n:]
	}
	p.joins.Add(1)
	return nil
}

// msgOverhead is the most bytes a PUB message adds to its payload: the topic and seq frames and the payload
// frame's header (appendMsgHeader).
func (p *Publisher) msgOverhead() int { return 9 + len(p.topic) + 2 + 8 + 9 }

// appendMsgHeader appends what a PUB message [topic, seq, payload] carries before e's payload (written from its own
// slice): the topic frame, the 8-byte big-endian seq frame and the payload frame's header.
func (p *Publisher) appendMsgHeader(b []byte, e entry) []byte {
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], e.seq)
	b = appendFrame(b, flagMore, p.topic)
	b = appendFrame(b, flagMore, seq[:])
	return appendFrameHeader(b, 0, len(e.payload))
}
