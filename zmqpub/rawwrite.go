package zmqpub

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// rawWriter writes what the socket takes of m (n bytes) without waiting and returns what is left (nil when all of
// it was written; m's slices are not modified, rest may share their arrays). An error means the connection is
// broken.
type rawWriter func(m net.Buffers, n int) (rest net.Buffers, err error)

// maxIovecs is how many slices one writev takes here (a message has 2; a PONG 1).
const maxIovecs = 8

// writevNonblock makes a rawWriter on rc: one writev on the socket (Go keeps it O_NONBLOCK), retried on EINTR;
// EAGAIN is "nothing written", not an error. The callback returns true so that RawConn.Write never parks in the
// poller: this is the non-blocking half of conn.put, the writer goroutine does the waiting.
func writevNonblock(rc syscall.RawConn) rawWriter {
	return func(m net.Buffers, n int) (net.Buffers, error) {
		if len(m) > maxIovecs {
			return m, nil // the writer goroutine writes it
		}
		var wrote int
		var werr error
		err := rc.Write(func(fd uintptr) bool {
			for {
				wrote, werr = unix.Writev(int(fd), m)
				if werr != unix.EINTR {
					return true
				}
			}
		})
		switch {
		case err != nil:
			return nil, err
		case errors.Is(werr, unix.EAGAIN):
			return m, nil
		case werr != nil:
			return nil, werr
		case wrote >= n:
			return nil, nil
		}
		return advance(m, wrote), nil
	}
}

// advance returns m without its first k bytes, as a new list (m's slices and array are shared with other queues).
func advance(m net.Buffers, k int) net.Buffers {
	var rest net.Buffers
	for _, b := range m {
		switch {
		case k >= len(b):
			k -= len(b)
		default:
			rest = append(rest, b[k:])
			k = 0
		}
	}
	return rest
}
