package zmqpub

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"strings"
	"testing"
	"time"
)

// replaySeqs returns the seqs of a replay from start.
func replaySeqs(t *testing.T, ep string, start uint64) []uint64 {
	t.Helper()
	var out []uint64
	for _, b := range replay(t, ep, seqBytes(start)) {
		out = append(out, binary.BigEndian.Uint64(b[0]))
	}
	return out
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHeartbeatAndReset: heartbeats and resets are published live in order with Publish; a heartbeat is not kept
// for replay; a reset empties the buffer and is its first batch, and a request from before it is complete.
func TestHeartbeatAndReset(t *testing.T) {
	ep, rep := ipcEndpoint(t, "pub"), ipcEndpoint(t, "replay")
	p := newPub(t, Config{Endpoint: ep, ReplayEndpoint: rep, BufferSteps: 100})
	sub := subscribe(t, p, ep)
	p.Publish(10, []byte("a"))
	p.PublishHeartbeat(11, []byte("hb"))
	p.Publish(12, []byte("b"))
	for _, want := range []uint64{10, 11, 12} {
		if _, seq, _ := recvBatch(t, sub); seq != want {
			t.Fatalf("live seq %d, want %d", seq, want)
		}
	}
	if got := replaySeqs(t, rep, 10); !equalSeqs(got, []uint64{10, 12}) {
		t.Fatalf("replay after a heartbeat: %v, want [10 12]", got)
	}
	if !p.PublishReset(13, []byte("cleared")) {
		t.Fatal("PublishReset refused")
	}
	p.PublishHeartbeat(14, []byte("hb"))
	p.Publish(15, []byte("c"))
	for _, want := range []uint64{13, 14, 15} {
		if _, seq, _ := recvBatch(t, sub); seq != want {
			t.Fatalf("live seq %d, want %d", seq, want)
		}
	}
	if got := replaySeqs(t, rep, 1); !equalSeqs(got, []uint64{13, 15}) {
		t.Fatalf("replay from 1 after a reset: %v, want [13 15]", got)
	}
	// From 0 (a consumer holding nothing of the stream) the reset batch, which only clears, is left out.
	if got := replaySeqs(t, rep, 0); !equalSeqs(got, []uint64{15}) {
		t.Fatalf("replay from 0 after a reset: %v, want [15]", got)
	}
	if st := p.Stats(); st.ReplayIncomplete != 0 {
		t.Fatalf("ReplayIncomplete %d: a request from before a reset batch is complete", st.ReplayIncomplete)
	}
}

// TestResetNeverDropped: PublishReset returns true until Close, whatever a subscriber's state (here one that never
// reads, its socket and queue full), and false after it.
func TestResetNeverDropped(t *testing.T) {
	p := newPub(t, Config{Endpoint: "tcp://*:0", StallTimeout: 10 * time.Minute, SubscriberBacklog: 1 << 30})
	stuck := stuckSubscriber(t, strings.TrimPrefix(p.Stats().Endpoint, "tcp://"))
	defer stuck.Close()
	waitFor(t, func() bool { return subscribedAll(p) }, "the stuck subscriber subscribed")
	payload := bytes.Repeat([]byte{1}, 64<<10)
	c := p.pubs.snapshot()[0]
	for i := uint64(0); !c.pending(); i++ {
		p.Publish(i, payload)
	}
	if !p.PublishReset(1<<40, []byte{3}) {
		t.Fatal("PublishReset refused with a subscriber's queue holding messages")
	}
	p.Close()
	if p.PublishReset(1, nil) {
		t.Fatal("PublishReset after Close returned true")
	}
}

// TestFlush: Flush returns once what was published is written to every subscriber; with a subscriber that never
// reads (and a stall timeout and backlog far beyond the test) it times out and says so.
func TestFlush(t *testing.T) {
	p := newPub(t, Config{Endpoint: "tcp://*:0", StallTimeout: 10 * time.Minute, SubscriberBacklog: 1 << 30})
	ep := strings.Replace(p.Stats().Endpoint, "0.0.0.0", "127.0.0.1", 1)
	sub := subscribe(t, p, ep)
	payload := bytes.Repeat([]byte{1}, 1<<20)
	go func() { // the healthy subscriber reads everything
		for {
			if _, err := sub.Recv(); err != nil {
				return
			}
		}
	}()
	for i := range uint64(8) {
		p.Publish(i, payload)
	}
	if !p.Flush(time.Minute) { // a hang guard
		t.Fatal("Flush with a healthy subscriber did not complete")
	}
	for _, c := range p.pubs.snapshot() {
		if c.queued() == 0 || c.pending() {
			t.Error("a subscriber's queue still holds bytes after Flush (or never had any)")
		}
	}
	healthy := p.pubs.snapshot()[0]
	stuck := stuckSubscriber(t, strings.TrimPrefix(ep, "tcp://"))
	defer stuck.Close()
	waitFor(t, func() bool { return len(p.pubs.snapshot()) == 2 }, "2 connections")
	var stuckConn *conn
	for _, c := range p.pubs.snapshot() {
		if c != healthy {
			stuckConn = c
		}
	}
	queued := func() int { stuckConn.mu.Lock(); defer stuckConn.mu.Unlock(); return stuckConn.qMsgs }
	for i := uint64(0); queued() < 16; i++ { // until its socket buffers are full and its queue holds 16 MiB
		p.Publish(100+i, payload)
		time.Sleep(time.Millisecond)
	}
	if p.Flush(50 * time.Millisecond) {
		t.Fatal("Flush completed with a subscriber that never reads")
	}
	p.Close()
	if p.Flush(time.Second) {
		t.Fatal("Flush after Close returned true")
	}
}

// TestReplayIncomplete: a reply is incomplete when the requested seq is before the oldest buffered batch and that
// batch is not a reset batch (rolled over by steps or bytes, or a publisher that began mid-incarnation).
func TestReplayIncomplete(t *testing.T) {
	for _, c := range []struct {
		name      string
		cfg       Config
		reset     bool // the first batch is a reset batch
		start     uint64
		want      []uint64
		wantIncpl uint64
	}{
		{"from before a reset", Config{BufferSteps: 10}, true, 1, []uint64{10, 11, 12, 13}, 0},
		{"from 0, before a reset: the reset left out", Config{BufferSteps: 10}, true, 0, []uint64{11, 12, 13}, 0},
		{"began mid-incarnation", Config{BufferSteps: 10}, false, 0, []uint64{10, 11, 12, 13}, 1},
		{"began mid-incarnation, asked from its first", Config{BufferSteps: 10}, false, 10, []uint64{10, 11, 12, 13}, 0},
		{"rolled over by steps", Config{BufferSteps: 2}, true, 0, []uint64{12, 13}, 1},
		{"rolled over, asked from what it holds", Config{BufferSteps: 2}, true, 12, []uint64{12, 13}, 0},
		{"rolled over by bytes", Config{BufferSteps: 10, BufferBytes: 250}, true, 11, []uint64{12, 13}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep := ipcEndpoint(t, "replay")
			c.cfg.Endpoint, c.cfg.ReplayEndpoint = ipcEndpoint(t, "pub"), rep
			p := newPub(t, c.cfg)
			payload := bytes.Repeat([]byte{1}, 100)
			if c.reset {
				p.PublishReset(10, payload)
			} else {
				p.Publish(10, payload)
			}
			for s := uint64(11); s < 14; s++ {
				p.Publish(s, payload)
			}
			waitFor(t, func() bool { return p.Stats().Published == 4 }, "4 published")
			if got := replaySeqs(t, rep, c.start); !equalSeqs(got, c.want) {
				t.Fatalf("replay from %d: %v, want %v", c.start, got, c.want)
			}
			if got := p.Stats().ReplayIncomplete; got != c.wantIncpl {
				t.Fatalf("ReplayIncomplete %d, want %d", got, c.wantIncpl)
			}
		})
	}
}

// TestBufferGrowsAsUsed: buffer_steps 2^31-1 allocated 2^31 entries (64 GiB) up front and killed the daemon
// (before the per-producer bounds); the buffer now grows as batches arrive.
func TestBufferGrowsAsUsed(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p := newPub(t, Config{Endpoint: ipcEndpoint(t, "pub"), BufferSteps: 1<<31 - 1})
	runtime.ReadMemStats(&after)
	if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20 {
		t.Fatalf("New with buffer_steps 2^31-1 allocated %d bytes", grown)
	}
	p.Publish(1, []byte{1})
	waitFor(t, func() bool { return p.Stats().Published == 1 }, "1 published")
}
