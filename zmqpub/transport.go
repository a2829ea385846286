package zmqpub

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// kvshm speaks ZMTP itself (zmtp.go) on plain tcp and unix connections: each connection has a writer goroutine of
// its own and a bounded queue, so one peer that stops reading delays nobody else and costs at most its bounds (doc.go,
// "Bounds"). zmq4 v0.17.0, used before, wrote a PUB's messages to its subscribers one after the other from one
// goroutine, routed a ROUTER's replies under one lock, ran each accepted connection's handshake inline in its accept
// loop, never closed a connection whose handshake failed and never answered a ROUTER peer's PING; see doc.go.

// DefaultStallTimeout is the default Config.StallTimeout.
const DefaultStallTimeout = 2 * time.Second

// DefaultSubscriberBacklog is the default Config.SubscriberBacklog.
const DefaultSubscriberBacklog = 16 << 20

// maxPendingHandshakes bounds the connections whose handshake is under way at once per socket; a connection beyond
// it is closed at once (a flood of connections that open and stall cannot exhaust the daemon's fds).
const maxPendingHandshakes = 128

// maxConns bounds the connections a socket keeps (subscribers, replay clients); one beyond it is closed after its
// accept.
const maxConns = 1024

// reconnectInterval is how long a connect endpoint waits before it dials again (libzmq's ZMQ_RECONNECT_IVL default).
const reconnectInterval = 100 * time.Millisecond

// errClosed is the cause of a write to a closed connection.
var errClosed = errors.New("kvshm/zmqpub: connection closed")

// conn is one peer's connection: a queue of messages (each a list of byte slices written with one writev) drained by
// a writer goroutine of its own, with every write under the stall timeout. Past maxBytes queued bytes or maxMsgs
// queued messages (0: no message bound) the peer is cut: the connection is closed.
//
// put writes a message itself, without waking the writer, when nothing is queued or being written: one
// non-blocking writev under c.mu (the socket is non-blocking; rawWrite never waits for it to become writable).
// What that write leaves (a partial write, EAGAIN: the peer's window or the socket buffer is full) is queued as the
// first message, so the writer goroutine, which writes only what is queued, continues where it stopped and the
// order of the bytes on the wire is the order of put. While anything is queued, put only queues.
type conn struct {
	nc                net.Conn
	raw               rawWriter // nil: every message goes through the queue
	r                 *bufio.Reader
	timeout           time.Duration
	maxBytes, maxMsgs int

	mu      sync.Mutex
	q       []net.Buffers
	qBytes  int    // bytes queued or being written
	qMsgs   int    // messages queued or being written
	enq     uint64 // messages ever queued
	written uint64 // messages written (or dropped with the connection: then err is set)
	err     error  // set once: the connection is closed
	wake    chan struct{}
	done    chan struct{} // closed when the connection is closed
	drained *sync.Cond    // signalled when written grows or err is set

	pongAt     uint64          // the queued PONG is message pongAt (enq's count): pending while written < pongAt
	share      *addrShare      // the remote address's share (nil: none, a unix socket or a dialed peer); under mu
	onCut      func(cutReason) // called once when the peer is cut (a *cutError closed it); set before use
	subscribed atomic.Bool     // PUB: the peer's subscriptions match the topic
}

func newConn(nc net.Conn, r *bufio.Reader, timeout time.Duration, maxBytes, maxMsgs int) *conn {
	c := &conn{nc: nc, r: r, timeout: timeout, maxBytes: maxBytes, maxMsgs: maxMsgs, wake: make(chan struct{}, 1),
		done: make(chan struct{})}
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.raw = writevNonblock(rc)
		}
	}
	c.drained = sync.NewCond(&c.mu)
	go c.writeLoop()
	return c
}

// put writes or queues one message. It never waits: with nothing queued it writes what the socket takes at once
// and queues the rest; a message past the bounds cuts the connection (errBacklog), unless force (a PONG: a few
// bytes, at most one queued). m's slices are not modified (they are shared with other subscribers' queues).
func (c *conn) put(m net.Buffers, force bool) error {
	c.mu.Lock()
	queued, err := c.putLocked(m, force)
	c.mu.Unlock()
	if queued {
		c.wakeWriter()
	}
	return err
}

// putLocked is put under c.mu; queued: the writer must be woken (after c.mu is released).
func (c *conn) putLocked(m net.Buffers, force bool) (queued bool, err error) {
	n := 0
	for _, b := range m {
		n += len(b)
	}
	if c.err != nil {
		return false, errClosed
	}
	if !force && (c.qBytes+n > c.maxBytes || c.maxMsgs > 0 && c.qMsgs >= c.maxMsgs) {
		c.closeLocked(errBacklog)
		return false, errBacklog
	}
	if !force && c.share.over(n) {
		c.closeLocked(errAddrBacklog)
		return false, errAddrBacklog
	}
	if c.qMsgs == 0 && c.raw != nil {
		rest, err := c.raw(m, n)
		if err != nil {
			c.closeLocked(err)
			return false, err
		}
		if len(rest) == 0 {
			c.enq++
			c.written++
			c.drained.Broadcast()
			return false, nil
		}
		m, n = rest, 0
		for _, b := range rest {
			n += len(b)
		}
	}
	c.queueLocked(m, n)
	return true, nil
}

func (c *conn) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// command handles a ZMTP command after the handshake (name, and data: its first bytes, of dataLen in all): a PING
// is answered with PONG (libzmq's heartbeat: Dynamo's DEALER sends one every 5 s and drops a connection that
// answers nothing within its timeout); others are ignored. A PING whose context is over maxPingContext bytes cuts
// the peer (errPing; it echoed before: 60 KiB contexts, never read, grew the daemon by 1.3 GiB in 4 s).
func (c *conn) command(name string, data []byte, dataLen int) error {
	if name != "PING" {
		return nil
	}
	var ctx []byte // after the TTL (2 bytes)
	if dataLen > 2 {
		if dataLen-2 > maxPingContext {
			return errPing
		}
		ctx = data[2:]
	}
	c.pong(ctx)
	return nil
}

// pong queues the PONG echoing ctx, past the byte bound (a few bytes) but at most one at a time: a PING that comes
// while a PONG waits to be written is answered by that PONG (libzmq keeps one pending PONG too), so a peer that
// floods PINGs and never reads holds one PONG, not one per PING.
func (c *conn) pong(ctx []byte) {
	c.mu.Lock()
	if c.written < c.pongAt {
		c.mu.Unlock()
		return
	}
	queued, _ := c.putLocked(net.Buffers{command("PONG", ctx)}, true)
	if queued {
		c.pongAt = c.enq
	}
	c.mu.Unlock()
	if queued {
		c.wakeWriter()
	}
}

func (c *conn) putWait(m net.Buffers) error {
	n := 0
	for _, b := range m {
		n += len(b)
	}
	c.mu.Lock()
	for c.err == nil && c.qBytes > 0 && (c.qBytes+n > c.maxBytes || c.share.over(n)) {
		c.drained.Wait()
	}
	if c.err == nil && c.share.over(n) { // its own queue is empty: the address's other connections hold the bound
		c.closeLocked(errAddrBacklog)
	}
	if c.err != nil {
		c.mu.Unlock()
		return errClosed
	}
	c.queueLocked(m, n)
	c.mu.Unlock()
	c.wakeWriter()
	return nil
}

// queueLocked appends m (n bytes) to the queue; c.mu is held. The writer is woken by the caller.
func (c *conn) queueLocked(m net.Buffers, n int) {
	c.q = append(c.q, m)
	c.qBytes += n
	c.qMsgs++
	c.enq++
	c.share.add(n)
}

// closeLocked closes the connection with cause err (once); c.mu is held.
func (c *conn) closeLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	var ce *cutError
	if errors.As(err, &ce) && c.onCut != nil {
		c.onCut(ce.reason)
	}
	c.share.add(-c.qBytes)
	c.q, c.qBytes, c.qMsgs = nil, 0, 0
	_ = c.nc.Close()
	close(c.done)
	c.drained.Broadcast()
}

func (c *conn) close(err error) {
	c.mu.Lock()
	c.closeLocked(err)
	c.mu.Unlock()
}

func (c *conn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		for {
			c.mu.Lock()
			q := c.q
			c.q = nil
			c.mu.Unlock()
			if len(q) == 0 {
				break
			}
			for _, m := range q {
				n := 0
				for _, b := range m {
					n += len(b)
				}
				if err := c.write(m); err != nil {
					c.close(err)
					return
				}
				c.mu.Lock()
				c.qBytes -= n
				c.share.add(-n)
				c.qMsgs--
				c.written++
				c.drained.Broadcast()
				c.mu.Unlock()
			}
		}
	}
}

// write writes m, waiting at most the stall timeout. The deadline is cleared afterwards: put's non-blocking write
// would fail on a deadline left in the past.
func (c *conn) write(m net.Buffers) error {
	if err := c.nc.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return err
	}
	bufs := append(net.Buffers(nil), m...) // WriteTo consumes its receiver; m's slices stay shared
	if _, err := bufs.WriteTo(c.nc); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return errStalled
		}
		return err
	}
	return c.nc.SetWriteDeadline(time.Time{})
}

// waitWritten waits until the first n messages ever queued are written, the connection is closed, or deadline; it
// reports whether they were written (a closed connection counts as done: its peer no longer takes part).
func (c *conn) waitWritten(n uint64, deadline time.Time) bool {
	t := time.AfterFunc(time.Until(deadline), func() {
		c.mu.Lock()
		c.drained.Broadcast()
		c.mu.Unlock()
	})
	defer t.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.written < n && c.err == nil {
		if !time.Now().Before(deadline) {
			return false
		}
		c.drained.Wait()
	}
	return true
}

// pending reports whether messages wait to be written to an open connection.
func (c *conn) pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil && c.qMsgs > 0
}

// queued returns the number of messages ever queued.
func (c *conn) queued() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.enq
}

// endpoint is where a socket listens or connects: net/address (tcp host:port, unix path).
type endpoint struct{ network, address string }

// parseEndpoint maps a tcp:// or ipc:// endpoint (checked by checkEndpoint) to a net address. A "*" host is every
// interface, as in libzmq.
func parseEndpoint(ep string) endpoint {
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		return endpoint{"unix", path}
	}
	addr := strings.TrimPrefix(ep, "tcp://")
	if rest, ok := strings.CutPrefix(addr, "*:"); ok {
		return endpoint{"tcp4", "0.0.0.0:" + rest} // libzmq: "*" is every IPv4 interface (without ZMQ_IPV6)
	}
	return endpoint{"tcp", addr}
}

// peerSet is a socket's connections: a listener's accept loop and handshakes, a connect endpoint's dial loop, and
// the connections they made.
type peerSet struct {
	ctx     context.Context
	timeout time.Duration
	mine    string            // socket type announced
	peers   []string          // socket types accepted
	serve   func(*conn) error // runs a connection's reader until it ends (in its own goroutine); a *cutError cuts
	newConn func(net.Conn, *bufio.Reader) *conn
	perAddr int // connections one remote address may have (accepted: in the handshake or after)
	// addrBacklog bounds the bytes queued to one remote address's connections (addrShare).
	addrBacklog int
	cut         func(cutReason) // counts a peer refused at accept or after its handshake
	mu          sync.Mutex
	conns       map[*conn]struct{}
	addrs       map[string]*addrShare   // per addrKey
	list        atomic.Pointer[[]*conn] // conns as a slice, replaced on every change (Publish reads it per message)
	pending     chan struct{}
	ln          net.Listener
	wg          sync.WaitGroup
}

func (s *peerSet) add(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return false
	}
	if len(s.conns) >= maxConns {
		s.cut(cutConns)
		return false
	}
	if s.conns == nil {
		s.conns = map[*conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	s.publishList()
	return true
}

func (s *peerSet) remove(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.publishList()
	s.mu.Unlock()
}

func (s *peerSet) publishList() {
	l := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		l = append(l, c)
	}
	s.list.Store(&l)
}

// snapshot returns the connections.
func (s *peerSet) snapshot() []*conn {
	if l := s.list.Load(); l != nil {
		return *l
	}
	return nil
}

// run hands an open connection through the handshake and, on success, to serve until it ends; it returns when the
// connection is closed.
func (s *peerSet) run(nc net.Conn, share *addrShare) {
	stop := context.AfterFunc(s.ctx, func() { _ = nc.Close() }) // Close does not wait out a stalled handshake
	r, err := handshake(nc, s.timeout, s.mine, s.peers...)
	if !stop() || err != nil {
		_ = nc.Close()
		return
	}
	if rc, ok := nc.(*releaseOnReady); ok {
		nc = rc.Conn // its place is released (the handshake cleared the deadline); writev needs the bare conn
	}
	c := s.newConn(nc, r)
	c.mu.Lock()
	c.share = share
	c.mu.Unlock()
	if !s.add(c) {
		c.close(errClosed)
		return
	}
	err = s.serve(c)
	var ce *cutError
	if errors.Is(err, errProtocol) {
		err = &cutError{cutProtocol, strings.TrimPrefix(err.Error(), "kvshm/zmqpub: ")}
	}
	if !errors.As(err, &ce) {
		err = errClosed
	}
	c.close(err)
	s.remove(c)
}

// admitAddr counts a connection accepted from key against its address's share and returns the share (nil for a
// unix socket's peer, key ""); false (nothing counted): the address holds its share of connections already.
func (s *peerSet) admitAddr(key string) (*addrShare, bool) {
	if key == "" {
		return nil, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.addrs[key]
	if a == nil {
		a = &addrShare{max: int64(s.addrBacklog)}
		if s.addrs == nil {
			s.addrs = map[string]*addrShare{}
		}
		s.addrs[key] = a
	}
	if a.conns >= s.perAddr {
		return nil, false
	}
	a.conns++
	return a, true
}

func (s *peerSet) releaseAddr(key string) {
	if key == "" {
		return
	}
	s.mu.Lock()
	if a := s.addrs[key]; a != nil {
		if a.conns--; a.conns <= 0 {
			delete(s.addrs, key)
		}
	}
	s.mu.Unlock()
}

// listen binds ep and starts the accept loop.
func (s *peerSet) listen(ep endpoint) error {
	ln, err := net.Listen(ep.network, ep.address)
	if err != nil {
		return err
	}
	s.ln = ln
	s.pending = make(chan struct{}, maxPendingHandshakes)
	s.wg.Add(1)
	go s.acceptLoop()
	return nil
}

func (s *peerSet) acceptLoop() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || s.ctx.Err() != nil {
				return
			}
			select { // a temporary error (EMFILE, ...): retry shortly
			case <-s.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		key := addrKey(nc.RemoteAddr())
		share, ok := s.admitAddr(key)
		if !ok {
			_ = nc.Close()
			s.cut(cutAddrConns)
			continue
		}
		select {
		case s.pending <- struct{}{}:
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.releaseAddr(key)
				s.run(&releaseOnReady{Conn: nc, release: func() { <-s.pending }}, share)
			}()
		default:
			s.releaseAddr(key)
			_ = nc.Close()
			s.cut(cutHandshakes)
		}
	}
}

// releaseOnReady frees its place among the pending handshakes at the first read after the handshake or at Close.
type releaseOnReady struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *releaseOnReady) SetDeadline(t time.Time) error {
	if t.IsZero() { // the handshake is over
		c.once.Do(c.release)
	}
	return c.Conn.SetDeadline(t)
}

func (c *releaseOnReady) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// dial connects to ep in the background, again after each disconnection, until ctx ends (libzmq connects so).
func (s *peerSet) dial(ep endpoint) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var d net.Dialer
		for s.ctx.Err() == nil {
			if nc, err := d.DialContext(s.ctx, ep.network, ep.address); err == nil {
				s.run(nc, nil)
			}
			select {
			case <-s.ctx.Done():
			case <-time.After(reconnectInterval):
			}
		}
	}()
}

// shut stops accepting and dialing and closes every connection (after drain, which may wait for them); the caller
// has cancelled ctx.
func (s *peerSet) shut(drain func(conns []*conn)) {
	if s.ln != nil {
		_ = s.ln.Close()
	}
	if drain != nil {
		drain(s.snapshot())
	}
	s.mu.Lock()
	for c := range s.conns {
		c.close(errClosed)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// bindEndpoint binds ep for s. A unix socket file left by an earlier run is replaced (as libzmq does); anything
// else at the path makes the bind fail.
func bindEndpoint(s *peerSet, ep endpoint) error {
	if ep.network == "unix" {
		if fi, err := os.Lstat(ep.address); err == nil && fi.Mode().Type() == os.ModeSocket {
			_ = os.Remove(ep.address)
		}
	}
	return s.listen(ep)
}
