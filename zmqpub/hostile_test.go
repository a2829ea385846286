package zmqpub

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The attacks a remote peer could make on kvshmd's ZMQ sockets before every byte it can make the daemon hold was
// bounded (doc.go, "Bounds"). Each test failed on the code before the bounds: the PING flood grew the daemon
// without a bound (one PONG queued per PING, past the byte bound), the subscription flood was neither bounded nor
// cut (and quadratic), one address's idle connections filled the socket's cap, and unfinished replay requests
// pinned every frame they sent.

// pingFrame is a PING command frame with TTL 0 and ctx as its context.
func pingFrame(ctx []byte) []byte {
	return command("PING", append([]byte{0, 0}, ctx...))
}

// waitClosed fails unless the peer's side of c is closed by the publisher (EOF or reset) before the hang guard;
// whatever the publisher sent before is read and dropped.
func waitClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a hang guard, not a performance bound
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: the connection stayed open", what)
	}
}

// A PING's context is at most 16 bytes (ZMTP 3.1); a PONG echoes it. A longer one was echoed before: with 60 KiB
// contexts and no reads, four peers took kvshmd from 10 to 1,316 MiB in 4 s. It cuts the peer now, as libzmq does.
func TestPingContextBound(t *testing.T) {
	for _, tc := range []struct {
		ctxLen int
		cut    bool
	}{{0, false}, {16, false}, {17, true}, {60 << 10, true}} {
		ep := ipcEndpoint(t, "pub")
		p := newPub(t, Config{Endpoint: ep, Topic: "kv"})
		c := rawPeer(t, "unix", strings.TrimPrefix(ep, "ipc://"), "SUB")
		ctx := bytes.Repeat([]byte{7}, tc.ctxLen)
		if _, err := c.Write(pingFrame(ctx)); err != nil {
			t.Fatal(err)
		}
		if tc.cut {
			waitClosed(t, c, "a PING with a context of "+strconv.Itoa(tc.ctxLen)+" bytes")
			waitFor(t, func() bool { return cutBy(p, "ping") == 1 }, "the cut counted under ping")
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		r := bufio.NewReader(c)
		flags, body, err := readFrame(r, maxCommand)
		if err != nil || flags != flagCommand || !bytes.Equal(body, append([]byte("\x04PONG"), ctx...)) {
			t.Fatalf("context %d: answer %#x %q (%v), want a PONG echoing it", tc.ctxLen, flags, body, err)
		}
	}
}

// A peer that sends PINGs as fast as it can and never reads holds at most one PONG in its queue: a PING that
// comes while a PONG waits is answered by that PONG (libzmq keeps one pending PONG as well). Before, each PING
// queued a PONG past the queue's byte bound.
func TestPingFloodHoldsOnePong(t *testing.T) {
	ep := ipcEndpoint(t, "pub")
	p := newPub(t, Config{Endpoint: ep, Topic: "kv", StallTimeout: 10 * time.Minute})
	c := rawPeer(t, "unix", strings.TrimPrefix(ep, "ipc://"), "SUB")
	_ = c.(*net.UnixConn).SetReadBuffer(4096)
	flood := bytes.Repeat(pingFrame(bytes.Repeat([]byte{1}, 16)), 4096) // 100 KiB of PINGs per write
	for range 50 {
		if _, err := c.Write(flood); err != nil {
			t.Fatal(err)
		}
	}
	// A subscription after the PINGs: once it took effect, every PING was read.
	if _, err := c.Write([]byte{0x00, 0x01, 0x01}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		l := p.pubs.snapshot()
		return len(l) == 1 && l[0].subscribed.Load()
	}, "the subscription after 204,800 PINGs")
	sc := p.pubs.snapshot()[0]
	sc.mu.Lock()
	msgs, qb := sc.qMsgs, sc.qBytes
	sc.mu.Unlock()
	if msgs > 1 || qb > len(pingFrame(make([]byte, 16))) {
		t.Fatalf("after 204,800 unread PINGs the queue holds %d messages, %d bytes; want at most one PONG", msgs, qb)
	}
}

// subscription is a ZMTP 3.0 subscription message (subscribe or cancel) for topic.
func subscription(subscribe bool, topic []byte) []byte {
	b := byte(0)
	if subscribe {
		b = 1
	}
	return appendFrame(nil, 0, append([]byte{b}, topic...))
}

// A subscriber sending distinct subscriptions without end: before, the set had no bound and every SUBSCRIBE
// rescanned it (40,000 took 10 s of the daemon's CPU). Past maxSubscriptions the peer is cut now.
func TestSubscriptionFloodIsCut(t *testing.T) {
	ep := ipcEndpoint(t, "pub")
	p := newPub(t, Config{Endpoint: ep, Topic: "kv"})
	c := rawPeer(t, "unix", strings.TrimPrefix(ep, "ipc://"), "SUB")
	var b []byte
	for i := range maxSubscriptions + 1 {
		topic := make([]byte, 16)
		binary.BigEndian.PutUint64(topic, uint64(i))
		b = append(b, subscription(true, topic)...)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, c, "a subscriber past the subscription bound")
	waitFor(t, func() bool { return cutBy(p, "subscriptions") == 1 }, "the cut counted under subscriptions")
}

// subscribeFrom is a SUB from address from (a loopback address: 127.0.0.2 and .3 are distinct hosts to the
// per-address bounds), handshaken with addr and subscribed to topic (nil: everything); closed when t ends.
func subscribeFrom(t *testing.T, from, addr string, topic []byte) net.Conn {
	t.Helper()
	c, err := handshakeFrom(from, addr, "SUB")
	if err != nil {
		t.Fatalf("a SUB from %s: %v", from, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write(subscription(true, topic)); err != nil {
		t.Fatal(err)
	}
	return c
}

// handshakeFrom dials addr from the local IP from (127.0.0.x: another "host" on loopback) and runs the NULL
// handshake as socketType; an error when the publisher closed the connection instead.
func handshakeFrom(from, addr, socketType string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	if _, err := c.Write(append(g, ready(socketType)...)); err != nil {
		_ = c.Close()
		return nil, err
	}
	r := bufio.NewReader(c)
	if _, err := io.ReadFull(r, make([]byte, 64)); err != nil {
		_ = c.Close()
		return nil, err
	}
	if _, _, err := readFrame(r, maxCommand); err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// 1,100 idle connections from one address that finish the handshake (subscribed to a topic that never matches):
// before, they took the socket's whole cap of 1,024 and a router on any other host was closed after its
// handshake. Each address has a share of the cap now: the rest of the flood is closed at accept, and a
// subscriber from another address gets in and receives.
func TestConnsPerAddress(t *testing.T) {
	p := newPub(t, Config{Endpoint: "tcp://*:0", Topic: "kv"})
	addr := strings.Replace(strings.TrimPrefix(p.Stats().Endpoint, "tcp://"), "0.0.0.0", "127.0.0.1", 1)
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			_ = c.Close()
		}
	})
	for range 1100 {
		c, err := handshakeFrom("127.0.0.2", addr, "SUB")
		if err != nil {
			continue // closed at accept: past the address's share
		}
		held = append(held, c)
		if _, err := c.Write(subscription(true, []byte("never"))); err != nil {
			t.Fatal(err)
		}
	}
	c, err := handshakeFrom("127.0.0.3", addr, "SUB")
	if err != nil {
		t.Fatalf("a subscriber from another address, beside %d idle connections from one: %v", len(held), err)
	}
	defer c.Close()
	if _, err := c.Write(subscription(true, nil)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for i := uint64(0); ; i++ {
		p.Publish(i, []byte("x"))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		if _, body, err := readFrame(r, maxCommand); err == nil {
			if string(body) != "kv" {
				t.Fatalf("first frame %q, want the topic", body)
			}
			break
		} else if !isTimeout(err) {
			t.Fatalf("a subscriber from another address, beside %d idle connections from one: %v", len(held), err)
		}
		if i > 4000 { // a hang guard
			t.Fatal("the subscriber from another address got nothing")
		}
	}
	if len(held) != DefaultConnsPerAddr {
		t.Fatalf("one address holds %d connections, want its share %d", len(held), DefaultConnsPerAddr)
	}
	if n := cutBy(p, "addr_conns"); n != 1100-DefaultConnsPerAddr {
		t.Fatalf("%d connections refused under addr_conns, want %d", n, 1100-DefaultConnsPerAddr)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// 200 replay clients each holding an unfinished request of 15 frames of 60 KiB: before, each pinned its frames
// (~0.9 MiB a connection, 180 MiB in all). A request's frames are not kept now (only what a valid one needs, its
// seq of at most 8 bytes), so what they pin is each connection's fixed cost.
func TestUnfinishedReplayRequestsPinNothing(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 10})
	frame := appendFrame(nil, flagMore, bytes.Repeat([]byte{9}, 60<<10))
	request := bytes.Repeat(frame, 15)
	const clients = 200
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	errc := make(chan error, clients)
	conns := make([]net.Conn, clients)
	for i := range conns {
		conns[i] = rawPeer(t, "unix", strings.TrimPrefix(rep, "ipc://"), "DEALER")
		go func(c net.Conn) {
			_, err := c.Write(append(request, libzmqPing...))
			errc <- err
		}(conns[i])
	}
	for range clients {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns { // the PONG after the 15 frames: the daemon read them all
		wantPong(t, c)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapInuse) - int64(before.HeapInuse)
	if limit := int64(clients * 64 << 10); grown > limit {
		t.Fatalf("%d unfinished 15-frame requests grew the heap by %d KiB, want at most %d KiB (64 KiB each)",
			clients, grown>>10, limit>>10)
	}
}

// A request of more than maxRequestFrames frames cuts its client (a valid one has 2).
func TestLongRequestIsCut(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 10})
	c := rawPeer(t, "unix", strings.TrimPrefix(rep, "ipc://"), "DEALER")
	if _, err := c.Write(bytes.Repeat(appendFrame(nil, flagMore, []byte("x")), maxRequestFrames+1)); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, c, "a request of 17 frames")
	waitFor(t, func() bool { return cutBy(p, "request") == 1 }, "the cut counted under request")
}

// Subscribers of one address that stop reading may queue Config.AddrBacklog bytes together, not each its own
// SubscriberBacklog: past it, the one a message would take over is cut (addr_backlog). A subscriber of another
// address reads every message meanwhile.
func TestAddrBacklog(t *testing.T) {
	const backlog, addrBacklog = 4 << 20, 8 << 20
	p := newPub(t, Config{Endpoint: "tcp://*:0", Topic: "kv", StallTimeout: 10 * time.Minute,
		SubscriberBacklog: backlog, AddrBacklog: addrBacklog})
	addr := strings.Replace(strings.TrimPrefix(p.Stats().Endpoint, "tcp://"), "0.0.0.0", "127.0.0.1", 1)
	for range 4 {
		subscribeFrom(t, "127.0.0.2", addr, nil)
	}
	healthy := subscribeFrom(t, "127.0.0.3", addr, nil)
	waitFor(t, func() bool { return subscribedAll(p) && len(p.pubs.snapshot()) == 5 }, "5 subscribed")
	const n = 200
	got := make(chan error, 1)
	read := make(chan struct{}, n) // one per message the healthy subscriber read: the publisher keeps its pace
	go func() {
		r := bufio.NewReader(healthy)
		for i := uint64(0); i < n; i++ {
			_ = healthy.SetReadDeadline(time.Now().Add(20 * time.Second)) // a hang guard
			var seq []byte
			for f := range 3 {
				_, body, err := readFrame(r, 1<<20)
				if err != nil {
					got <- err
					return
				}
				if f == 1 {
					seq = body
				}
			}
			if s := binary.BigEndian.Uint64(seq); s != i {
				got <- fmt.Errorf("seq %d, want %d", s, i)
				return
			}
			read <- struct{}{}
		}
		got <- nil
	}()
	payload := bytes.Repeat([]byte{3}, 256<<10)
	for i := range uint64(n) {
		p.Publish(i, payload)
		select {
		case <-read:
		case err := <-got: // nil: the reader read the last message and ended; its token may be picked after this
			if err != nil {
				t.Fatalf("the subscriber of another address at %d: %v", i, err)
			}
			<-read
			got <- nil // for the check after the loop
		}
		var share *addrShare
		for _, c := range p.pubs.snapshot() {
			c.mu.Lock()
			if c.share != nil && c.share.max == addrBacklog {
				share = c.share
			}
			c.mu.Unlock()
		}
		if share != nil && share.queued.Load() > addrBacklog {
			t.Fatalf("one address's subscribers hold %d bytes queued, over its bound %d", share.queued.Load(),
				addrBacklog)
		}
	}
	if err := <-got; err != nil {
		t.Fatalf("the subscriber of another address: %v", err)
	}
	if cutBy(p, "addr_backlog") == 0 {
		t.Fatalf("no subscriber cut for its address's backlog (cut: %v)", p.Stats().PeersCut)
	}
}
