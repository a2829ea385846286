package zmqpub

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Config is one stream's publishing configuration, as the producer asks for it at ATTACH (vLLM's KVEventsConfig
// fields). The dp_rank port offset is already applied by the producer.
type Config struct {
	Endpoint       string // PUB endpoint; bound when it has "*" or "::" or is ipc://, connected otherwise
	ReplayEndpoint string // ROUTER endpoint (always bound); "" = no replay socket
	Topic          string
	HWM            int // PUB high-water mark (messages); 0 = unlimited
	BufferSteps    int // batches kept for replay, at most (the buffer grows as used)
	// BufferBytes caps the replay buffer's payload bytes (the oldest batches are evicted first); 0 means
	// DefaultBufferBytes. Not part of the ATTACH request (the daemon's per-stream cap).
	BufferBytes int
	// StallTimeout: a connection whose peer has not taken a write for this long is closed (transport.go); 0 means
	// DefaultStallTimeout. Not part of the ATTACH request (kvshm's own setting).
	StallTimeout time.Duration
	// SubscriberBacklog bounds, in bytes, how far one subscriber may fall behind before it is cut (each PUB
	// connection has an outbox of its own, so a slow subscriber never delays the others; transport.go); 0 means
	// DefaultSubscriberBacklog. Not part of the ATTACH request.
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
	DropSendError = "send_error" // the PUB socket refused the message
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
	// ReplayIncomplete counts replies that could not hold everything from the requested seq: it is before the
	// oldest buffered batch and that batch is not a reset batch (the buffer rolled over, or the daemon restarted
	// since the incarnation began).
	ReplayIncomplete uint64
	Endpoint         string // the PUB endpoint (as bound: a port 0 is resolved)
	ReplayEndpoint   string // "" without replay socket
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
	s.ReplayIncomplete += o.ReplayIncomplete
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
	done chan struct{} // itemFlush
}

// Publisher publishes one stream's batches. Publish is called by one goroutine (the stream's drain goroutine);
// Stats, Config and Close are safe for concurrent use.
type Publisher struct {
	cfg      Config // immutable
	endpoint string // immutable: as bound
	replayEP string // immutable
	topic    []byte // immutable
	log      *slog.Logger

	ctx      context.Context
	cancel   context.CancelFunc
	pub      zmq4.Socket
	router   zmq4.Socket // nil without replay endpoint
	ipcFiles []string    // ipc socket files bound (removed by Close); set by New
	conns    connSet     // the PUB's connections (Flush)

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
	wg        sync.WaitGroup // the replay goroutine

	// Counters. Updated atomically.
	published, replayReqs, badReqs, replayed, incomplete atomic.Uint64
	dropped                                              [numDrops]atomic.Uint64
	incompleteLog, badReqLog                             rateLog

	bufMu sync.Mutex // protects buf
	buf   replayBuffer
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
// error) and starts the sender goroutine and, with a replay endpoint, the replay goroutine.
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
	ctx, cancel := context.WithCancel(context.Background())
	maxBytes := cfg.BufferBytes
	if maxBytes == 0 {
		maxBytes = DefaultBufferBytes
	}
	p := &Publisher{cfg: cfg, topic: []byte(cfg.Topic), log: log, ctx: ctx, cancel: cancel,
		wake: make(chan struct{}, 1), buf: replayBuffer{steps: cfg.BufferSteps, maxBytes: maxBytes}}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("%w: set hwm %d: %w", ErrConfig, cfg.HWM, err)
	}
	ep, err := p.open(p.pub, cfg.Endpoint, isBind(cfg.Endpoint), true)
	if err != nil {
		p.closeSockets()
		return nil, err
	}
	p.endpoint = ep
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx)
		if p.replayEP, err = p.open(p.router, cfg.ReplayEndpoint, true, false); err != nil {
			p.closeSockets()
			return nil, err
		}
	}
	p.sendDone.Add(1)
	go p.send()
	if p.router != nil {
		p.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// open binds (bind) or connects sck to ep and returns the endpoint as bound, its connections with outboxes (the PUB)
// or writing straight to the socket (the ROUTER). An ipc socket file is made 0600. A connect runs in the background
// with retries, as libzmq's connect does (an absent peer is not an error).
func (p *Publisher) open(sck zmq4.Socket, ep string, bind, outboxes bool) (string, error) {
	o := connOpts{timeout: p.cfg.StallTimeout}
	if o.timeout == 0 {
		o.timeout = DefaultStallTimeout
	}
	if outboxes {
		if o.backlog = p.cfg.SubscriberBacklog; o.backlog == 0 {
			o.backlog = DefaultSubscriberBacklog
		}
		o.conns = &p.conns
	}
	iep, err := internalEndpoint(ep, o)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrBind, ep, err)
	}
	if !bind {
		go func() {
			if err := sck.Dial(iep); err != nil && p.ctx.Err() == nil {
				p.log.Warn("zmq connect failed: batches are not delivered", "endpoint", ep, "err", err)
			}
		}()
		return ep, nil
	}
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		// As libzmq does: a socket file left by an earlier run (a crashed daemon) is replaced. Anything else at
		// the path makes the bind fail.
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == os.ModeSocket {
			_ = os.Remove(path)
		}
	}
	if err := sck.Listen(iep); err != nil {
		return "", fmt.Errorf("%w: %s: %s: %w", ErrBind, ep, errnoName(err), err)
	}
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		p.ipcFiles = append(p.ipcFiles, path) // zmq4 removes only files of its own ipc:// scheme
		if err := os.Chmod(path, 0o600); err != nil {
			return "", fmt.Errorf("%w: chmod 0600 %s: %w", ErrBind, path, err)
		}
		return ep, nil
	}
	if a := sck.Addr(); a != nil && strings.HasSuffix(ep, ":0") {
		return "tcp://" + a.String(), nil
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
	done := make(chan struct{})
	if !p.enqueue(item{kind: itemFlush, done: done}) {
		return false
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return false
	}
	return p.conns.drained(deadline)
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
		close(it.done)
		return
	case itemReset:
		p.bufMu.Lock()
		p.buf.clear()
		p.bufMu.Unlock()
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], it.seq)
	// zmq4's PUB Send only queues the message (or drops it past the HWM, silently): it never waits for a subscriber.
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, seq[:], it.payload)); err != nil {
		p.dropped[1].Add(1)
		p.log.Debug("zmq publish failed", "seq", it.seq, "err", err)
	} else {
		p.published.Add(1)
	}
	if it.kind != itemHeartbeat {
		p.bufMu.Lock()
		p.buf.add(it.entry)
		p.bufMu.Unlock()
	}
}

// since returns the buffered batches with seq >= start, in publication order, and counts (and logs, rate-limited)
// a reply that cannot be complete.
func (p *Publisher) since(start uint64) []entry {
	p.bufMu.Lock()
	out, complete := p.buf.since(start)
	var oldest uint64
	if p.buf.len() > 0 {
		oldest = p.buf.q[p.buf.head].seq
	}
	p.bufMu.Unlock()
	if !complete {
		p.incomplete.Add(1)
		p.incompleteLog.warn(p.log, "zmq replay reply incomplete: the requested seq is older than the replay buffer "+
			"(rolled over, or kvshmd restarted since the engine incarnation began)", "start", start, "oldest", oldest)
	}
	return out
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

// endSeq is vLLM's END_SEQ: -1 as 8 signed big-endian bytes.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// serveReplay is the replay goroutine: one request at a time, answered as vLLM's _service_replay does.
func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.log.Debug("zmq replay recv failed", "err", err)
			continue
		}
		// [identity, "", start_seq]: vLLM checks the frame count only and reads the seq as a big-endian
		// integer; kvshm also requires 1..8 seq bytes.
		if len(msg.Frames) != 3 || len(msg.Frames[2]) == 0 || len(msg.Frames[2]) > 8 {
			p.badReqs.Add(1)
			p.badReqLog.warn(p.log, "invalid zmq replay request: ignored", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		var start uint64
		for _, b := range msg.Frames[2] {
			start = start<<8 | uint64(b)
		}
		p.replayReqs.Add(1)
		for _, e := range p.since(start) {
			var seq [8]byte
			binary.BigEndian.PutUint64(seq[:], e.seq)
			if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, p.topic, seq[:], e.payload)); err != nil {
				p.log.Debug("zmq replay send failed", "err", err)
				break
			}
			p.replayed.Add(1)
		}
		if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, nil, endSeq, nil)); err != nil {
			p.log.Debug("zmq replay end marker failed", "err", err)
		}
	}
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	s := Stats{Published: p.published.Load(), ReplayRequests: p.replayReqs.Load(), BadRequests: p.badReqs.Load(),
		Replayed: p.replayed.Load(), ReplayIncomplete: p.incomplete.Load(), Endpoint: p.endpoint,
		ReplayEndpoint: p.replayEP}
	for i := range s.Dropped {
		s.Dropped[i] = p.dropped[i].Load()
	}
	return s
}

// Close stops the goroutines and closes the sockets (an ipc socket file is removed). Batches still queued are
// sent first unless the PUB socket is stuck; it is idempotent.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.qmu.Lock()
		p.closed = true
		p.qmu.Unlock()
		select {
		case p.wake <- struct{}{}:
		default:
		}
		p.sendDone.Wait() // the queue drains fast: a PUB send only queues
		p.closeSockets()
		p.wg.Wait()
	})
	return nil
}

func (p *Publisher) closeSockets() {
	p.cancel()
	if p.router != nil {
		_ = p.router.Close()
	}
	_ = p.pub.Close()
	for _, f := range p.ipcFiles {
		_ = os.Remove(f)
	}
}
