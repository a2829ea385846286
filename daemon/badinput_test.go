package daemon

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
)

// rawExchange writes in on a fresh connection (then half-closes when closeWrite) and reads reply frames until the
// daemon closes the connection or 10 s pass. It reports the frames and whether the daemon closed.
func rawExchange(t *testing.T, socket string, in []byte, closeWrite bool, then []byte) ([]sock.Frame, bool) {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(in) > 0 {
		if _, err := c.Write(in); err != nil {
			t.Fatal(err)
		}
	}
	if closeWrite {
		_ = c.(*net.UnixConn).CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	var frames []sock.Frame
	for {
		f, _, err := sock.ReadFrame(br, sock.MaxResponse, nil)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
				return frames, true
			}
			if isTimeout(err) {
				return frames, false
			}
			t.Fatalf("read reply: %v", err)
		}
		f.Body = append([]byte(nil), f.Body...)
		frames = append(frames, f)
		if then != nil && len(frames) == 1 {
			if _, err := c.Write(then); err != nil {
				return frames, true
			}
			then = nil
			continue
		}
		if len(frames) >= 2 || then == nil && !closeWrite {
			// One reply is all a single bad request can get; check whether the connection stays open.
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		}
	}
}

func req(k sock.Kind, body string) []byte {
	return frameBytes(uint32(4+len(body)), 1, byte(k), 0, []byte(body))
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && !oe.Timeout()
}

func errCode(t *testing.T, f sock.Frame) string {
	t.Helper()
	var eb sock.ErrorBody
	if f.Status != sock.StatusError || json.Unmarshal(f.Body, &eb) != nil || eb.Error == "" {
		t.Fatalf("reply %v/%v %q is not an error reply", f.Kind, f.Status, f.Body)
	}
	return eb.Code
}

// TestBadInput sends hostile or broken input on its own connection: each gets a clear error reply or is closed,
// and a bystander client keeps working.
func TestBadInput(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.IdleTimeout = 300 * time.Millisecond
		c.FrameTimeout = 300 * time.Millisecond
		c.MaxRequestBytes = 1 << 10
	})
	// A bystander keeps querying through the whole test: every bad client below must leave it unaffected.
	bystander, err := sock.Dial(ctxT(t), ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer bystander.Close()
	stop := make(chan struct{})
	byErr := make(chan error, 1)
	go func() {
		defer close(byErr)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := bystander.Health(ctxT(t)); err != nil {
				byErr <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-byErr; err != nil {
			t.Errorf("bystander client broken: %v", err)
		}
	}()
	health := frameBytes(4, 1, byte(sock.KindHealth), 0, nil)

	tests := []struct {
		name       string
		in         []byte
		closeWrite bool
		wantCode   string // "" = no reply expected
		wantClosed bool
	}{
		{"truncated frame then EOF", frameBytes(100, 1, byte(sock.KindEvents), 0, []byte(`{"start":`)), true, "", true},
		{"truncated frame then silence", frameBytes(100, 1, byte(sock.KindEvents), 0, []byte(`{"start":`)), false, "", true},
		{"truncated header", []byte{9, 0, 0}, false, "", true},
		{"oversized length", frameBytes(0xFFFFFFFF, 1, byte(sock.KindDump), 0, nil), false, sock.CodeTooLarge, true},
		{"just over the cap", frameBytes(1<<10+1, 1, byte(sock.KindDump), 0, nil), false, sock.CodeTooLarge, true},
		{"length below header", frameBytes(2, 1, byte(sock.KindHealth), 0, nil), false, sock.CodeBadRequest, true},
		{"wrong version", frameBytes(4, 2, byte(sock.KindHealth), 0, nil), false, sock.CodeUnsupportedVersion, true},
		{"garbage (HTTP on the socket)", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), false, sock.CodeUnsupportedVersion, true},
		{"garbage with version byte 1", []byte{0xff, 0xff, 0xff, 0x7f, 1, 3, 0, 0, 'x'}, false, sock.CodeTooLarge, true},
		{"silent client", nil, false, "", true},
		{"unknown kind", frameBytes(4, 1, 99, 0, nil), false, sock.CodeUnknownKind, false},
		{"kind zero", frameBytes(4, 1, 0, 0, nil), false, sock.CodeUnknownKind, false},
		{"nonzero request status", frameBytes(4, 1, byte(sock.KindHealth), 1, nil), false, sock.CodeBadRequest, false},
		{"bad JSON", req(sock.KindEvents, `{"sta`), false, sock.CodeBadRequest, false},
		{"unknown field", req(sock.KindEvents, `{"start_event_id":1}`), false, sock.CodeBadRequest, false},
		{"negative id", req(sock.KindEvents, `{"start":-1}`), false, sock.CodeBadRequest, false},
		{"no stream", req(sock.KindDump, `{}`), false, sock.CodeNotFound, false},
		{"attach relative path", req(sock.KindAttach, `{"ring_path":"x.ring","kv_block_size":4}`), false, sock.CodeBadRequest, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var then []byte
			if !tt.wantClosed && tt.wantCode != "" {
				then = health // the connection must still serve a good request
			}
			frames, closed := rawExchange(t, ts.SocketPath(), tt.in, tt.closeWrite, then)
			if tt.wantCode == "" && len(frames) != 0 {
				t.Fatalf("got %d reply frames, want none", len(frames))
			}
			if tt.wantCode != "" {
				if len(frames) == 0 {
					t.Fatalf("no reply, want an error reply with code %s", tt.wantCode)
				}
				if got := errCode(t, frames[0]); got != tt.wantCode {
					t.Fatalf("error code %s (%s), want %s", got, frames[0].Body, tt.wantCode)
				}
			}
			if then != nil && (len(frames) != 2 || frames[1].Status != sock.StatusOK || frames[1].Kind != sock.KindHealth) {
				t.Fatalf("connection did not serve HEALTH after the error: %d frames", len(frames))
			}
			if tt.wantClosed && !closed {
				t.Fatal("connection stayed open, want it closed")
			}
			if !tt.wantClosed && closed && then == nil {
				t.Fatal("connection closed, want it open")
			}
		})
	}
}

// TestConnectionLimit: beyond MaxConns a client gets a busy error and the others are unaffected.
func TestConnectionLimit(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.MaxConns = 2 })
	a, err := sock.Dial(ctxT(t), ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := sock.Dial(ctxT(t), ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []*sock.Client{a, b} { // both admitted
		if _, err := c.Health(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	frames, closed := rawExchange(t, ts.SocketPath(), nil, false, nil)
	if len(frames) != 1 || errCode(t, frames[0]) != sock.CodeBusy || !closed {
		t.Fatalf("third connection: %d frames closed=%v, want one busy error and close", len(frames), closed)
	}
	if _, err := a.Health(ctxT(t)); err != nil {
		t.Fatalf("admitted client broken: %v", err)
	}
}

// TestUnreadReplyWriteTimeout: a client that asks for a large DUMP and never reads the reply is cut off by the
// write timeout; meanwhile a bystander's queries and the producer's ingest go on, and its slot is freed.
func TestUnreadReplyWriteTimeout(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.WriteTimeout = 500 * time.Millisecond })
	p := newProducer(t, ts.SocketPath(), 1, 1, 1<<20)
	bystander, err := sock.Dial(ctxT(t), ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer bystander.Close()
	// ~20k resident blocks: the dump is several MB, far more than a Unix socket buffer holds.
	const perEvent, events = 64, 320
	for i := range uint64(events) {
		hs := make([]uint64, perEvent)
		for j := range hs {
			hs[j] = i*perEvent + uint64(j) + 1
		}
		p.mustPublish(stored(i, 0, nil, hs, tokens(uint32(i*perEvent), perEvent, 1)))
		if i%32 == 31 { // let the drain keep up (read-your-writes barrier)
			if _, err := bystander.Stats(ctxT(t), u64p(1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	full, err := bystander.Dump(ctxT(t), u64p(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(full) < 1<<20 {
		t.Fatalf("dump of %d bytes is too small to fill the socket buffer", len(full))
	}
	before := ts.nconns.Load()

	hostile, err := net.Dial("unix", ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer hostile.Close()
	if _, err := hostile.Write(req(sock.KindDump, `{"worker_id":1}`)); err != nil {
		t.Fatal(err)
	}
	// While the daemon is stuck writing to the hostile client, the bystander is served and ingest continues.
	p.mustPublish(stored(events, 0, nil, []uint64{1 << 40}, tokens(7, 1, 1)))
	got, err := bystander.Events(ctxT(t), u64p(1), u64p(events), nil)
	if err != nil || !strings.Contains(string(got), `"event_id":320`) {
		t.Fatalf("bystander during the stall: %s %v", got, err)
	}
	// The daemon gives up on the hostile connection: the connection count returns to what it was.
	deadline := time.Now().Add(20 * time.Second)
	for ts.nconns.Load() != before {
		if time.Now().After(deadline) {
			t.Fatalf("hostile connection still open after 20 s (%d connections, want %d)", ts.nconns.Load(), before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// What the hostile client can still read is a truncated reply followed by the end of the connection.
	_ = hostile.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, hostile)
	if isTimeout(err) {
		t.Fatal("hostile connection not closed by the daemon")
	}
	if n >= int64(sock.HeaderSize+len(full)) {
		t.Fatalf("hostile client read %d bytes: the whole reply of %d was written", n, sock.HeaderSize+len(full))
	}
	if _, err := bystander.Health(ctxT(t)); err != nil {
		t.Fatalf("bystander after the cut-off: %v", err)
	}
}
