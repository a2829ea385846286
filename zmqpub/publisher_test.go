package zmqpub

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

func ipcEndpoint(t *testing.T, name string) string {
	return "ipc://" + filepath.Join(t.TempDir(), name)
}

func newPub(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	p, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func seqBytes(s uint64) []byte { return binary.BigEndian.AppendUint64(nil, s) }

// subscribe connects a zmq4 SUB and waits until it receives something published by keep.
func subscribe(t *testing.T, p *Publisher, ep string) zmq4.Socket {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// zmq4's Dial runs the handshake once: a publisher whose stall timeout (its handshake deadline) is a few ms,
	// as TestStuckSubscriberIsCut's, may close it under load (broken pipe); libzmq would reconnect, so dial again.
	var sub zmq4.Socket
	for attempt := 1; ; attempt++ {
		sub = zmq4.NewSub(ctx)
		err := sub.Dial(ep)
		if err == nil {
			break
		}
		_ = sub.Close()
		if attempt == 10 {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = sub.Close() })
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	// A subscription takes effect asynchronously: publish probes until one arrives.
	got := make(chan struct{})
	go func() {
		for i := uint64(0); ; i++ {
			select {
			case <-got:
				return
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
				p.PublishHeartbeat(1<<62+i, []byte("probe")) // not kept for replay
			}
		}
	}()
	if _, err := sub.Recv(); err != nil {
		t.Fatal(err)
	}
	close(got)
	return sub
}

// recvBatch reads frames until the seq'th batch, skipping probes.
func recvBatch(t *testing.T, sub zmq4.Socket) (topic string, seq uint64, payload []byte) {
	t.Helper()
	for {
		m, err := sub.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
			t.Fatalf("frames %q, want [topic, seq u64 BE, payload]", m.Frames)
		}
		if string(m.Frames[2]) == "probe" {
			continue
		}
		return string(m.Frames[0]), binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]
	}
}

func TestLiveFrames(t *testing.T) {
	ep := ipcEndpoint(t, "pub")
	p := newPub(t, Config{Endpoint: ep, Topic: "kv", HWM: 1000, BufferSteps: 10})
	fi, err := os.Stat(strings.TrimPrefix(ep, "ipc://"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ipc socket file: %v, mode %v, want 0600", err, fi.Mode())
	}
	sub := subscribe(t, p, ep)
	for s := uint64(5); s < 8; s++ {
		if !p.Publish(s, []byte(fmt.Sprintf("payload %d", s))) {
			t.Fatalf("Publish(%d) dropped", s)
		}
	}
	for s := uint64(5); s < 8; s++ {
		topic, seq, payload := recvBatch(t, sub)
		if topic != "kv" || seq != s || string(payload) != fmt.Sprintf("payload %d", s) {
			t.Fatalf("got %q %d %q, want kv %d", topic, seq, payload, s)
		}
	}
}

// replay sends a replay request from a zmq4 DEALER and returns the (seq, payload) pairs before the end marker.
func replay(t *testing.T, ep string, start []byte) [][2][]byte {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity(fmt.Sprintf("d%d", time.Now().UnixNano()))))
	defer d.Close()
	if err := d.Dial(ep); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, start)); err != nil {
		t.Fatal(err)
	}
	var out [][2][]byte
	for {
		m, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		// vLLM's shape after the DEALER strips nothing (the identity is ROUTER-side): ["", topic, seq, payload]
		if len(m.Frames) != 4 || len(m.Frames[0]) != 0 {
			t.Fatalf("replay frames %q, want [\"\", topic, seq, payload]", m.Frames)
		}
		if bytes.Equal(m.Frames[2], endSeq) {
			if len(m.Frames[1]) != 0 || len(m.Frames[3]) != 0 {
				t.Fatalf("end marker %q, want [\"\", \"\", -1, \"\"]", m.Frames)
			}
			return out
		}
		out = append(out, [2][]byte{m.Frames[2], m.Frames[3]})
	}
}

func TestReplay(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, HWM: 10, BufferSteps: 4})
	for s := uint64(10); s < 16; s++ { // 10..15; the buffer keeps 12..15
		p.Publish(s, []byte{byte(s)})
	}
	waitFor(t, func() bool { return p.Stats().Published == 6 }, "6 published")
	for _, c := range []struct {
		start uint64
		want  []uint64
	}{{0, []uint64{12, 13, 14, 15}}, {14, []uint64{14, 15}}, {16, nil}} {
		got := replay(t, rep, seqBytes(c.start))
		if len(got) != len(c.want) {
			t.Fatalf("replay from %d: %d batches, want %v", c.start, len(got), c.want)
		}
		for i, w := range c.want {
			if binary.BigEndian.Uint64(got[i][0]) != w || got[i][1][0] != byte(w) {
				t.Fatalf("replay from %d: batch %d is %x %x, want seq %d", c.start, i, got[i][0], got[i][1], w)
			}
		}
	}
	st := p.Stats()
	if st.ReplayRequests != 3 || st.Replayed != 6 {
		t.Fatalf("stats %+v, want 3 requests, 6 replayed", st)
	}
	// A request with a 9-byte seq is counted and ignored (no answer); the socket then still serves.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("bad")))
	defer d.Close()
	if err := d.Dial(rep); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, make([]byte, 9))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return p.Stats().BadRequests == 1 }, "1 bad request")
	if got := replay(t, rep, seqBytes(15)); len(got) != 1 {
		t.Fatalf("replay after a bad request: %d batches, want 1", len(got))
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // a hang guard, not a performance bound
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestStuckSubscriberNeverBlocksPublish: a subscriber that completes the handshake and then never reads (its
// TCP window fills) does not make Publish wait: every call returns (true: nothing is dropped for it), the stuck
// subscriber is cut past its bound (HWM 100 messages here) and counted.
func TestStuckSubscriberNeverBlocksPublish(t *testing.T) {
	p := newPub(t, Config{Endpoint: "tcp://*:0", HWM: 100, BufferSteps: 10})
	addr := strings.TrimPrefix(p.Stats().Endpoint, "tcp://")
	stuck := stuckSubscriber(t, addr)
	defer stuck.Close()
	waitFor(t, func() bool { return subscribedAll(p) }, "the stuck subscriber subscribed")
	payload := bytes.Repeat([]byte{7}, 64<<10)
	const n = 20000 // 1.3 GB offered: far beyond the socket buffers and the HWM
	accepted := 0
	for i := range n {
		if p.Publish(uint64(i), payload) {
			accepted++
		}
	}
	st := p.Stats()
	if accepted != n || st.DroppedTotal() != 0 || st.Cut != 1 {
		t.Fatalf("accepted %d of %d, dropped %v, cut %d: want every call answered, none dropped, the stuck one cut",
			accepted, n, st.Dropped, st.Cut)
	}
}

// stuckSubscriber speaks the ZMTP 3.0 NULL handshake as a SUB, subscribes to everything, and then never reads.
func stuckSubscriber(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.Replace(addr, "0.0.0.0", "127.0.0.1", 1))
	if err != nil {
		t.Fatal(err)
	}
	// A fixed small receive buffer: Linux autotunes it up to tcp_rmem's max (32 MiB here) otherwise, which can hold
	// everything a test publishes.
	if err := c.(*net.TCPConn).SetReadBuffer(16 << 10); err != nil {
		t.Fatal(err)
	}
	greet := make([]byte, 64)
	greet[0], greet[9], greet[10], greet[11] = 0xff, 0x7f, 3, 0
	copy(greet[12:], "NULL")
	if _, err := c.Write(greet); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := ioReadFull(c, buf); err != nil {
		t.Fatalf("greeting: %v", err)
	}
	// READY command with Socket-Type SUB.
	prop := func(name, val string) []byte {
		b := append([]byte{byte(len(name))}, name...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(val)))
		return append(b, val...)
	}
	body := append([]byte{5}, "READY"...)
	body = append(body, prop("Socket-Type", "SUB")...)
	cmd := append([]byte{0x04, byte(len(body))}, body...)
	if _, err := c.Write(cmd); err != nil {
		t.Fatal(err)
	}
	// The peer's READY.
	hdr := make([]byte, 2)
	if _, err := ioReadFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	if _, err := ioReadFull(c, make([]byte, hdr[1])); err != nil {
		t.Fatal(err)
	}
	// Subscribe to everything: a message frame [0x01].
	if _, err := c.Write([]byte{0x00, 0x01, 0x01}); err != nil {
		t.Fatal(err)
	}
	return c
}

func ioReadFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func TestNewRefuses(t *testing.T) {
	busy := newPub(t, Config{Endpoint: "tcp://*:0"})
	for _, c := range []struct {
		cfg  Config
		want error
	}{
		{Config{Endpoint: ""}, ErrEndpoint},
		{Config{Endpoint: "inproc://x"}, ErrEndpoint},
		{Config{Endpoint: "tcp:/x"}, ErrEndpoint},
		{Config{Endpoint: "udp://*:5"}, ErrEndpoint},
		{Config{Endpoint: "tcp://*:0", ReplayEndpoint: "inproc://r"}, ErrEndpoint},
		{Config{Endpoint: "tcp://*:0", HWM: -1}, ErrConfig},
		{Config{Endpoint: strings.Replace(busy.Stats().Endpoint, "0.0.0.0", "*", 1)}, ErrBind},
	} {
		p, err := New(c.cfg, nil)
		if !errors.Is(err, c.want) {
			if p != nil {
				p.Close()
			}
			t.Errorf("New(%+v) = %v, want %v", c.cfg, err, c.want)
		}
	}
	_, err := New(Config{Endpoint: strings.Replace(busy.Stats().Endpoint, "0.0.0.0", "*", 1)}, nil)
	if err == nil || !strings.Contains(err.Error(), "EADDRINUSE") && !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("bind on a busy port: %v, want the errno named", err)
	}
}

func TestPublishAfterClose(t *testing.T) {
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "c")})
	p.Close()
	if p.Publish(1, nil) || p.Stats().Dropped[2] != 1 {
		t.Fatalf("Publish after Close: stats %+v", p.Stats())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestStuckSubscriberIsCut: zmq4 writes to subscribers in turn; a subscriber that stops reading is disconnected
// (its outbox more than SubscriberBacklog behind, or a write to it blocked for StallTimeout), and a healthy
// subscriber gets every round meanwhile. With a stall timeout far longer than the test, only the outbox keeps the
// healthy one from waiting for the stuck one's cut (without the outboxes: stalled at round 16).
func TestStuckSubscriberIsCut(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   Config
		guard time.Duration // a hang guard, not a performance bound
	}{
		{"stall timeout", Config{Endpoint: "tcp://*:0", StallTimeout: 50 * time.Millisecond}, 20 * time.Second},
		{"backlog", Config{Endpoint: "tcp://*:0", StallTimeout: 10 * time.Minute, SubscriberBacklog: 1 << 20},
			30 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPub(t, c.cfg)
			ep := strings.Replace(p.Stats().Endpoint, "0.0.0.0", "127.0.0.1", 1)
			healthy := subscribe(t, p, ep)
			stuck := stuckSubscriber(t, strings.TrimPrefix(ep, "tcp://"))
			defer stuck.Close()
			got := make(chan uint64, 1)
			go func() {
				for {
					m, err := healthy.Recv()
					if err != nil {
						return
					}
					if len(m.Frames) == 3 && string(m.Frames[2]) != "probe" {
						got <- binary.BigEndian.Uint64(m.Frames[1])
					}
				}
			}()
			payload := bytes.Repeat([]byte{1}, 256<<10)
			// 10 MiB: enough to fill the stuck subscriber's socket buffers (and its backlog) many times over;
			// published in rounds so that the queue never drops, each round waiting for the healthy subscriber.
			for round := uint64(0); round < 40; round++ {
				for !p.Publish(round, payload) {
					time.Sleep(time.Millisecond)
				}
				select {
				case s := <-got:
					if s != round {
						t.Fatalf("healthy subscriber got seq %d, want %d", s, round)
					}
				case <-time.After(c.guard):
					t.Fatalf("healthy subscriber stalled at round %d behind the stuck one", round)
				}
			}
			// The stuck connection was closed by the publisher: reading it ends (after what the buffers held).
			_ = stuck.SetReadDeadline(time.Now().Add(c.guard))
			if _, err := io.Copy(io.Discard, stuck); err != nil {
				t.Fatalf("stuck subscriber's connection: %v, want closed by the publisher", err)
			}
		})
	}
}

// TestIpcStaleSocket: a socket file left by an earlier run is replaced (as libzmq does); a regular file at the
// path is not touched and the bind fails.
func TestIpcStaleSocket(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close() // the file stays, nobody listens: a crashed daemon's leftover
	p := newPub(t, Config{Endpoint: "ipc://" + stale})
	p.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("socket file after Close: %v, want removed", err)
	}
	regular := filepath.Join(dir, "regular")
	if err := os.WriteFile(regular, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Endpoint: "ipc://" + regular}, nil); !errors.Is(err, ErrBind) {
		t.Fatalf("bind over a regular file: %v, want ErrBind", err)
	}
	if b, err := os.ReadFile(regular); err != nil || string(b) != "keep" {
		t.Fatalf("regular file after the failed bind: %q, %v", b, err)
	}
}

// TestStatsAddCounts: a stream's totals over its publishers add every counter and keep the endpoints.
func TestStatsAddCounts(t *testing.T) {
	s := Stats{Published: 1, Dropped: [numDrops]uint64{1, 2, 3}, ReplayRequests: 1, BadRequests: 1, Replayed: 1,
		Endpoint: "tcp://a:1"}
	s.AddCounts(Stats{Published: 10, Dropped: [numDrops]uint64{10, 20, 30}, ReplayRequests: 10, BadRequests: 10,
		Replayed: 10, Endpoint: "tcp://b:2", ReplayEndpoint: "tcp://b:3"})
	want := Stats{Published: 11, Dropped: [numDrops]uint64{11, 22, 33}, ReplayRequests: 11, BadRequests: 11,
		Replayed: 11, Endpoint: "tcp://a:1"}
	if s != want {
		t.Fatalf("got %+v, want %+v", s, want)
	}
}
