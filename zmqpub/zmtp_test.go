package zmqpub

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// FuzzZMTPDecoders: whatever a peer sends, the frame reader, the command parser and the READY parser return an
// error or a value within the bounds; they never panic.
func FuzzZMTPDecoders(f *testing.F) {
	f.Add(libzmqPing)
	f.Add(ready("DEALER"))
	f.Add([]byte{0x01, 0x00, 0x00, 0x08, 0, 0, 0, 0, 0, 0, 0, 7})
	f.Add([]byte{0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x04, 0x03, 0x09, 'R', 'E'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReader(bytes.NewReader(b))
		for {
			flags, body, err := readFrame(r, maxCommand)
			if err != nil {
				return
			}
			if len(body) > maxCommand || flags&flagLong != 0 {
				t.Fatalf("frame of %d bytes, flags %#x", len(body), flags)
			}
			if name, data, err := parseCommand(body); err == nil && name == "READY" {
				_, _ = readyProps(data)
			}
		}
	})
}

func TestReadyRoundTrip(t *testing.T) {
	r := bufio.NewReader(bytes.NewReader(ready("ROUTER")))
	flags, body, err := readFrame(r, maxCommand)
	if err != nil || flags != flagCommand {
		t.Fatalf("READY frame: %#x %v", flags, err)
	}
	name, data, err := parseCommand(body)
	if err != nil || name != "READY" {
		t.Fatalf("command %q %v", name, err)
	}
	props, err := readyProps(data)
	if err != nil || props["Socket-Type"] != "ROUTER" || len(props) != 1 {
		t.Fatalf("props %v %v", props, err)
	}
}

// FuzzReadPrefix: the reader after the handshake keeps at most keep bytes of a frame, whatever its size, and
// consumes exactly the frame (the next frame's header is read where it starts).
func FuzzReadPrefix(f *testing.F) {
	f.Add(pingFrame(make([]byte, 16)), 8)
	f.Add(appendFrame(nil, flagMore, bytes.Repeat([]byte{1}, 300)), 0)
	f.Add([]byte{0x02, 0, 0, 0, 0, 0, 0, 0x01, 0x00}, 3)
	f.Fuzz(func(t *testing.T, b []byte, keep int) {
		keep = max(0, keep%512)
		frame := appendFrame(nil, 0, b)
		r := bufio.NewReader(bytes.NewReader(append(frame, frame...)))
		for range 2 {
			flags, size, err := readHeader(r, maxCommand)
			if len(b) > maxCommand {
				if err == nil {
					t.Fatalf("a frame of %d bytes read", len(b))
				}
				return
			}
			if err != nil || flags != 0 || size != len(b) {
				t.Fatalf("header: %#x %d %v, want 0 %d", flags, size, err, len(b))
			}
			got, err := readPrefix(r, size, keep, nil)
			if err != nil || !bytes.Equal(got, b[:min(len(b), keep)]) {
				t.Fatalf("prefix %x (%v), want %x", got, err, b[:min(len(b), keep)])
			}
		}
	})
}

// FuzzSubscriptions: any sequence of SUBSCRIBE and CANCEL leaves the topic matched exactly when libzmq's PUB would
// (a model: the set of subscriptions), never holds more than maxSubscriptions, and refuses a new SUBSCRIBE past it.
func FuzzSubscriptions(f *testing.F) {
	f.Add([]byte("\x01\x00\x01\x02kv\x00\x00"), "kv")
	f.Add([]byte("\x01\x01k\x01\x03kvx\x00\x01k\x00\x01k"), "kv")
	f.Fuzz(func(t *testing.T, ops []byte, topic string) {
		s := newSubscriptions([]byte(topic))
		model := map[string]bool{}
		for len(ops) > 0 {
			add := ops[0]&1 == 1
			n := 0
			if len(ops) > 1 {
				n = int(ops[1]) % 4
			}
			sub := string(ops[min(len(ops), 2):min(len(ops), 2+n)])
			ops = ops[min(len(ops), 2+n):]
			full := s.held() >= maxSubscriptions
			err := s.update(add, []byte(sub), len(sub))
			switch {
			case add && full && !model[sub]:
				if err == nil {
					t.Fatal("a new SUBSCRIBE past the bound taken")
				}
				return
			case err != nil:
				t.Fatalf("update: %v", err)
			case add:
				model[sub] = true
			default:
				delete(model, sub)
			}
			want := false
			for m := range model {
				want = want || strings.HasPrefix(topic, m)
			}
			if s.matches() != want || s.held() != len(model) || s.held() > maxSubscriptions {
				t.Fatalf("topic %q, subscriptions %v: matches %v, %d held; want %v, %d", topic, model, s.matches(),
					s.held(), want, len(model))
			}
		}
	})
}

// FuzzServe: whatever a peer sends after its handshake, a subscriber's and a replay client's reader end with the
// read error (the input ran out), a protocol error or a cut for a bound, never a panic, and a subscriber's
// subscriptions stay within their bound.
func FuzzServe(f *testing.F) {
	f.Add(append(append(pingFrame(make([]byte, 16)), subscription(true, []byte("k"))...), 0x01, 0x00, 0x00, 0x01, 7))
	f.Add(command("SUBSCRIBE", []byte("kv")))
	f.Add(append(bytes.Repeat(appendFrame(nil, flagMore, []byte("x")), 17), pingFrame(make([]byte, 17))...))
	f.Add(append(command("CANCEL", []byte("k")), appendFrame(nil, 0, bytes.Repeat([]byte{1}, 300))...))
	p, err := New(Config{Endpoint: "ipc://" + f.TempDir() + "/pub", ReplayEndpoint: "ipc://" + f.TempDir() + "/rep",
		Topic: "kv", BufferSteps: 4}, nil)
	if err != nil {
		f.Fatal(err)
	}
	defer p.Close()
	p.PublishReset(1, []byte("r"))
	p.Publish(2, []byte("b"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, serve := range []func(*conn) error{p.serveSubscriber, p.serveReplayClient} {
			server, client := net.Pipe()
			go func() { _, _ = io.Copy(io.Discard, client) }() // the peer reads whatever it is sent
			c := newConn(server, bufio.NewReader(bytes.NewReader(b)), time.Minute, 1<<20, 0)
			err := serve(c)
			var ce *cutError
			if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, errProtocol) && !errors.As(err, &ce) {
				t.Fatalf("serve ended with %v", err)
			}
			c.close(errClosed)
			_ = client.Close()
		}
	})
}
