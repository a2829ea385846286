package zmqpub

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// ZMTP 3.0 with the NULL mechanism (rfc.zeromq.org/spec/23), the part kvshm's two sockets speak: the greeting, the
// READY command, frames, and the PING/PONG commands of ZMTP 3.1 (libzmq peers with ZMQ_HEARTBEAT_IVL send PING,
// Dynamo's every 5 s, and close the connection when nothing comes back within their heartbeat timeout).
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// errProtocol is the cause of a connection closed for what its peer sent.
var errProtocol = errors.New("kvshm/zmqpub: ZMTP protocol error")

// greeting is the 64-byte ZMTP 3.0 greeting kvshm sends: NULL mechanism, as-server 0 (what zmq4 and libzmq send for
// NULL). Announcing 3.0 keeps a libzmq SUB sending subscriptions as messages; PING is still answered.
var greeting = func() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	return g
}()

// maxCommand bounds a command's body (READY with its metadata, PING with its context).
const maxCommand = 64 << 10

// appendFrame appends one ZMTP frame: flags, size (short or long), body.
func appendFrame(b []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		b = append(b, flags|flagLong)
		b = binary.BigEndian.AppendUint64(b, uint64(len(body)))
	} else {
		b = append(b, flags, byte(len(body)))
	}
	return append(b, body...)
}

// appendFrameHeader appends a frame's header alone (the body is written from its own slice, not copied).
func appendFrameHeader(b []byte, flags byte, size int) []byte {
	if size > 255 {
		return binary.BigEndian.AppendUint64(append(b, flags|flagLong), uint64(size))
	}
	return append(b, flags, byte(size))
}

// command returns a command frame: name (short string) then data.
func command(name string, data []byte) []byte {
	body := append(append([]byte{byte(len(name))}, name...), data...)
	return appendFrame(nil, flagCommand, body)
}

// ready returns the READY command announcing socketType.
func ready(socketType string) []byte {
	var props []byte
	props = append(props, byte(len("Socket-Type")))
	props = append(props, "Socket-Type"...)
	props = binary.BigEndian.AppendUint32(props, uint32(len(socketType)))
	props = append(props, socketType...)
	return command("READY", props)
}

// readFrame reads one frame whose body is at most max bytes (the handshake's READY; after it, frames are read with
// readHeader and readPrefix, which keep only what is needed of them).
func readFrame(r *bufio.Reader, max int) (flags byte, body []byte, err error) {
	flags, size, err := readHeader(r, max)
	if err != nil {
		return 0, nil, err
	}
	body = make([]byte, size)
	if _, err = io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

// readHeader reads a frame's flags (flagLong cleared) and body size, at most max; a larger frame or unknown flags
// are errProtocol.
func readHeader(r *bufio.Reader, max int) (flags byte, size int, err error) {
	if flags, err = r.ReadByte(); err != nil {
		return 0, 0, err
	}
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, 0, fmt.Errorf("%w: frame flags %#x", errProtocol, flags)
	}
	var n uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return 0, 0, err
		}
		n = binary.BigEndian.Uint64(b[:])
	} else {
		s, err := r.ReadByte()
		if err != nil {
			return 0, 0, err
		}
		n = uint64(s)
	}
	if n > uint64(max) {
		return 0, 0, fmt.Errorf("%w: a frame of %d bytes (at most %d here)", errProtocol, n, max)
	}
	return flags &^ flagLong, int(n), nil
}

// readPrefix reads a frame's body of size bytes, keeps its first min(size, keep) bytes in buf (reused) and
// discards the rest as it arrives: a frame costs its reader at most keep bytes, however large it is and however
// slowly it comes (before, a body was allocated whole from its header: 200 unfinished requests of 15 frames of
// 60 KiB pinned 180 MiB).
func readPrefix(r *bufio.Reader, size, keep int, buf []byte) ([]byte, error) {
	k := min(size, keep)
	if cap(buf) < k {
		buf = make([]byte, k)
	}
	buf = buf[:k]
	if _, err := io.ReadFull(r, buf); err != nil {
		return buf, err
	}
	_, err := r.Discard(size - k)
	return buf, err
}

// parseCommand splits a command frame's body into its name and data.
func parseCommand(body []byte) (name string, data []byte, err error) {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("%w: malformed command", errProtocol)
	}
	return string(body[1 : 1+body[0]]), body[1+body[0]:], nil
}

// readyProps parses a READY command's properties.
func readyProps(data []byte) (map[string]string, error) {
	props := map[string]string{}
	for len(data) > 0 {
		n := int(data[0])
		if len(data) < 1+n+4 {
			return nil, fmt.Errorf("%w: malformed READY", errProtocol)
		}
		name := string(data[1 : 1+n])
		vlen := binary.BigEndian.Uint32(data[1+n:])
		data = data[1+n+4:]
		if uint64(vlen) > uint64(len(data)) {
			return nil, fmt.Errorf("%w: malformed READY", errProtocol)
		}
		props[name] = string(data[:vlen])
		data = data[vlen:]
	}
	return props, nil
}

// handshake runs the NULL handshake on c within timeout: greetings both ways, READY both ways (announcing mine),
// and checks that the peer's socket type is one of peers. It returns the reader to read c with from then on.
func handshake(c net.Conn, timeout time.Duration, mine string, peers ...string) (*bufio.Reader, error) {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if _, err := c.Write(append(append([]byte(nil), greeting...), ready(mine)...)); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	var g [64]byte
	if _, err := io.ReadFull(r, g[:]); err != nil {
		return nil, err
	}
	if g[0] != 0xff || g[9] != 0x7f || g[10] < 3 || string(bytes.TrimRight(g[12:32], "\x00")) != "NULL" {
		return nil, fmt.Errorf("%w: not a ZMTP 3 NULL greeting", errProtocol)
	}
	flags, body, err := readFrame(r, maxCommand)
	if err != nil {
		return nil, err
	}
	name, data, err := parseCommand(body)
	if err != nil || flags&flagCommand == 0 || name != "READY" {
		return nil, fmt.Errorf("%w: the peer's first frame is no READY", errProtocol)
	}
	props, err := readyProps(data)
	if err != nil {
		return nil, err
	}
	ok := false
	for _, p := range peers {
		ok = ok || props["Socket-Type"] == p
	}
	if !ok {
		return nil, fmt.Errorf("%w: a %s socket cannot talk to a %q socket", errProtocol, mine, props["Socket-Type"])
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return r, nil
}
