package daemon

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
)

// limitListener bounds the number of open HTTP connections. A connection beyond the bound is answered at once with
// 503 and closed (counted as connections_rejected_total{reason="http_busy"}), so a flood of idle or slow clients
// cannot exhaust file descriptors or goroutines; ReadHeaderTimeout and IdleTimeout free the slots of silent ones.
type limitListener struct {
	net.Listener
	sem chan struct{} // one token per open connection
	s   *Server
}

// httpBusyReply is the whole answer to a connection beyond the bound.
var httpBusyReply = func() []byte {
	body := append(sock.EncodeErrorBody(sock.CodeBusy, "too many HTTP connections; retry later"), '\n')
	return append(fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", len(body)), body...)
}()

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
		}
		l.s.m.rejected.WithLabelValues("http_busy").Inc()
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(httpBusyReply)
		_ = c.Close()
	}
}

// limitConn gives its listener slot back on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
