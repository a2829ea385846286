package zmqpub

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// rawPeer speaks the ZMTP 3.0 NULL handshake as socketType over a plain connection and returns it.
func rawPeer(t *testing.T, network, addr, socketType string) net.Conn {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	if _, err := c.Write(append(g, ready(socketType)...)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 64)); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, hdr[1])); err != nil {
		t.Fatal(err)
	}
	return c
}

// libzmqPing is the PING a libzmq 4.3 peer with ZMQ_HEARTBEAT_IVL and ZMQ_HEARTBEAT_TTL 15000 sends (Dynamo 1.6.1's
// replay DEALER and SUB: ivl 5 s, timeout and ttl 15 s): a command frame, "\x04PING", the TTL in deciseconds (u16
// BE), no context.
var libzmqPing = []byte{0x04, 0x07, 0x04, 'P', 'I', 'N', 'G', 0x00, 0x96}

// wantPong reads the next frame from c and fails unless it is the PONG command.
func wantPong(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a hang guard
	got := make([]byte, 7)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading the PONG: %v", err)
	}
	if want := []byte{0x04, 0x05, 0x04, 'P', 'O', 'N', 'G'}; !bytes.Equal(got, want) {
		t.Fatalf("answer to PING %x, want PONG %x", got, want)
	}
}

// Dynamo 1.6.1's replay DEALER sends a PING every 5 s; zmq4's ROUTER handed it on as a 2-frame message (kvshmd
// logged "invalid zmq replay request: ignored frames=2" each time) and never answered, so the DEALER dropped the
// connection at its 15 s heartbeat timeout whenever no reply was flowing. It is answered with PONG now, not
// counted, not logged, and the connection goes on serving.
func TestReplayAnswersPing(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	var warns atomic.Int64
	p, err := New(Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 10},
		slog.New(countHandler{&warns}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	p.Publish(7, []byte("x"))
	waitFor(t, func() bool { return p.Stats().Published == 1 }, "1 published")
	c := rawPeer(t, "unix", strings.TrimPrefix(rep, "ipc://"), "DEALER")
	for range 3 {
		if _, err := c.Write(libzmqPing); err != nil {
			t.Fatal(err)
		}
		wantPong(t, c)
	}
	// A request on the same connection: ["", seq 7] -> ["", topic "", seq 7, "x"], then the end marker.
	if _, err := c.Write(append([]byte{0x01, 0x00, 0x00, 0x08}, seqBytes(7)...)); err != nil {
		t.Fatal(err)
	}
	want := []byte{0x01, 0x00, 0x01, 0x00, 0x01, 0x08, 0, 0, 0, 0, 0, 0, 0, 7, 0x00, 0x01, 'x'}
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("reply %x (%v), want %x", got, err, want)
	}
	if st := p.Stats(); st.BadRequests != 0 || warns.Load() != 0 {
		t.Fatalf("PINGs counted as bad requests (%d) or warned about (%d)", st.BadRequests, warns.Load())
	}
}

// zmq4's PUB queued every message a subscriber sent that was not a subscription (a PING is one) on a channel of 10
// that nobody reads: from the 11th PING on, it read nothing more from that subscriber, its subscriptions included,
// and never answered. Every PING is answered now, and a subscription after them takes effect.
func TestSubscriberPing(t *testing.T) {
	ep := ipcEndpoint(t, "pub")
	p := newPub(t, Config{Endpoint: ep, Topic: "kv"})
	c := rawPeer(t, "unix", strings.TrimPrefix(ep, "ipc://"), "SUB")
	for range 12 {
		if _, err := c.Write(libzmqPing); err != nil {
			t.Fatal(err)
		}
		wantPong(t, c)
	}
	if _, err := c.Write([]byte{0x00, 0x01, 0x01}); err != nil { // subscribe to everything
		t.Fatal(err)
	}
	for i := uint64(0); ; i++ {
		p.Publish(i, []byte("x"))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		b := make([]byte, 3)
		if _, err := io.ReadFull(c, b); err == nil {
			if !bytes.Equal(b, []byte{0x01, 0x02, 'k'}) {
				t.Fatalf("first bytes %x, want the topic frame", b)
			}
			return
		}
		if i > 4000 { // 20 s: a hang guard
			t.Fatal("a subscription after 12 PINGs never took effect")
		}
	}
}

// Replay clients that send a valid request for the whole buffer and never read: zmq4's ROUTER wrote replies under
// one lock, so each stuck client held every other reply until its write stalled out (1 delayed a healthy replay
// by 1.5 s, 8 denied it 40-60 s, before the per-producer bounds). Each client has a connection, a reply goroutine and a queue of its own
// now: the healthy reply completes while the 8 stuck clients still hold their connections (the stall timeout is
// far beyond the test: nobody is cut).
func TestStuckReplayClientsCostOnlyThemselves(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 1000,
		StallTimeout: 10 * time.Minute, SubscriberBacklog: 1 << 20})
	payload := bytes.Repeat([]byte{1}, 64<<10)
	for s := range uint64(256) { // 16 MiB: far beyond a client's socket buffers and queue
		p.Publish(s, payload)
	}
	waitFor(t, func() bool { return p.Stats().Published == 256 }, "256 published")
	for range 8 {
		c := rawPeer(t, "unix", strings.TrimPrefix(rep, "ipc://"), "DEALER")
		if _, err := c.Write(append([]byte{0x01, 0x00, 0x00, 0x08}, seqBytes(0)...)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return p.Stats().ReplayRequests == 8 }, "8 requests taken")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang guard
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("healthy")))
	defer d.Close()
	if err := d.Dial(rep); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, seqBytes(0))); err != nil {
		t.Fatal(err)
	}
	for n := 0; ; n++ {
		m, err := d.Recv()
		if err != nil {
			t.Fatalf("healthy replay client after %d batches: %v (8 stuck clients)", n, err)
		}
		if len(m.Frames) == 4 && bytes.Equal(m.Frames[2], endSeq) {
			if n != 256 {
				t.Fatalf("healthy reply: %d batches, want 256", n)
			}
			break
		}
		if got := binary.BigEndian.Uint64(m.Frames[2]); got != uint64(n) {
			t.Fatalf("healthy reply batch %d has seq %d", n, got)
		}
	}
	if st := p.Stats(); st.ReplayCut != 0 || len(p.router.snapshot()) != 9 {
		t.Fatalf("%d replay clients cut, %d connected; want 0 cut, 9 connected", st.ReplayCut, len(p.router.snapshot()))
	}
}
