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
// own, the tcp and unix ones with a per-connection write deadline: a write blocked for the stall timeout closes
// that connection (its peer reconnects, as libzmq peers do, and sees a seq gap it can replay), and the others go
// on. The endpoints users give keep their tcp:// and ipc:// names; only the sockets see the internal scheme.
const (
	schemeTCP = "kvshm-tcp"
	schemeIPC = "kvshm-ipc"
)

// DefaultStallTimeout is the default Config.StallTimeout.
const DefaultStallTimeout = 2 * time.Second

// errStalled is the cause of a connection closed because a write was blocked for the stall timeout.
var errStalled = errors.New("kvshm/zmqpub: peer stopped reading (write blocked for the stall timeout): connection closed")

// stallSchemes maps a stall timeout to the suffix of its registered schemes (zmq4's registry is global, a name
// cannot be registered twice, and the timeout is per publisher: one pair of schemes per distinct timeout).
// Protected by regMu.
var (
	regMu        sync.Mutex
	stallSchemes = map[time.Duration]string{}
)

// internalEndpoint returns ep with its scheme replaced by the kvshm transport of that timeout (registered on first
// use). ep was checked by checkEndpoint (tcp:// or ipc://).
func internalEndpoint(ep string, timeout time.Duration) (string, error) {
	suffix, err := registerStall(timeout)
	if err != nil {
		return "", err
	}
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return schemeTCP + suffix + "://" + rest, nil
	}
	return schemeIPC + suffix + "://" + strings.TrimPrefix(ep, "ipc://"), nil
}

func registerStall(timeout time.Duration) (string, error) {
	regMu.Lock()
	defer regMu.Unlock()
	if s, ok := stallSchemes[timeout]; ok {
		return s, nil
	}
	suffix := fmt.Sprintf("-%d", len(stallSchemes))
	if err := zmq4.RegisterTransport(schemeTCP+suffix, stallTransport{transport.New("tcp"), timeout}); err != nil {
		return "", err
	}
	if err := zmq4.RegisterTransport(schemeIPC+suffix, stallTransport{transport.New("unix"), timeout}); err != nil {
		return "", err
	}
	stallSchemes[timeout] = suffix
	return suffix, nil
}

// stallTransport is a zmq4 transport whose connections close when a write blocks for timeout.
type stallTransport struct {
	inner   transport.Transport
	timeout time.Duration
}

func (t stallTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.inner.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, timeout: t.timeout}, nil
}

func (t stallTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return newStallListener(l, t.timeout), nil
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
	timeout time.Duration
	ready   chan net.Conn
	done    chan struct{}
	once    sync.Once
	pending chan struct{}
}

func newStallListener(l net.Listener, timeout time.Duration) *stallListener {
	sl := &stallListener{Listener: l, timeout: timeout, ready: make(chan net.Conn), done: make(chan struct{}),
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
	sc := &stallConn{Conn: c, timeout: l.timeout, pre: pre, skipWrite: len(serverGreeting)}
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
