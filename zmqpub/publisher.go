package zmqpub

import (
	"bufio"
	"cmp"
	"context"
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
	// ConnsPerAddr bounds the connections one remote address (an IPv4 address, an IPv6 /64) may have on each
	// socket, handshakes under way included: its share of the socket's 1,024, so that one host's connections
	// leave room for every other host's (doc.go, "Bounds"); one more is closed at accept. 0 means
	// DefaultConnsPerAddr; ipc:// sockets have none. Not part of the ATTACH request (the daemon's --zmq-conns-per-addr).
	ConnsPerAddr int
	// AddrBacklog bounds, in bytes, what the connections of one remote address may have queued on each socket
	// together (subscribers on the PUB, replies on the replay socket); the connection whose message would go past
	// it is cut (a reply waits for its own queue first). 0 means DefaultAddrBacklogs subscriber backlogs; ipc://
	// sockets have none. Not part of the ATTACH request.
	AddrBacklog int
	// JoinWindow: a subscriber whose subscriptions first match the topic within this long after New is given the
	// batches the replay buffer holds before the live ones (join.go; doc.go, "Late joiners"); 0 means
	// DefaultJoinWindow. Not part of the ATTACH request.
	JoinWindow time.Duration
}

// DefaultAddrBacklogs is the default Config.AddrBacklog in Config.SubscriberBacklogs: an address's connections may
// queue as much together as this many of them can each.
const DefaultAddrBacklogs = 4

// DefaultBufferBytes is the default Config.BufferBytes.
const DefaultBufferBytes = 64 << 20

// Drop reasons (the label values of kvshm_zmq_dropped_batches_total).
const (
	DropQueueFull = "queue_full" // no longer produced (Publish hands out inline: there is no queue); a stable label
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
	// PeersCut counts the peers of either socket cut for a bound, by CutReasons (bounds.go): connections closed
	// for what their peer did or did not do, and connections refused at accept or after their handshake.
	PeersCut [numCutReasons]uint64
	// ReplayIncomplete counts replies that could not hold everything from the requested seq: it is before the
	// oldest buffered batch and that batch is not a reset batch (the buffer rolled over, or the daemon restarted
	// since the incarnation began).
	ReplayIncomplete uint64
	// Snapshots counts the replies that needed a snapshot, by SnapshotOutcomes (snapshot.go).
	Snapshots [numSnapshotOutcomes]uint64
	// ReplayFilled counts the empty batches replies carried to keep their seqs contiguous; ReplayGapped the replies
	// that could not be made contiguous with a filler set (fill.go).
	ReplayFilled, ReplayGapped uint64
	// Joins counts the subscribers that joined within the join window and were given the buffered batches;
	// JoinedBatches the batches they were given (join.go).
	Joins, JoinedBatches uint64
	Endpoint             string // the PUB endpoint (as bound: a port 0 is resolved)
	ReplayEndpoint       string // "" without replay socket
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
	s.ReplayFilled += o.ReplayFilled
	s.ReplayGapped += o.ReplayGapped
	s.Joins += o.Joins
	s.JoinedBatches += o.JoinedBatches
	for i := range s.Snapshots {
		s.Snapshots[i] += o.Snapshots[i]
	}
	for i := range s.PeersCut {
		s.PeersCut[i] += o.PeersCut[i]
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

// itemKind says what publish does with a batch besides sending it.
type itemKind uint8

const (
	itemBatch     itemKind = iota // publish, keep for replay
	itemHeartbeat                 // publish only
	itemReset                     // empty the replay buffer, publish, keep as its first batch
)

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
	// opened is when New made the sockets and joinWindow how long after it a new subscriber is given the buffered
	// batches (join.go). Immutable.
	opened     time.Time
	joinWindow time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	pubs   peerSet  // the PUB's subscribers
	router *peerSet // the replay socket's clients; nil without replay endpoint

	// pmu orders Publish, PublishHeartbeat and PublishReset (each hands its message to every subscriber inline)
	// with Flush's snapshot and Close: held for one call's fan-out, which never waits (conn.put).
	pmu    sync.Mutex
	closed bool // set by Close; nothing is published after it
	// midStream: the first batch this publisher handed out (heartbeats aside) was not a reset batch, so it began in
	// the middle of an engine incarnation (a restarted daemon); fresh: it was one. Late joiners are given the
	// buffered batches only midStream (join.go). Protected by pmu.
	midStream, fresh bool
	closeOnce        sync.Once

	// newest is 1 + the newest seq handed out (any kind; 0: none), stored after the batch is in the buffer: every
	// seq up to it that a reply finds neither buffered nor lost was a heartbeat's (fill.go).
	newest atomic.Uint64

	// Counters. Updated atomically.
	published, replayReqs, badReqs, replayed, incomplete, cut, replayCut atomic.Uint64
	filled, gapped, joins, joinedBatches                                 atomic.Uint64
	dropped                                                              [numDrops]atomic.Uint64
	peersCut                                                             [numCutReasons]atomic.Uint64
	incompleteLog, badReqLog, snapLog                                    rateLog

	bufMu sync.Mutex // protects buf
	buf   replayBuffer

	snap snapState              // snapshot.go
	fill atomic.Pointer[filler] // fill.go; nil: replies keep the buffer's seqs
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
// error).
func New(cfg Config, log *slog.Logger) (*Publisher, error) {
	if cfg.HWM < 0 || cfg.BufferSteps < 0 || cfg.BufferBytes < 0 || cfg.StallTimeout < 0 || cfg.SubscriberBacklog < 0 ||
		cfg.ConnsPerAddr < 0 || cfg.AddrBacklog < 0 || cfg.JoinWindow < 0 {
		return nil, fmt.Errorf("%w: hwm %d, buffer_steps %d, buffer bytes %d, stall timeout %v, subscriber backlog %d, "+
			"connections per address %d, address backlog %d, join window %v", ErrConfig, cfg.HWM, cfg.BufferSteps,
			cfg.BufferBytes, cfg.StallTimeout, cfg.SubscriberBacklog, cfg.ConnsPerAddr, cfg.AddrBacklog, cfg.JoinWindow)
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
		timeout: cfg.StallTimeout, backlog: cfg.SubscriberBacklog, opened: time.Now(),
		joinWindow: cmp.Or(cfg.JoinWindow, DefaultJoinWindow),
		buf:        replayBuffer{steps: cfg.BufferSteps, maxBytes: maxBytes}}
	if p.timeout == 0 {
		p.timeout = DefaultStallTimeout
	}
	if p.backlog == 0 {
		p.backlog = DefaultSubscriberBacklog
	}
	perAddr := cmp.Or(cfg.ConnsPerAddr, DefaultConnsPerAddr)
	addrBacklog := cmp.Or(cfg.AddrBacklog, DefaultAddrBacklogs*p.backlog)
	cut := func(r cutReason) { p.peersCut[r].Add(1) }
	p.pubs = peerSet{ctx: ctx, timeout: p.timeout, mine: "PUB", peers: []string{"SUB", "XSUB"}, serve: p.serveSubscriber,
		perAddr: perAddr, addrBacklog: addrBacklog, cut: cut, newConn: func(nc net.Conn, r *bufio.Reader) *conn {
			c := newConn(nc, r, p.timeout, p.backlog, cfg.HWM)
			c.onCut = func(r cutReason) {
				cut(r)
				if r == cutBacklog || r == cutAddrBacklog || r == cutStalled {
					p.cut.Add(1)
				}
			}
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
			serve: p.serveReplayClient, perAddr: perAddr, addrBacklog: addrBacklog, cut: cut,
			newConn: func(nc net.Conn, r *bufio.Reader) *conn {
				c := newConn(nc, r, p.timeout, p.backlog, 0)
				c.onCut = func(r cutReason) {
					cut(r)
					if r == cutStalled {
						p.replayCut.Add(1)
					}
				}
				return c
			}}
		if p.replayEP, err = p.open(p.router, cfg.ReplayEndpoint, true); err != nil {
			p.closeSockets()
			return nil, err
		}
	}
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

// Publish hands one batch (its seq and vLLM payload) to every subscriber and keeps it for replay. It never blocks:
// a subscriber whose socket takes the message at once gets it written by this call (no goroutine is woken); the
// rest of it waits in the subscriber's queue for its writer goroutine; a subscriber past its bounds is cut. It
// returns false (counted DropClosed) only after Close. The publisher keeps payload (for replay): the caller must not
// modify it afterwards.
func (p *Publisher) Publish(seq uint64, payload []byte) bool {
	return p.publish(entry{seq: seq, payload: payload}, itemBatch)
}

// PublishHeartbeat publishes an empty batch (vllmwire's heartbeat payload) as Publish does, in order with it, and
// never keeps it for replay. false only after Close.
func (p *Publisher) PublishHeartbeat(seq uint64, payload []byte) bool {
	return p.publish(entry{seq: seq, payload: payload}, itemHeartbeat)
}

// PublishReset empties the replay buffer, then publishes (seq, payload) as Publish does and keeps it as the buffer's
// first batch (the start or the end of an engine incarnation, docs/lifecycle.md). Its payload only clears (kvshmd: an
// AllBlocksCleared): a reply from seq 0, to a consumer that holds nothing of the stream, leaves it out (replay.go).
// It never blocks; it returns false only after Close.
func (p *Publisher) PublishReset(seq uint64, payload []byte) bool {
	return p.publish(entry{seq: seq, payload: payload, reset: true}, itemReset)
}

// Flush waits until every batch published before the call was written to every connected subscriber (their
// queues drained) or timeout passed, and reports whether it completed. A subscriber that is cut meanwhile no
// longer counts. Used before a private daemon exits. false after Close.
func (p *Publisher) Flush(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	p.pmu.Lock()
	if p.closed {
		p.pmu.Unlock()
		return false
	}
	var targets []flushTarget
	for _, c := range p.pubs.snapshot() {
		targets = append(targets, flushTarget{c, c.queued()})
	}
	p.pmu.Unlock()
	for _, ft := range targets {
		if !ft.c.waitWritten(ft.n, deadline) {
			return false
		}
	}
	return true
}

// publish sends e to every subscribed connection ([topic, seq, payload]: one message shared by every subscriber's
// queue, the payload not copied) and updates the replay buffer as kind says, in the caller's goroutine.
func (p *Publisher) publish(e entry, kind itemKind) bool {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	if p.closed {
		p.dropped[2].Add(1)
		return false
	}
	if kind == itemReset {
		p.bufMu.Lock()
		p.buf.clear()
		p.bufMu.Unlock()
	}
	if kind != itemHeartbeat && !p.midStream && !p.fresh {
		p.midStream, p.fresh = kind == itemBatch, kind == itemReset
	}
	hdr := p.appendMsgHeader(make([]byte, 0, p.msgOverhead()), e) // one allocation: it may stay queued after this call
	msg := net.Buffers{hdr, e.payload}
	// Into the replay buffer before any subscriber can read it: the direct write below may reach a subscriber at
	// once, and a replay it asks for next must hold the batch it just received (TestEngineDeathAndRestart saw the
	// newest batch missing from such a replay when the buffer was updated after the write).
	if kind != itemHeartbeat {
		p.bufMu.Lock()
		p.buf.add(e)
		p.bufMu.Unlock()
	}
	for _, c := range p.pubs.snapshot() {
		if c.subscribed.Load() {
			_ = c.put(msg, false) // a cut is counted by the connection
		}
	}
	p.published.Add(1) // after the buffer: Stats().Published == n means every batch of the n can be replayed
	p.newest.Store(e.seq + 1)
	return true
}

// serveSubscriber reads a subscriber's subscriptions (messages [0x01 topic] and [0x00 topic], as ZMTP 3.0 peers send
// them, or SUBSCRIBE and CANCEL commands, ZMTP 3.1) and answers its PINGs, until the connection ends (the read error,
// or a *cutError for a bound the peer went past). Of each frame it keeps what matching needs: a command's name and
// one byte more than the topic (a longer subscription cannot match), so a frame costs O(len(topic)) however large.
func (p *Publisher) serveSubscriber(c *conn) error {
	subs := newSubscriptions(p.topic)
	first := true // no subscription has matched yet (join.go)
	keep := 1 + maxCommandName + len(p.topic) + 1
	var buf []byte
	frames := 0 // of the message being read
	for {
		flags, size, err := readHeader(c.r, maxCommand)
		if err != nil {
			return err
		}
		if buf, err = readPrefix(c.r, size, keep, buf); err != nil {
			return err
		}
		if flags&flagCommand != 0 {
			name, data, err := parseCommand(buf)
			if err != nil {
				return err
			}
			dataLen := size - 1 - len(name)
			switch name {
			case "SUBSCRIBE", "CANCEL":
				err = subs.update(name == "SUBSCRIBE", data, dataLen)
			default:
				err = c.command(name, data, dataLen)
			}
			if err != nil {
				return err
			}
			if err := p.subscribed(c, subs.matches(), &first); err != nil {
				return err
			}
			continue
		}
		frames++
		if flags&flagMore != 0 {
			continue
		}
		if frames == 1 && size > 0 && buf[0] <= 1 { // a subscription message; anything else is ignored
			if err := subs.update(buf[0] == 1, buf[1:], size-1); err != nil {
				return err
			}
			if err := p.subscribed(c, subs.matches(), &first); err != nil {
				return err
			}
		}
		frames = 0
	}
}

// Stats returns the counters.
func (p *Publisher) Stats() Stats {
	s := Stats{Published: p.published.Load(), ReplayRequests: p.replayReqs.Load(), BadRequests: p.badReqs.Load(),
		Replayed: p.replayed.Load(), ReplayIncomplete: p.incomplete.Load(), Cut: p.cut.Load(),
		ReplayCut: p.replayCut.Load(), ReplayFilled: p.filled.Load(), ReplayGapped: p.gapped.Load(),
		Joins: p.joins.Load(), JoinedBatches: p.joinedBatches.Load(),
		Endpoint: p.endpoint, ReplayEndpoint: p.replayEP}
	for i := range s.Dropped {
		s.Dropped[i] = p.dropped[i].Load()
	}
	for i := range s.Snapshots {
		s.Snapshots[i] = p.snap.outcomes[i].Load()
	}
	for i := range s.PeersCut {
		s.PeersCut[i] = p.peersCut[i].Load()
	}
	return s
}

// closeLinger bounds how long Close waits for the subscribers' queues to be written (with the stall timeout, if
// shorter); Flush waits as long as its caller says.
const closeLinger = time.Second

// Close stops the goroutines and closes the sockets (an ipc socket file is removed). What the subscribers' queues
// hold gets at most closeLinger (or the stall timeout) to be written; it is idempotent.
func (p *Publisher) Close() error {
	p.closeOnce.Do(func() {
		p.pmu.Lock()
		p.closed = true
		p.pmu.Unlock()
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
