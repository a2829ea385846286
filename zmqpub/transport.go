package zmqpub

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4 writes a PUB socket's messages to its subscribers one after the other with no write deadline, so one
// subscriber that stops reading would stall every other one. kvshm's sockets therefore use two transports of its
// own, the tcp and unix ones, whose connections have a write deadline (a write blocked for the stall timeout closes
// that connection: its peer reconnects, as libzmq peers do, and sees a seq gap it can replay) and, on the PUB, an
// outbox per connection so that zmq4's write never waits for one subscriber (connOpts, outbox). The endpoints users
// give keep their tcp:// and ipc:// names; only the sockets see the internal scheme.
const (
	schemeTCP = "kvshm-tcp"
	schemeIPC = "kvshm-ipc"
)

// DefaultStallTimeout is the default Config.StallTimeout.
const DefaultStallTimeout = 2 * time.Second

// DefaultSubscriberBacklog is the default Config.SubscriberBacklog.
const DefaultSubscriberBacklog = 16 << 20

// connOpts are the settings of a kvshm transport's connections. backlog 0: writes go straight to the socket (the
// writer waits, at most timeout: the ROUTER, whose replay goroutine may wait for its one peer); backlog > 0: each
// connection has an outbox of at most backlog bytes drained by a goroutine of its own, so a write never waits for
// the peer (the PUB: zmq4 writes each message to its subscribers in turn, and one stuck subscriber would otherwise
// hold the others until its cut).
type connOpts struct {
	timeout time.Duration
	backlog int
	conns   *connSet // with a backlog: the publisher's connections (Flush)
}

// connSet is the set of a publisher's connections with outboxes.
type connSet struct {
	mu sync.Mutex
	m  map[*outbox]struct{}
}

func (s *connSet) add(o *outbox) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[*outbox]struct{}{}
	}
	s.m[o] = struct{}{}
	s.mu.Unlock()
}

func (s *connSet) remove(o *outbox) {
	s.mu.Lock()
	delete(s.m, o)
	s.mu.Unlock()
}

// drained waits until every outbox in the set is empty (a cut one is removed) or deadline; it reports which.
func (s *connSet) drained(deadline time.Time) bool {
	for {
		busy := false
		s.mu.Lock()
		for o := range s.m {
			if o.pending() {
				busy = true
				break
			}
		}
		s.mu.Unlock()
		if !busy {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// errBacklog is the cause of a connection closed because its peer fell more than the backlog behind.
var errBacklog = errors.New("kvshm/zmqpub: peer fell behind by more than the subscriber backlog: connection closed")

// errStalled is the cause of a connection closed because a write was blocked for the stall timeout.
var errStalled = errors.New("kvshm/zmqpub: peer stopped reading (write blocked for the stall timeout): connection closed")

// stallSchemes maps connection settings to the suffix of their registered schemes (zmq4's registry is global, a
// name cannot be registered twice, and the settings are per socket: one pair of schemes per distinct settings).
// Protected by regMu.
var (
	regMu        sync.Mutex
	stallSchemes = map[connOpts]string{}
)

// internalEndpoint returns ep with its scheme replaced by the kvshm transport of those settings (registered on
// first use). ep was checked by checkEndpoint (tcp:// or ipc://).
func internalEndpoint(ep string, o connOpts) (string, error) {
	suffix, err := registerStall(o)
	if err != nil {
		return "", err
	}
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return schemeTCP + suffix + "://" + rest, nil
	}
	return schemeIPC + suffix + "://" + strings.TrimPrefix(ep, "ipc://"), nil
}

func registerStall(o connOpts) (string, error) {
	regMu.Lock()
	defer regMu.Unlock()
	if s, ok := stallSchemes[o]; ok {
		return s, nil
	}
	suffix := fmt.Sprintf("-%d", len(stallSchemes))
	if err := zmq4.RegisterTransport(schemeTCP+suffix, stallTransport{transport.New("tcp"), o}); err != nil {
		return "", err
	}
	if err := zmq4.RegisterTransport(schemeIPC+suffix, stallTransport{transport.New("unix"), o}); err != nil {
		return "", err
	}
	stallSchemes[o] = suffix
	return suffix, nil
}

// stallTransport is a zmq4 transport whose connections close when a write blocks for the timeout (and, with a
// backlog, when the peer falls that far behind).
type stallTransport struct {
	inner transport.Transport
	opts  connOpts
}

func (t stallTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return newStallConn(c, t.opts, nil, 0), nil
}

func (t stallTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return newStallListener(l, t.opts), nil
}

func (t stallTransport) Addr(ep string) (string, error) { return t.inner.Addr(ep) }

// maxPendingHandshakes bounds the connections whose greeting is being read at once; a connection beyond it is
// closed at once (a flood of connections that open and stall cannot exhaust the daemon's fds).
const maxPendingHandshakes = 128

// stallListener hands zmq4 only connections whose peer has already sent its whole ZMTP greeting and READY command.
//
// zmq4 v0.17.0 runs each accepted connection's handshake inline in its accept loop, with no deadline, and never
// closes a connection whose handshake failed: one peer that connects and stalls (silent, or half a greeting) kept
// every later subscriber and replay client out for as long as it stayed, and each peer that sent garbage leaked a
// file descriptor. So the listener accepts in a goroutine of its own and, per connection, in another goroutine with
// the stall timeout as deadline: writes the server's greeting (the one zmq4 writes: ZMTP 3.0, NULL, not as-server),
// reads the peer's 64-byte greeting (a ZMTP 3 signature, mechanism NULL) and its first command (READY under NULL,
// at most 64 KiB). A connection that fails or times out is closed. The others go to zmq4's Accept with those bytes
// buffered: its handshake reads them from the buffer and its greeting write is swallowed (sent already), so it
// cannot wait on the peer. If zmq4's handshake still fails (an incompatible socket type), zmq4 drops the
// connection without closing it and never reads it again: a handed-over connection not read past its buffered
// bytes within the stall timeout is closed (zmq4's PUB and ROUTER read every connection they keep at once).
type stallListener struct {
	net.Listener
	opts    connOpts
	timeout time.Duration // opts.timeout
	ready   chan net.Conn
	done    chan struct{}
	once    sync.Once
	pending chan struct{}
}

func newStallListener(l net.Listener, o connOpts) *stallListener {
	sl := &stallListener{Listener: l, opts: o, timeout: o.timeout, ready: make(chan net.Conn), done: make(chan struct{}),
		pending: make(chan struct{}, maxPendingHandshakes)}
	go sl.acceptLoop()
	return sl
}

func (l *stallListener) shut() { l.once.Do(func() { close(l.done) }) }

func (l *stallListener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				l.shut()
				return
			}
			select { // a temporary error (EMFILE, ...): retry shortly
			case <-l.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		select {
		case l.pending <- struct{}{}:
			go l.handshake(c)
		default:
			_ = c.Close()
		}
	}
}

func (l *stallListener) handshake(c net.Conn) {
	pre, err := readPeerHandshake(c, l.timeout)
	<-l.pending
	if err != nil {
		_ = c.Close()
		return
	}
	sc := newStallConn(c, l.opts, pre, len(serverGreeting))
	sc.orphan = time.AfterFunc(l.timeout, sc.closeIfOrphan) // before the handover: zmq4's reader reads the field
	select {
	case l.ready <- sc:
	case <-l.done:
		sc.orphan.Stop()
		_ = c.Close()
	}
}

// Accept returns the next connection that completed the peer's half of the handshake.
func (l *stallListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close closes the listener; connections still in their handshake are closed by their goroutines.
func (l *stallListener) Close() error {
	err := l.Listener.Close()
	l.shut()
	return err
}

// serverGreeting is the ZMTP 3.0 greeting zmq4 v0.17.0 writes for a NULL-security socket (its greeting.marshal).
var serverGreeting = func() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	return g
}()

// maxCommand bounds the peer's first command (READY with its metadata).
const maxCommand = 64 << 10

// readPeerHandshake writes the server greeting and reads the peer's greeting and first command within timeout;
// it returns the bytes read.
func readPeerHandshake(c net.Conn, timeout time.Duration) ([]byte, error) {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if _, err := c.Write(serverGreeting); err != nil {
		return nil, err
	}
	buf := make([]byte, 64+9)
	if _, err := io.ReadFull(c, buf[:64]); err != nil {
		return nil, err
	}
	if buf[0] != 0xff || buf[9] != 0x7f || buf[10] < 3 || string(bytes.TrimRight(buf[12:32], "\x00")) != "NULL" {
		return nil, errors.New("zmqpub: not a ZMTP 3 NULL greeting")
	}
	if _, err := io.ReadFull(c, buf[64:65]); err != nil {
		return nil, err
	}
	flags := buf[64]
	if flags&0x04 == 0 || flags&^0x07 != 0 {
		return nil, errors.New("zmqpub: the peer's first frame is no command")
	}
	hdr := 65 + 1
	if flags&0x02 != 0 {
		hdr = 65 + 8
	}
	if _, err := io.ReadFull(c, buf[65:hdr]); err != nil {
		return nil, err
	}
	var size uint64
	if flags&0x02 != 0 {
		size = binary.BigEndian.Uint64(buf[65:hdr])
	} else {
		size = uint64(buf[65])
	}
	if size > maxCommand {
		return nil, errors.New("zmqpub: the peer's first command is too large")
	}
	out := make([]byte, hdr+int(size))
	copy(out, buf[:hdr])
	if _, err := io.ReadFull(c, out[hdr:]); err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return out, nil
}

// stallConn arms a write deadline before each write. A write that times out closes the connection and returns a
// non-timeout net.Error, which makes zmq4 drop the connection (it keeps a connection on a timeout error). An accepted
// connection first serves the peer's handshake bytes the listener read (pre) and swallows zmq4's greeting write
// (skipWrite bytes, sent already by the listener).
type stallConn struct {
	net.Conn
	timeout   time.Duration
	pre       []byte
	skipWrite int
	orphan    *time.Timer // accepted connections: closes one zmq4 dropped (see stallListener)
	reading   atomic.Bool
	out       *outbox // with a backlog: writes go through it (nil: straight to the socket)
}

func newStallConn(c net.Conn, o connOpts, pre []byte, skipWrite int) *stallConn {
	sc := &stallConn{Conn: c, timeout: o.timeout, pre: pre, skipWrite: skipWrite}
	if o.backlog > 0 {
		sc.out = newOutbox(sc, o.backlog, o.conns)
	}
	return sc
}

func (c *stallConn) Read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	if c.orphan != nil && !c.reading.Swap(true) {
		c.orphan.Stop()
	}
	return c.Conn.Read(p)
}

func (c *stallConn) closeIfOrphan() {
	if !c.reading.Swap(true) {
		_ = c.Conn.Close()
	}
}

func (c *stallConn) Write(p []byte) (int, error) {
	if c.skipWrite > 0 {
		k := min(c.skipWrite, len(p))
		c.skipWrite -= k
		if k == len(p) {
			return k, nil
		}
		n, err := c.Write(p[k:])
		return k + n, err
	}
	if c.out != nil {
		return c.out.put(p)
	}
	return c.writeNow(p)
}

// writeNow writes p to the socket, waiting at most the stall timeout.
func (c *stallConn) writeNow(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(p)
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		_ = c.Conn.Close()
		return n, &net.OpError{Op: "write", Net: c.Conn.LocalAddr().Network(), Addr: c.Conn.RemoteAddr(), Err: errStalled}
	}
	return n, err
}

// Close closes the connection; with an outbox, what it holds is written first (at most the stall timeout).
func (c *stallConn) Close() error {
	if c.out != nil {
		c.out.drainAndStop(c.timeout)
	}
	return c.Conn.Close()
}

// outbox queues a connection's writes (copies, in order) for a goroutine of its own, so that the writer (zmq4's
// PUB, writing each message to its subscribers in turn) never waits for this peer. A peer more than max bytes
// behind is cut: the connection is closed and every later write fails with errBacklog (a non-timeout error, so
// zmq4 drops the connection; the peer reconnects and can replay the gap). A write the socket does not take within
// the stall timeout cuts it as before.
type outbox struct {
	c      *stallConn
	max    int
	wake   chan struct{} // capacity 1: "the queue is not empty"
	stop   chan struct{} // closed by drainAndStop
	done   chan struct{} // closed when the goroutine returns
	mu     sync.Mutex
	q      [][]byte
	queued int   // bytes in q and being written
	err    error // set once the connection is unusable
	once   sync.Once
	set    *connSet
}

func newOutbox(c *stallConn, max int, set *connSet) *outbox {
	o := &outbox{c: c, max: max, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		set: set}
	if set != nil {
		set.add(o)
	}
	go o.run()
	return o
}

// pending reports whether bytes wait to be written to a usable connection.
func (o *outbox) pending() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err == nil && o.queued > 0
}

func (o *outbox) put(p []byte) (int, error) {
	o.mu.Lock()
	if o.err != nil {
		err := o.err
		o.mu.Unlock()
		return 0, err
	}
	if o.queued+len(p) > o.max {
		o.err = &net.OpError{Op: "write", Net: o.c.Conn.LocalAddr().Network(), Addr: o.c.Conn.RemoteAddr(), Err: errBacklog}
		err := o.err
		o.q, o.queued = nil, 0
		o.mu.Unlock()
		_ = o.c.Conn.Close() // the goroutine's write fails at once; the peer sees the connection end
		return 0, err
	}
	o.q = append(o.q, append([]byte(nil), p...))
	o.queued += len(p)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (o *outbox) run() {
	defer close(o.done)
	if o.set != nil {
		defer o.set.remove(o)
	}
	for {
		select {
		case <-o.wake:
		case <-o.stop:
			o.flush() // drainAndStop: what is queued goes out first
			return
		}
		if !o.flush() {
			return
		}
	}
}

// flush writes everything queued; false when the connection failed.
func (o *outbox) flush() bool {
	for {
		o.mu.Lock()
		q := o.q
		o.q = nil
		failed := o.err != nil
		o.mu.Unlock()
		if failed {
			return false
		}
		if len(q) == 0 {
			return true
		}
		for _, b := range q {
			if _, err := o.c.writeNow(b); err != nil {
				o.mu.Lock()
				if o.err == nil {
					o.err = err
				}
				o.q, o.queued = nil, 0
				o.mu.Unlock()
				_ = o.c.Conn.Close()
				return false
			}
			o.mu.Lock()
			o.queued -= len(b)
			o.mu.Unlock()
		}
	}
}

// drainAndStop stops the goroutine after it has written what is queued, waiting at most timeout.
func (o *outbox) drainAndStop(timeout time.Duration) {
	o.once.Do(func() { close(o.stop) })
	select {
	case <-o.done:
	case <-time.After(timeout):
	}
}
