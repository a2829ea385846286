package zmqpub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
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
	return stallListener{l, t.timeout}, nil
}

func (t stallTransport) Addr(ep string) (string, error) { return t.inner.Addr(ep) }

type stallListener struct {
	net.Listener
	timeout time.Duration
}

func (l stallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &stallConn{Conn: c, timeout: l.timeout}, nil
}

// stallConn arms a write deadline before each write. A write that times out closes the connection and returns a
// non-timeout net.Error, which makes zmq4 drop the connection (it keeps a connection on a timeout error).
type stallConn struct {
	net.Conn
	timeout time.Duration
}

func (c *stallConn) Write(p []byte) (int, error) {
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
