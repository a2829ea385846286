package zmqpub

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/internal/testenv"
)

// joiner is a raw ZMTP SUB on p's PUB (tcp, from 127.0.0.1) that has sent its subscription to every topic.
func joiner(t *testing.T, p *Publisher) (net.Conn, *bufio.Reader) {
	t.Helper()
	addr := strings.Replace(strings.TrimPrefix(p.Stats().Endpoint, "tcp://"), "0.0.0.0", "127.0.0.1", 1)
	c := rawPeer(t, "tcp", addr, "SUB")
	if _, err := c.Write(subscription(true, nil)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a hang guard
	return c, bufio.NewReader(c)
}

// subscribedConns returns how many of p's subscribers are marked subscribed.
func subscribedConns(p *Publisher) int {
	n := 0
	for _, c := range p.pubs.snapshot() {
		if c.subscribed.Load() {
			n++
		}
	}
	return n
}

// TestLateSubscriberGetsBatchesSinceBind is a restarted kvshmd's race (e2e/dynamo/README.md): the PUB is bound and
// publishes at once, mid-incarnation; a subscriber that was connected to the daemon's previous life reconnects
// 100 ms later (libzmq) and, before, missed what was published meanwhile (dynamo.vllm's relay has no replay: lost
// for its router). Now a subscriber joining within the join window gets the buffered batches (not the heartbeats,
// which are never kept; from a reset batch on when one came: the incarnation ended), in order, then the live ones;
// one already subscribed gets everything once. A fresh stream (its first batch a reset: an incarnation's start)
// keeps PUB/SUB as vLLM has it: a late subscriber gets the live batches only.
func TestLateSubscriberGetsBatchesSinceBind(t *testing.T) {
	type op struct {
		kind itemKind
		seq  uint64
	}
	for _, tc := range []struct {
		name          string
		ops           []op
		late          []uint64 // what the late subscriber gets, the live seq 10 last
		joinedBatches uint64   // Stats.JoinedBatches
		joins         uint64   // Stats.Joins
	}{
		{"restarted daemon", []op{{itemBatch, 1}, {itemHeartbeat, 2}, {itemBatch, 3}}, []uint64{1, 3, 10}, 2, 1},
		{"restarted daemon, then the incarnation ends", []op{{itemHeartbeat, 1}, {itemBatch, 2}, {itemReset, 3},
			{itemBatch, 4}}, []uint64{3, 4, 10}, 2, 1},
		{"fresh stream", []op{{itemReset, 1}, {itemBatch, 2}, {itemHeartbeat, 3}}, []uint64{10}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPub(t, Config{Endpoint: "tcp://*:0", Topic: "kv", BufferSteps: 100})
			_, early := joiner(t, p)
			waitFor(t, func() bool { return subscribedConns(p) == 1 }, "the early subscriber subscribed")
			var all []uint64
			for _, o := range tc.ops {
				p.publish(entry{seq: o.seq, payload: []byte("x"), reset: o.kind == itemReset}, o.kind)
				all = append(all, o.seq)
			}
			_, late := joiner(t, p)
			waitFor(t, func() bool { return subscribedConns(p) == 2 }, "the late subscriber subscribed")
			p.Publish(10, []byte("live"))
			if got := readMessages(t, late, len(tc.late)); !equalSeqs(got, tc.late) {
				t.Fatalf("late subscriber got seqs %v, want %v", got, tc.late)
			}
			if got := readMessages(t, early, len(all)+1); !equalSeqs(got, append(all, 10)) {
				t.Fatalf("early subscriber got seqs %v, want %v, each once", got, append(all, 10))
			}
			if st := p.Stats(); st.Joins != tc.joins || st.JoinedBatches != tc.joinedBatches {
				t.Fatalf("Joins %d, JoinedBatches %d; want %d and %d", st.Joins, st.JoinedBatches, tc.joins,
					tc.joinedBatches)
			}
		})
	}
}

// TestJoinOnlyOnceAndOnlyInTheWindow: a subscriber that cancels and subscribes again is not given the batches
// again, and one that joins after the window gets only the live batches (PUB/SUB as libzmq has it).
func TestJoinOnlyOnceAndOnlyInTheWindow(t *testing.T) {
	const window = 300 * time.Millisecond
	p := newPub(t, Config{Endpoint: "tcp://*:0", BufferSteps: 100, JoinWindow: window})
	p.Publish(1, []byte("a"))
	p.Publish(2, []byte("b"))
	c, r := joiner(t, p)
	if got := readMessages(t, r, 2); !equalSeqs(got, []uint64{1, 2}) {
		t.Fatalf("joiner got %v, want [1 2]", got)
	}
	if _, err := c.Write(append(subscription(false, nil), subscription(true, nil)...)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the cancel and the new subscription read (no state to wait for: the same)
	waitFor(t, func() bool { return subscribedConns(p) == 1 }, "subscribed again")
	time.Sleep(window - time.Since(p.opened) + 50*time.Millisecond)
	_, after := joiner(t, p)
	waitFor(t, func() bool { return subscribedConns(p) == 2 }, "the subscriber after the window subscribed")
	p.Publish(3, []byte("c"))
	if got := readMessages(t, r, 1); !equalSeqs(got, []uint64{3}) {
		t.Fatalf("after cancel and subscribe again: %v, want [3] (nothing given twice)", got)
	}
	if got := readMessages(t, after, 1); !equalSeqs(got, []uint64{3}) {
		t.Fatalf("a subscriber after the join window got %v, want [3]", got)
	}
}

// TestJoinBounds: what one joiner is given is the newest batches the buffer holds, at most maxJoinBatches, half its
// backlog in bytes and half its HWM in messages (joinChunk batches each), so it is never cut for its own join.
func TestJoinBounds(t *testing.T) {
	overhead := (&Publisher{topic: []byte("kv")}).msgOverhead()
	for _, tc := range []struct {
		name       string
		cfg        Config
		n, size    int
		wantFirst  uint64 // the first seq the joiner gets (the last is n)
		wantJoined uint64
	}{
		{"all", Config{BufferSteps: 100}, 50, 10, 1, 50},
		{"steps", Config{BufferSteps: 20}, 50, 10, 31, 20},
		{"max batches", Config{BufferSteps: 5000}, 2000, 1, 2000 - maxJoinBatches + 1, maxJoinBatches},
		{"backlog", Config{BufferSteps: 100, SubscriberBacklog: 64 << 10}, 40, 4096,
			uint64(40 - (32<<10)/(4096+overhead) + 1), uint64((32 << 10) / (4096 + overhead))},
		{"hwm", Config{BufferSteps: 100, HWM: 3}, 100, 1, 100 - joinChunk + 1, joinChunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Endpoint, tc.cfg.Topic, tc.cfg.StallTimeout = "tcp://*:0", "kv", time.Minute
			p := newPub(t, tc.cfg)
			for s := 1; s <= tc.n; s++ {
				p.Publish(uint64(s), bytes.Repeat([]byte{1}, tc.size))
			}
			_, r := joiner(t, p)
			want := make([]uint64, 0, tc.n)
			for s := tc.wantFirst; s <= uint64(tc.n); s++ {
				want = append(want, s)
			}
			if got := readMessages(t, r, len(want)); !equalSeqs(got, want) {
				t.Fatalf("joiner got %d seqs %v..., want %d from %d", len(got), got[:min(len(got), 3)], len(want),
					tc.wantFirst)
			}
			p.Publish(uint64(tc.n+1), []byte("live"))
			if got := readMessages(t, r, 1); got[0] != uint64(tc.n+1) {
				t.Fatalf("live seq %d after the join, want %d", got[0], tc.n+1)
			}
			if st := p.Stats(); st.JoinedBatches != tc.wantJoined || st.Cut != 0 {
				t.Fatalf("JoinedBatches %d (want %d), cut %d (want 0)", st.JoinedBatches, tc.wantJoined, st.Cut)
			}
		})
	}
}

// TestJoinersThatNeverReadCostTheirAddressOnly: joiners from one address that never read, each given a full join
// (half a backlog), hold at most half a backlog each and their address's backlog together (a joiner past it is cut,
// addr_backlog; how many are depends on what the kernel's socket buffers take), and a subscriber of another address
// joining beside them gets its whole join and the live batches.
func TestJoinersThatNeverReadCostTheirAddressOnly(t *testing.T) {
	const backlog, addrBacklog = 1 << 20, 2 << 20
	p := newPub(t, Config{Endpoint: "tcp://*:0", BufferSteps: 1000, StallTimeout: 10 * time.Minute,
		SubscriberBacklog: backlog, AddrBacklog: addrBacklog})
	for s := 1; s <= 200; s++ {
		p.Publish(uint64(s), bytes.Repeat([]byte{2}, 16<<10)) // 3.2 MiB buffered; a join takes the newest 512 KiB
	}
	addr := strings.Replace(strings.TrimPrefix(p.Stats().Endpoint, "tcp://"), "0.0.0.0", "127.0.0.1", 1)
	for range 32 {
		c, err := handshakeFrom("127.0.0.2", addr, "SUB")
		if err != nil {
			continue // past the address's share: closed at accept
		}
		t.Cleanup(func() { _ = c.Close() })
		_, _ = c.Write(subscription(true, nil))
	}
	waitFor(t, func() bool { return p.Stats().Joins+cutBy(p, "addr_backlog") >= 32 },
		"every joiner given its join or cut")
	for _, c := range p.pubs.snapshot() {
		c.mu.Lock()
		q, share := c.qBytes, c.share
		c.mu.Unlock()
		if q > backlog/2 {
			t.Fatalf("a joiner holds %d bytes queued, over half its backlog", q)
		}
		if share != nil && share.queued.Load() > addrBacklog {
			t.Fatalf("one address's joiners hold %d bytes queued, over its bound %d", share.queued.Load(), addrBacklog)
		}
	}
	if st := p.Stats(); st.Cut != cutBy(p, "addr_backlog") {
		t.Fatalf("joiners cut for other reasons than their address's backlog: %v", st.PeersCut)
	}
	healthy := subscribeFrom(t, "127.0.0.3", addr, nil)
	_ = healthy.SetReadDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(healthy)
	got := readMessages(t, r, (backlog/2)/(16<<10+p.msgOverhead()))
	p.Publish(201, []byte("live"))
	got = append(got, readMessages(t, r, 1)...)
	if last := got[len(got)-1]; last != 201 || got[len(got)-2] != 200 {
		t.Fatalf("the other address's subscriber got ..%v, want ..200 201", got[max(0, len(got)-3):])
	}
}

// TestLibzmqSubReconnectingAfterBind is the restart race with the real peer: a libzmq SUB (pyzmq) connected to an
// endpoint that nothing listens on yet (a kvshmd SIGKILLed) retries every 100 ms; the PUB is bound and publishes
// batches and a heartbeat of the engine's ongoing incarnation at once, before the SUB is back. The SUB gets the batches, in order, then the live
// one (before, only the live one: what was published before its reconnect was lost).
func TestLibzmqSubReconnectingAfterBind(t *testing.T) {
	py := testenv.VenvPython(t, "../.venv/bin/python", "zmq")
	port := portBelowEphemeral(t)
	cmd := exec.Command(py, "testdata/latejoin.py", fmt.Sprintf("tcp://127.0.0.1:%d", port), "3")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "connecting" {
		t.Fatalf("latejoin.py: %q, %v", lines.Text(), lines.Err())
	}
	p := newPub(t, Config{Endpoint: fmt.Sprintf("tcp://*:%d", port), BufferSteps: 100})
	p.Publish(7, []byte("a")) // mid-incarnation: no reset batch first
	p.PublishHeartbeat(8, []byte("hb"))
	p.Publish(9, []byte("b"))
	waitFor(t, func() bool { return subscribedConns(p) == 1 }, "the libzmq SUB reconnected and subscribed")
	p.Publish(10, []byte("live"))
	if !lines.Scan() {
		t.Fatalf("latejoin.py: no result: %v", lines.Err())
	}
	var res struct {
		Seqs   []uint64
		Errors []string
	}
	if err := json.Unmarshal(lines.Bytes(), &res); err != nil {
		t.Fatalf("latejoin.py's output %q: %v", lines.Text(), err)
	}
	if len(res.Errors) > 0 || !equalSeqs(res.Seqs, []uint64{7, 9, 10}) {
		t.Fatalf("the libzmq SUB got seqs %v (errors %v), want [7 9 10]", res.Seqs, res.Errors)
	}
}

// portBelowEphemeral is a free loopback port below the kernel's ephemeral range. A SUB that keeps connecting to a
// port nobody listens on can, when that port is in the ephemeral range, be given it as its own source port and
// connect to itself (TCP's simultaneous open): the publisher's bind then fails with EADDRINUSE (seen once in
// go test -count=4 on a loaded machine).
func portBelowEphemeral(t *testing.T) int {
	t.Helper()
	low := 32768 // Linux's default when the range cannot be read
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	for range 200 {
		port := 10000 + rng.IntN(max(1, low-10000))
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			_ = ln.Close()
			return port
		}
	}
	t.Fatalf("no free port below the ephemeral range (from %d)", low)
	return 0
}
