package zmqpub

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Config is one stream's publishing configuration, as the producer asks for it at ATTACH (vLLM's KVEventsConfig
// fields). The dp_rank port offset is already applied by the producer.
type Config struct {
	Endpoint       string // PUB endpoint; bound when it has "*" or "::" or is ipc://, connected otherwise
	ReplayEndpoint string // ROUTER endpoint (always bound); "" = no replay socket
	Topic          string
	HWM            int // messages one subscriber may have queued before it is cut; 0 = no message bound
	BufferSteps    int // batches kept for replay, at most (the buffer grows as used)
	// BufferBytes caps the replay buffer's payload bytes (the oldest batches are evicted first); 0 means
	// DefaultBufferBytes. Not part of the ATTACH request (the daemon's per-stream cap).
	BufferBytes int
	// StallTimeout: a connection whose peer has not taken a write for this long is closed (transport.go); 0 means
	// DefaultStallTimeout. Not part of the ATTACH request (kvshm's own setting).
	StallTimeout time.Duration
	// SubscriberBacklog bounds, in bytes, how far one subscriber may fall behind before it is cut (each connection
	// has a queue of its own, so a slow subscriber never delays the others; transport.go), and one replay client's
	// queued reply (a reply waits for room there: it is never cut for its size); 0 means DefaultSubscriberBacklog.
	// Not part of the ATTACH request.
	SubscriberBacklog int
}

// DefaultQueueSize is the capacity of the queue between the drain goroutine and the sender goroutine for
// Publish and PublishHeartbeat (PublishReset and Flush have capacity of their own: they are never dropped).
const DefaultQueueSize = 8192

// DefaultBufferBytes is the default Config.BufferBytes.
const DefaultBufferBytes = 64 << 20

// Drop reasons (the label values of kvshm_zmq_dropped_batches_total).
const (
	DropQueueFull = "queue_full" // the sender goroutine is behind: Publish found the queue full
	DropSendError = "send_error" // no longer produced (kvshm's own sockets never refuse a message); a stable label
	DropClosed    = "closed"     // Publish after Close
	numDrops      = 3
)

// DropReasons lists the drop reasons in a fixed order (metrics export).
var DropReasons = [numDrops]string{DropQueueFull, DropSendError, DropClosed}

// Stats is a snapshot of a publisher's counters.
type Stats struct {
	Published      uint64
	Dropped        [numDrops]uint64 // by DropReasons
	ReplayRequests uint64           // valid requests served
	BadRequests    uint64           // replay requests ignored (frame count or seq length)
	Replayed       uint64           // batches sent on the replay socket (end markers not counted)
	Cut            uint64           // subscribers cut: past their bound (bytes or hwm messages) or stalled
	ReplayCut      uint64           // replay clients cut: stalled (a write blocked for the stall timeout)
	// ReplayIncomplete counts replies that could not hold everything from the requested seq: it is before the
	// oldest buffered batch and that batch is not a reset batch (the buffer rolled over, or the daemon restarted
	// since the incarnation began).
	ReplayIncomplete uint64
	// Snapshots counts the replies that needed a snapshot, by SnapshotOutcomes (snapshot.go).
	Snapshots      [numSnapshotOutcomes]uint64
	Endpoint       string // the PUB endpoint (as bound: a port 0 is resolved)
	ReplayEndpoint string // "" without replay socket
}

// AddCounts adds o's counters to s (the endpoints are left as they are): a stream's totals over its publishers.
func (s *Stats) AddCounts(o Stats) {
	s.Published += o.Published
	for i := range s.Dropped {
		s.Dropped[i] += o.Dropped[i]
	}
	s.ReplayRequests += o.ReplayRequests
	s.BadRequests += o.BadRequests
	s.Replayed += o.Replayed
	s.Cut += o.Cut
	s.ReplayCut += o.ReplayCut
	s.ReplayIncomplete += o.ReplayIncomplete
	for i := range s.Snapshots {
		s.Snapshots[i] += o.Snapshots[i]
	}
}

// DroppedTotal sums the drops of every reason.
func (s Stats) DroppedTotal() uint64 {
	var n uint64
	for _, d := range s.Dropped {
		n += d
	}
	return n
}

// itemKind says what the sender goroutine does with a queued item.
type itemKind uint8

const (
	itemBatch     itemKind = iota // publish, keep for replay
	itemHeartbeat                 // publish only
	itemReset                     // empty the replay buffer, publish, keep as its first batch
	itemFlush                     // close done: everything queued before was handed to the socket
)

type item struct {
	entry
	kind itemKind
	done chan []flushTarget // itemFlush: the subscribers and how many messages each had queued at the marker
}

type flushTarget struct {
	c *conn
	n uint64
}

// Publisher publishes one stream's batches. Publish, PublishHeartbeat and PublishReset are called by one goroutine
// at a time (the stream's drain goroutine, or the daemon's lifecycle code under the stream's lock); Flush, Stats,
// Config and Close are safe for concurrent use.
type Publisher struct {
	cfg      Config // immutable
	endpoint string // immutable: as bound
	replayEP string // immutable
	topic    []byte // immutable
	log      *slog.Logger
	timeout  time.Duration // stall timeout
	backlog  int           // subscriber backlog

	ctx    context.Context
	cancel context.CancelFunc
	pubs   peerSet  // the PUB's subscribers
	router *peerSet // the replay socket's clients; nil without replay endpoint

	// The queue to the sender goroutine: Publish, PublishHeartbeat, PublishReset and Flush append under qmu, in
	// call order; the sender takes everything at once. qBatches counts the items that Publish and PublishHeartbeat
	// put there (bounded by DefaultQueueSize); resets and flushes are not counted, so they are never dropped.
	qmu       sync.Mutex
	q         []item
	qBatches  int
	closed    bool          // set by Close; nothing is queued after it
	wake      chan struct{} // capacity 1: the queue is not empty, or closed
	closeOnce sync.Once
	sendDone  sync.WaitGroup // the sender goroutine

	// Counters. Updated atomically.
	published, replayReqs, badReqs, replayed, incomplete, cut, replayCut atomic.Uint64
	dropped                                                              [numDrops]atomic.Uint64
	incompleteLog, badReqLog, snapLog                                    rateLog

	bufMu sync.Mutex // protects buf
	buf   replayBuffer

	snap snapState // snapshot.go
}

// isBind is vLLM's rule (ZmqEventPublisher._is_bind_endpoint) without inproc, which New refuses.
func isBind(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://")
}

func checkEndpoint(ep string) error {
	i := strings.Index(ep, "://")
	switch {
	case ep == "":
		return fmt.Errorf("%w: empty", ErrEndpoint)
	case strings.HasPrefix(ep, "inproc://"):
		return fmt.Errorf("%w: %s: inproc is in-process only; kvshmd is another process", ErrEndpoint, ep)
	case i <= 0 || i+3 == len(ep):
		return fmt.Errorf("%w: %q is not transport://address", ErrEndpoint, ep)
	case !strings.HasPrefix(ep, "tcp://") && !strings.HasPrefix(ep, "ipc://"):
		return fmt.Errorf("%w: %s: only tcp:// and ipc:// are supported", ErrEndpoint, ep)
	}
	return nil
}

// New makes the sockets (binding or starting the connection at once, so that a bind failure is the caller's
// error) and starts the sender goroutine.
func New(cfg Config, log *slog.Logger) (*Publisher, error) {
	if cfg.HWM < 0 || cfg.BufferSteps < 0 || cfg.BufferBytes < 0 || cfg.StallTimeout < 0 || cfg.SubscriberBacklog < 0 {
		return nil, fmt.Errorf("%w: hwm %d, buffer_steps %d, buffer bytes %d, stall timeout %v, subscriber backlog %d",
			ErrConfig, cfg.HWM, cfg.BufferSteps, cfg.BufferBytes, cfg.StallTimeout, cfg.SubscriberBacklog)
	}
	if err := checkEndpoint(cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.ReplayEndpoint != "" {
		if err := checkEndpoint(cfg.ReplayEndpoint); err != nil {
			return nil, err
		}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxBytes := cfg.BufferBytes
	if maxBytes == 0 {
		maxBytes = DefaultBufferBytes
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, topic: []byte(cfg.Topic), log: log, ctx: ctx, cancel: cancel,
		timeout: cfg.StallTimeout, backlog: cfg.SubscriberBacklog,
		wake: make(chan struct{}, 1), buf: replayBuffer{steps: cfg.BufferSteps, maxBytes: maxBytes}}
	if p.timeout == 0 {
		p.timeout = DefaultStallTimeout
	}
	if p.backlog == 0 {
		p.backlog = DefaultSubscriberBacklog
	}
	p.pubs = peerSet{ctx: ctx, timeout: p.timeout, mine: "PUB", peers: []string{"SUB", "XSUB"}, serve: p.serveSubscriber,
		newConn: func(nc net.Conn, r *bufio.Reader) *conn {
			c := newConn(nc, r, p.timeout, p.backlog, cfg.HWM)
			c.onCut = func() { p.cut.Add(1) }
			return c
		}}
	ep, err := p.open(&p.pubs, cfg.Endpoint, isBind(cfg.Endpoint))
	if err != nil {
		p.closeSockets()
		return nil, err
	}
	p.endpoint = ep
	if cfg.ReplayEndpoint != "" {
		p.router = &peerSet{ctx: ctx, timeout: p.timeout, mine: "ROUTER", peers: []string{"DEALER", "REQ", "ROUTER"},
			serve: p.serveReplayClient, newConn: func(nc net.Conn, r *bufio.Reader) *conn {
				c := newConn(nc, r, p.timeout, p.backlog, 0)
				c.onCut = func() { p.replayCut.Add(1) }
				return c
			}}
		if p.replayEP, err = p.open(p.router, cfg.ReplayEndpoint, true); err != nil {
			p.closeSockets()
			return nil, err
		}
	}
	p.sendDone.Add(1)
	go p.send()
	return p, nil
}

// open binds (bind) or connects s to ep and returns the endpoint as bound. An ipc socket file is made 0600. A
// connect runs in the background with retries, as libzmq's connect does (an absent peer is not an error).
func (p *Publisher) open(s *peerSet, ep string, bind bool) (string, error) {
	nep := parseEndpoint(ep)
	if !bind {
		s.dial(nep)
		return ep, nil
	}
	if err := bindEndpoint(s, nep); err != nil {
		return "", fmt.Errorf("%w: %s: %s: %w", ErrBind, ep, errnoName(err), err)
	}
	if nep.network == "unix" {
		if err := os.Chmod(nep.address, 0o600); err != nil {
			return "", fmt.Errorf("%w: chmod 0600 %s: %w", ErrBind, nep.address, err)
		}
		return ep, nil
	}
	if strings.HasSuffix(ep, ":0") {
		return "tcp://" + s.ln.Addr().String(), nil
	}
	return ep, nil
}

// errnoName names the OS errno inside err (EADDRINUSE, ...), or "error" when there is none.
func errnoName(err error) string {
	var en syscall.Errno
	if errors.As(err, &en) {
		return fmt.Sprintf("errno %d (%v)", int(en), en)
	}
	return "error"
}

// Config returns the configuration the publisher was made with.
func (p *Publisher) Config() Config { return p.cfg }

// Publish hands one batch (its seq and vLLM payload) to the sender goroutine. It never blocks: a full queue drops
// the batch (counted DropQueueFull) and returns false. The publisher keeps payload (for replay): the caller must not
// modify it afterwards.
func (p *Publisher) Publish(seq uint64, payload []byte) bool {
	return p.enqueue(item{entry: entry{seq: seq, payload: payload}, kind: itemBatch})
}

// PublishHeartbeat hands an empty batch (vllmwire's heartbeat payload) to the sender goroutine, ordered with
// Publish: published live, never kept for replay. It never blocks: a full queue drops it (counted DropQueueFull).
func (p *Publisher) PublishHeartbeat(seq uint64, payload []byte) bool {
	return p.enqueue(item{entry: entry{seq: seq, payload: payload}, kind: itemHeartbeat})
}

// PublishReset hands a reset batch to the sender goroutine, ordered with Publish: the sender empties the replay
// buffer, then publishes (seq, payload) live and keeps it as the buffer's first batch (the start or the end of an
// engine incarnation, LIFECYCLE.md). It never blocks and is never dropped for a full queue (it does not count
// against the queue's capacity); it returns false only after Close.
func (p *Publisher) PublishReset(seq uint64, payload []byte) bool {
	return p.enqueue(item{entry: entry{seq: seq, payload: payload, reset: true}, kind: itemReset})
}

// Flush waits until every batch handed over before the call was written to every connected subscriber (their
// outboxes drained) or timeout passed, and reports whether it completed. A subscriber that is cut meanwhile no
// longer counts. Used before a private daemon exits. false after Close.
func (p *Publisher) Flush(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	done := make(chan []flushTarget, 1)
	if !p.enqueue(item{kind: itemFlush, done: done}) {
		return false
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	var targets []flushTarget
	select {
	case targets = <-done:
	case <-t.C:
		return false
	}
	for _, ft := range targets {
		if !ft.c.waitWritten(ft.n, deadline) {
			return false
		}
	}
	return true
}

// enqueue appends it to the sender's queue; batches and heartbeats are dropped when DefaultQueueSize of them wait.
func (p *Publisher) enqueue(it item) bool {
	p.qmu.Lock()
	switch {
	case p.closed:
		p.qmu.Unlock()
		if it.kind != itemFlush {
			p.dropped[2].Add(1)
		}
		return false
	case (it.kind == itemBatch || it.kind == itemHeartbeat) && p.qBatches >= DefaultQueueSize:
		p.qmu.Unlock()
		p.dropped[0].Add(1)
		return false
	}
	if it.kind == itemBatch || it.kind == itemHeartbeat {
		p.qBatches++
	}
	p.q = append(p.q, it)
	p.qmu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return true
}

// send is the sender goroutine: it takes the whole queue at once and handles it in order; after Close it handles
// what was queued and returns.
func (p *Publisher) send() {
	defer p.sendDone.Done()
	var spare []item
	for {
		<-p.wake
		p.qmu.Lock()
		q, closed := p.q, p.closed
		p.q, p.qBatches = spare[:0], 0
		p.qmu.Unlock()
		for i := range q {
			p.handle(q[i])
			q[i] = item{} // drop the payload reference
		}
		spare = q
		if closed {
			return
		}
	}
}

func (p *Publisher) handle(it item) {
	switch it.kind {
	case itemFlush:
		var targets []flushTarget
		for _, c := range p.pubs.snapshot() {
			targets = append(targets, flushTarget{c, c.queued()})
		}
		it.done <- targets
		return
	case itemReset:
		p.bufMu.Lock()
		p.buf.clear()
		p.bufMu.Unlock()
	}
	// [topic, seq, payload]: one message shared by every subscriber's queue (the payload is not copied).
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], it.seq)
	hdr := appendFrame(nil, flagMore, p.topic)
	hdr = appendFrame(hdr, flagMore, seq[:])
	hdr = append(hdr, frameHeader(0, len(it.payload))...)
	msg := net.Buffers{hdr, it.payload}
	for _, c := range p.pubs.snapshot() {
		if c.subscribed.Load() {
			_ = c.put(msg, false) // a cut is counted by the connection
		}
	}
	p.published.Add(1)
	if it.kind != itemHeartbeat {
		p.bufMu.Lock()
		p.buf.add(it.entry)
		p.bufMu.Unlock()
	}
}

// serveSubscriber reads a subscriber's subscriptions (messages [0x01 topic] and [0x00 topic], as ZMTP 3.0 peers send
// them, or SUBSCRIBE and CANCEL commands, ZMTP 3.1) and answers its PINGs, until the connection ends.
func (p *Publisher) serveSubscriber(c *conn) {
	subs := map[string]int{}
	update := func(add bool, topic []byte) {
		if add {
			subs[string(topic)]++
		} else if subs[string(topic)]--; subs[string(topic)] <= 0 {
			delete(subs, string(topic))
		}
		match := false
		for t := range subs {
			match = match || strings.HasPrefix(string(p.topic), t)
		}
		c.subscribed.Store(match)
	}
	var frames int
	for {
		flags, body, err := readFrame(c.r, maxCommand)
		if err != nil {
			return
		}
		if flags&flagCommand != 0 {
			name, data, ok := c.command(body)
			if !ok {
				return
			}
			if name == "SUBSCRIBE" || name == "CANCEL" {
				update(name == "SUBSCRIBE", data)
			}
			continue
		}
		frames++
		if flags&flagMore != 0 {
			continue
		}
		if frames == 1 && len(body) > 0 && body[0] <= 1 { // a subscription message; anything else is ignored
			update(body[0] == 1, body[1:])
		}
		frames = 0
	}
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	s := Stats{Published: p.published.Load(), ReplayRequests: p.replayReqs.Load(), BadRequests: p.badReqs.Load(),
		Replayed: p.replayed.Load(), ReplayIncomplete: p.incomplete.Load(), Cut: p.cut.Load(),
		ReplayCut: p.replayCut.Load(), Endpoint: p.endpoint, ReplayEndpoint: p.replayEP}
	for i := range s.Dropped {
		s.Dropped[i] = p.dropped[i].Load()
	}
	for i := range s.Snapshots {
		s.Snapshots[i] = p.snap.outcomes[i].Load()
	}
	return s
}

// closeLinger bounds how long Close waits for the subscribers' queues to be written (with the stall timeout, if
// shorter); Flush waits as long as its caller says.
const closeLinger = time.Second

// Close stops the goroutines and closes the sockets (an ipc socket file is removed). Batches still queued are
// handed to the subscribers' queues, which get at most closeLinger (or the stall timeout) to be written; it is
// idempotent.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.qmu.Lock()
		p.closed = true
		p.qmu.Unlock()
		select {
		case p.wake <- struct{}{}:
		default:
		}
		p.sendDone.Wait()
		p.closeSockets()
	})
	return nil
}

func (p *Publisher) closeSockets() {
	deadline := time.Now().Add(min(p.timeout, closeLinger))
	drain := func(conns []*conn) { // concurrently: at most one stall timeout in all
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.waitWritten(c.queued(), deadline)
			}()
		}
		wg.Wait()
	}
	if p.pubs.ctx != nil {
		if p.pubs.ln != nil {
			_ = p.pubs.ln.Close()
		}
		drain(p.pubs.snapshot())
	}
	p.cancel()
	if p.pubs.ctx != nil {
		p.pubs.shut(nil)
	}
	if p.router != nil {
		p.router.shut(nil)
	}
}

// logEvery is the least time between two warnings of one kind (invalid replay requests, incomplete replies): the
// others are counted in the next warning's suppressed_since_last, and all in Stats.
const logEvery = 10 * time.Second

// rateLog writes one warning per logEvery. Safe for concurrent use.
type rateLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (r *rateLog) warn(log *slog.Logger, msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last) < logEvery {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	n := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	log.Warn(msg, append(args, "suppressed_since_last", n)...)
}
