package zmqpub

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAdvance(t *testing.T) {
	m := net.Buffers{[]byte("ab"), []byte("cde"), nil, []byte("f")}
	for _, c := range []struct {
		k    int
		want string
	}{{0, "abcdef"}, {1, "bcdef"}, {2, "cdef"}, {4, "ef"}, {5, "f"}, {6, ""}} {
		got := bytes.Join(advance(m, c.k), nil)
		if string(got) != c.want {
			t.Errorf("advance(%d) = %q, want %q", c.k, got, c.want)
		}
	}
	if string(bytes.Join(m, nil)) != "abcdef" {
		t.Fatal("advance modified its argument (shared with other queues)")
	}
}

// tcpPair returns a loopback connection and its peer, the peer's receive buffer small.
func tcpPair(t *testing.T) (w, r net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if r, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	_ = r.(*net.TCPConn).SetReadBuffer(16 << 10)
	if w, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	_ = w.(*net.TCPConn).SetWriteBuffer(16 << 10)
	return w, r
}

// TestWritevNonblock: on a real socket whose peer does not read, the non-blocking writev writes what fits (a
// partial write leaves the rest), then nothing (EAGAIN returns the message whole), never waits; the bytes that
// arrive are exactly the ones it reported written, in order.
func TestWritevNonblock(t *testing.T) {
	w, r := tcpPair(t)
	rc, err := w.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	wr := writevNonblock(rc)
	var sent []byte
	eagain := false
	for i := 0; !eagain; i++ {
		if i > 100000 {
			t.Fatal("the socket never filled")
		}
		body := bytes.Repeat([]byte{byte(i)}, 4000)
		m := net.Buffers{binary.BigEndian.AppendUint32(nil, uint32(i)), body}
		rest, err := wr(m, 4+len(body))
		if err != nil {
			t.Fatal(err)
		}
		left := len(bytes.Join(rest, nil))
		sent = append(sent, bytes.Join(m, nil)[:4+len(body)-left]...)
		eagain = left == 4+len(body)
	}
	got := make([]byte, len(sent))
	_ = r.SetReadDeadline(time.Now().Add(20 * time.Second)) // a hang guard
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, sent) {
		t.Fatalf("received %d bytes (%v), differing from the %d written", len(got), err, len(sent))
	}
}

// TestPutDirectOrQueued: put writes a message itself when the queue is empty and hands the writer goroutine
// exactly what its write left (everything after EAGAIN, the tail after a partial write), and writes nothing itself
// while anything is queued: the peer receives every byte once, in put order. An error from the write closes the
// connection.
func TestPutDirectOrQueued(t *testing.T) {
	for _, c := range []struct {
		name     string
		k        int   // bytes the first direct write takes; -1: all of them
		err      error // the first direct write's error
		wantRaws int   // calls to the direct write for the two puts
	}{
		{"all written", -1, nil, 2},
		{"partial", 3, nil, 1},
		{"EAGAIN", 0, nil, 1},
		{"broken", 0, syscall.EPIPE, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer b.Close()
			cn := newConn(a, nil, time.Minute, 1<<20, 0)
			defer cn.close(errClosed)
			// The peer takes the first direct write's bytes, then nothing until both puts are done: the rest of m1
			// stays queued (being written) while m2 is put, however the writer goroutine is scheduled (under
			// qemu-user it drained m1 first and m2 went direct). A zero-length write meets one Read too.
			gate := c.err == nil && c.k >= 0
			release := make(chan struct{})
			got := make(chan []byte, 1)
			go func() {
				var first []byte
				if gate {
					first = make([]byte, c.k)
					n, _ := b.Read(first)
					first = first[:n]
					<-release
				}
				rest, _ := io.ReadAll(b)
				got <- append(first, rest...)
			}()
			raws := 0
			cn.mu.Lock()
			cn.raw = func(m net.Buffers, n int) (net.Buffers, error) {
				raws++
				if c.err != nil && raws == 1 {
					return nil, c.err
				}
				k := c.k
				if k < 0 || raws > 1 {
					k = n
				}
				if _, err := a.Write(bytes.Join(m, nil)[:k]); err != nil {
					return nil, err
				}
				return advance(m, k), nil
			}
			cn.mu.Unlock()
			m1 := net.Buffers{[]byte("hdr1"), []byte("payload one")}
			m2 := net.Buffers{[]byte("hdr2"), []byte("payload two")}
			err1 := cn.put(m1, false)
			err2 := cn.put(m2, false)
			close(release)
			if c.err != nil {
				if !errors.Is(err1, c.err) || !errors.Is(err2, errClosed) {
					t.Fatalf("puts after a broken write: %v, %v; want %v, %v", err1, err2, c.err, errClosed)
				}
				return
			}
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if !cn.waitWritten(2, time.Now().Add(time.Minute)) { // a hang guard
				t.Fatal("not written")
			}
			cn.close(errClosed)
			if all := <-got; string(all) != "hdr1payload onehdr2payload two" {
				t.Fatalf("peer received %q", all)
			}
			if raws != c.wantRaws {
				t.Fatalf("%d direct writes, want %d (none while a message is queued)", raws, c.wantRaws)
			}
		})
	}
}

// readMessages reads n ZMTP messages of 3 frames ([topic, seq, payload]) and returns their seqs.
func readMessages(t *testing.T, r *bufio.Reader, n int) []uint64 {
	t.Helper()
	var seqs []uint64
	for range n {
		var frames [][]byte
		for {
			flags, body, err := readFrame(r, 1<<30)
			if err != nil {
				t.Fatalf("after %d messages: %v", len(seqs), err)
			}
			frames = append(frames, body)
			if flags&flagMore == 0 {
				break
			}
		}
		if len(frames) != 3 || len(frames[1]) != 8 {
			t.Fatalf("message %d: %d frames", len(seqs), len(frames))
		}
		seqs = append(seqs, binary.BigEndian.Uint64(frames[1]))
	}
	return seqs
}

// TestOrderBehindSlowSubscriber: with a subscriber whose socket is full (part of a message written, the rest
// queued), batches, a heartbeat and a reset published meanwhile reach it in call order, whole; Flush does not
// complete until it has read them, and does after.
func TestOrderBehindSlowSubscriber(t *testing.T) {
	p := newPub(t, Config{Endpoint: "tcp://*:0", StallTimeout: 10 * time.Minute, SubscriberBacklog: 1 << 30,
		BufferSteps: 100})
	slow := stuckSubscriber(t, strings.TrimPrefix(strings.Replace(p.Stats().Endpoint, "0.0.0.0", "127.0.0.1", 1),
		"tcp://"))
	defer slow.Close()
	waitFor(t, func() bool { return subscribedAll(p) }, "the subscriber subscribed")
	c := p.pubs.snapshot()[0]
	payload := bytes.Repeat([]byte{9}, 64<<10)
	var want []uint64
	for s := uint64(0); !c.pending(); s++ { // until a write is left unfinished
		p.Publish(s, payload)
		want = append(want, s)
	}
	base := want[len(want)-1] + 1
	p.Publish(base, payload)
	p.PublishHeartbeat(base+1, []byte("hb"))
	p.PublishReset(base+2, []byte("reset"))
	p.Publish(base+3, payload)
	want = append(want, base, base+1, base+2, base+3)
	if p.Flush(10 * time.Millisecond) {
		t.Fatal("Flush completed before the subscriber read")
	}
	done := make(chan bool, 1)
	go func() { done <- p.Flush(time.Minute) }() // a hang guard
	_ = slow.SetReadDeadline(time.Now().Add(time.Minute))
	if got := readMessages(t, bufio.NewReader(slow), len(want)); !equalSeqs(got, want) {
		t.Fatalf("received seqs %v, want %v", got, want)
	}
	if !<-done {
		t.Fatal("Flush did not complete once the subscriber read everything")
	}
	if got := replaySeqsFrom(p, 0); !equalSeqs(got, []uint64{base + 2, base + 3}) {
		t.Fatalf("replay buffer %v, want the reset batch and the one after", got)
	}
}

// replaySeqsFrom returns the seqs held by p's replay buffer from start.
func replaySeqsFrom(p *Publisher, start uint64) []uint64 {
	p.bufMu.Lock()
	defer p.bufMu.Unlock()
	from, end, gen, _ := p.buf.replyRange(start)
	es, _, _ := p.buf.chunk(nil, from, end, gen, start, int(end-from))
	var out []uint64
	for _, e := range es {
		out = append(out, e.seq)
	}
	return out
}

// TestDirectWriteAfterQueuedWrite: the writer goroutine's stall deadline does not outlive its write: a direct write
// after it has passed still goes out (a deadline left in the past made every later direct write fail, and the
// healthy peer was cut).
func TestDirectWriteAfterQueuedWrite(t *testing.T) {
	w, r := tcpPair(t)
	cn := newConn(w, nil, 20*time.Millisecond, 1<<20, 0)
	defer cn.close(errClosed)
	cn.mu.Lock()
	raw := cn.raw
	cn.raw = nil // the first message goes through the writer goroutine
	cn.mu.Unlock()
	if raw == nil {
		t.Fatal("a tcp connection has no direct write")
	}
	if err := cn.put(net.Buffers{[]byte("queued ")}, false); err != nil {
		t.Fatal(err)
	}
	if !cn.waitWritten(1, time.Now().Add(time.Minute)) { // a hang guard
		t.Fatal("queued message not written")
	}
	cn.mu.Lock()
	cn.raw = raw
	cn.mu.Unlock()
	time.Sleep(50 * time.Millisecond) // past the stall deadline of that write
	if err := cn.put(net.Buffers{[]byte("direct")}, false); err != nil {
		t.Fatalf("direct write after the writer's deadline passed: %v", err)
	}
	got := make([]byte, len("queued direct"))
	_ = r.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := io.ReadFull(r, got); err != nil || string(got) != "queued direct" {
		t.Fatalf("received %q, %v", got, err)
	}
}
