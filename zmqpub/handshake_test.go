package zmqpub

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// zmq4 v0.17.0 runs each accepted connection's ZMTP handshake inline in its accept loop, without a deadline: one
// connection that opens and stalls (silent, or half a greeting) kept every later peer (subscribers, replay
// clients) out for as long as it stayed open (found by the soak's zmq scenario). kvshm's listener now reads each
// peer's greeting and READY in a goroutine of its own with the stall timeout as deadline.
func TestStalledConnectionsDoNotBlockNewPeers(t *testing.T) {
	ep, rep := ipcEndpoint(t, "pub"), ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ep, ReplayEndpoint: rep, BufferSteps: 10, StallTimeout: 30 * time.Second})
	for _, e := range []string{ep, rep} {
		for i := 0; i < 4; i++ {
			c, err := net.Dial("unix", strings.TrimPrefix(e, "ipc://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			if i%2 == 1 {
				_, _ = c.Write([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f}) // a greeting's first 10 bytes, then nothing
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- subscribeAndReplay(ctx, p, ep, rep) }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("a subscriber and a replay client could not get in while 8 connections stalled")
	}
}

// subscribeAndReplay is subscribe + replay without the testing helpers (it runs in its own goroutine).
func subscribeAndReplay(ctx context.Context, p *Publisher, ep, rep string) error {
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(ep); err != nil {
		return err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return err
	}
	go func() {
		for i := uint64(0); ctx.Err() == nil; i++ {
			p.Publish(100+i, []byte("probe"))
			time.Sleep(5 * time.Millisecond)
		}
	}()
	if _, err := sub.Recv(); err != nil {
		return fmt.Errorf("subscriber: %w", err)
	}
	d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("healthy")))
	defer d.Close()
	if err := d.Dial(rep); err != nil {
		return err
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, seqBytes(0))); err != nil {
		return err
	}
	for {
		m, err := d.Recv()
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if len(m.Frames) == 4 && bytes.Equal(m.Frames[2], endSeq) {
			return nil
		}
	}
}

// A connection that sends garbage (or leaves mid-handshake) failed zmq4's handshake, which never closed it: each
// one leaked a file descriptor of the daemon (the soak saw 16 -> 483 fds). Every such connection is closed now.
func TestFailedHandshakesAreClosed(t *testing.T) {
	ep, rep := ipcEndpoint(t, "pub"), ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ep, ReplayEndpoint: rep, BufferSteps: 10, StallTimeout: 300 * time.Millisecond})
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(ents)
	}
	subscribe(t, p, ep) // the sockets' own goroutines and fds are up
	before := fds()
	greeting := func(mech string) []byte {
		g := make([]byte, 64)
		g[0], g[9], g[10] = 0xff, 0x7f, 3
		copy(g[12:], mech)
		return g
	}
	inputs := [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3},                    // half a greeting, then close
		append(greeting("NULL"), 0x04, 5, 'H', 'E', 'L', 'L', 'O'), // a greeting, a command cut short, then close
		greeting("CURVE"),
		append(greeting("NULL"), 0x04, 0x1a, 5, 'R', 'E', 'A', 'D', 'Y', 0x0b, 'S', 'o', 'c', 'k', 'e', 't', '-', 'T', 'y', 'p', 'e', 0, 0, 0, 3, 'P', 'U', 'B'), // a PUB peer: incompatible
	}
	var conns []net.Conn
	for i := 0; i < 40; i++ {
		for _, e := range []string{ep, rep} {
			c, err := net.Dial("unix", strings.TrimPrefix(e, "ipc://"))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = c.Write(inputs[i%len(inputs)])
			conns = append(conns, c)
		}
	}
	time.Sleep(500 * time.Millisecond) // the server has read what each sent (peers still there), then they leave
	for _, c := range conns {
		_ = c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for fds() > before+2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := fds(); n > before+2 {
		t.Fatalf("fds %d -> %d after 80 failed handshakes: the server ends stay open", before, n)
	}
	// And the publisher still serves.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_ = zmq4.NewSub(ctx)
	subscribe(t, p, ep)
}

type countHandler struct{ n *atomic.Int64 }

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// Every invalid replay request was logged at warn level: a hostile DEALER wrote one daemon log line per request
// (the soak's zmq scenario sent thousands). One warning per badRequestLogEvery now; all are counted.
func TestInvalidReplayRequestsDoNotFloodTheLog(t *testing.T) {
	rep := ipcEndpoint(t, "replay")
	var warns atomic.Int64
	p, err := New(Config{Endpoint: ipcEndpoint(t, "pub"), ReplayEndpoint: rep, BufferSteps: 10},
		slog.New(countHandler{&warns}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("hostile")))
	defer d.Close()
	if err := d.Dial(rep); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		if err := d.SendMulti(zmq4.NewMsgFrom(nil, make([]byte, 9))); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return p.Stats().BadRequests == 200 }, "200 bad requests")
	if n := warns.Load(); n > 1 {
		t.Fatalf("%d warnings for 200 invalid requests in a burst, want 1", n)
	}
}

// TestCloseDoesNotWaitForStalledHandshakes: Close waited for every handshake under way to time out (the stall
// timeout: minutes here); it closes them now.
func TestCloseDoesNotWaitForStalledHandshakes(t *testing.T) {
	ep, rep := ipcEndpoint(t, "pub"), ipcEndpoint(t, "replay")
	p, err := New(Config{Endpoint: ep, ReplayEndpoint: rep, StallTimeout: 10 * time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{ep, rep} {
		c, err := net.Dial("unix", strings.TrimPrefix(e, "ipc://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Read(make([]byte, 1)); err != nil { // the server's greeting: the handshake is under way
			t.Fatal(err)
		}
	}
	done := make(chan struct{})
	go func() { _ = p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute): // a hang guard, far below the stall timeout
		t.Fatal("Close waited for the stalled handshakes")
	}
}
