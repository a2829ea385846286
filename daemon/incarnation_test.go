package daemon

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/vllmwire"
)

// Incarnations, wire seqs and heartbeats (docs/lifecycle.md; incarnation.go).

// procProducer is a producer process (producerMain) publishing on ZMQ through the daemon.
type procProducer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startProcProducer(t *testing.T, socket, ring, ep, rep string, events int) *procProducer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "KVSHMD_TEST_PRODUCER=1", "KVSHMD_TEST_SOCKET="+socket, "KVSHMD_TEST_RING="+ring,
		"KVSHMD_TEST_EVENTS="+strconv.Itoa(events), "KVSHMD_TEST_PUBLISH="+ep, "KVSHMD_TEST_REPLAY="+rep)
	in, out := startPiped(t, cmd)
	p := &procProducer{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p.expect(t, "published")
	return p
}

func (p *procProducer) expect(t *testing.T, want string) {
	t.Helper()
	line, err := p.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != want {
		t.Fatalf("producer process: %q %v, want %q", line, err, want)
	}
}

// pub makes the process publish k more events of its chain.
func (p *procProducer) pub(t *testing.T, k int) {
	t.Helper()
	if _, err := fmt.Fprintf(p.in, "pub %d\n", k); err != nil {
		t.Fatal(err)
	}
	p.expect(t, "ok")
}

// joinProc makes the process publish one event at a time until the subscriber's first message arrives (the
// PUB/SUB slow-joiner race); it returns that message.
func joinProc(t *testing.T, p *procProducer, got <-chan zmsg) zmsg {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // a hang guard, not a performance bound
	for {
		p.pub(t, 1)
		select {
		case m := <-got:
			return m
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("subscriber never received a batch")
		}
	}
}

// decodeBatch decodes a message's vLLM batch.
func decodeBatch(t *testing.T, m zmsg) vllmwire.Batch {
	t.Helper()
	b, err := vllmwire.Decode(m.payload)
	if err != nil {
		t.Fatalf("seq %d: %v", m.seq, err)
	}
	return b
}

func isCleared(b vllmwire.Batch) bool {
	return len(b.Events) == 1 && b.Events[0].Kind == vllmwire.KindCleared
}

// replayFrom asks the replay socket for every batch from start and returns their seqs and batches (until the end
// marker).
func replayFrom(t *testing.T, rep string, start uint64) ([]uint64, []vllmwire.Batch) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(rep); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, start))); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var bs []vllmwire.Batch
	for {
		r, err := d.Recv()
		if err != nil || len(r.Frames) != 4 {
			t.Fatalf("replay: %v, %d frames", err, len(r.Frames))
		}
		seq := binary.BigEndian.Uint64(r.Frames[2])
		if seq == 1<<64-1 {
			return seqs, bs
		}
		b, err := vllmwire.Decode(r.Frames[3])
		if err != nil {
			t.Fatal(err)
		}
		seqs, bs = append(seqs, seq), append(bs, b)
	}
}

// TestEngineDeathAndRestart: an engine process publishing through kvshmd is SIGKILLed: a subscriber gets
// [AllBlocksCleared] with the next wire seq and the index holds none of its blocks. A restarted engine (a new ring
// epoch, its own seqs from 0 again) begins with a Cleared whose seq is above every earlier one, and a replay from 0
// yields only the new incarnation.
func TestEngineDeathAndRestart(t *testing.T) {
	ts := startServer(t, nil)
	dir := t.TempDir()
	ep, rep := "ipc://"+filepath.Join(dir, "pub.sock"), "ipc://"+filepath.Join(dir, "replay.sock")
	p1 := startProcProducer(t, ts.SocketPath(), filepath.Join(dir, "1.ring"), ep, rep, 5)
	got := goSub(t, ep)
	joinProc(t, p1, got)
	last := nextWire(t, ts, 21) - 1
	p1.pub(t, 3)
	for range 3 {
		m := nextBatch(t, got, last+1)
		if m.seq != last+1 || len(decodeBatch(t, m).Events) != 1 {
			t.Fatalf("live batch seq %d, want %d (the wire is kvshmd's: +1 per batch)", m.seq, last+1)
		}
		last = m.seq
	}
	if s := checkStats(t, ts.SocketPath(), 21, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == last }); s.ResidentBlocks == 0 {
		t.Fatalf("before the death: %+v, want the engine's blocks under wire seq %d", s, last)
	}

	_ = p1.cmd.Process.Kill() // not reaped yet: a zombie is gone too
	end := nextBatch(t, got, last+1)
	if end.seq != last+1 || !isCleared(decodeBatch(t, end)) {
		t.Fatalf("after the engine's death: seq %d %+v, want [AllBlocksCleared] at %d", end.seq, decodeBatch(t, end), last+1)
	}
	_ = p1.cmd.Wait()
	s := checkStats(t, ts.SocketPath(), 21, func(s sock.StreamStats) bool { return !s.ProducerAlive })
	if s.ResidentBlocks != 0 || s.LastEventID == nil || *s.LastEventID != end.seq {
		t.Fatalf("after the engine's death: %+v, want no block, the end Cleared at id %d", s, end.seq)
	}
	dump, err := dialT(t, ts.SocketPath()).Dump(ctxT(t), u64p(21))
	if err != nil || strings.Contains(string(dump), "block_hash") {
		t.Fatalf("dump after the engine's death: %s %v, want no block", dump, err)
	}

	startProcProducer(t, ts.SocketPath(), filepath.Join(dir, "2.ring"), ep, rep, 2) // seqs 0, 1 again
	start := nextBatch(t, got, end.seq+1)
	if !isCleared(decodeBatch(t, start)) {
		t.Fatalf("first batch of the new incarnation: seq %d %+v, want [AllBlocksCleared]", start.seq, decodeBatch(t, start))
	}
	for i := range uint64(2) {
		if m := nextBatch(t, got, start.seq+1); m.seq != start.seq+1+i {
			t.Fatalf("new incarnation's batch %d: seq %d, want %d", i, m.seq, start.seq+1+i)
		}
	}
	// A router that held the old incarnation asks from after what it saw.
	seqs, bs := replayFrom(t, rep, end.seq)
	if len(seqs) != 3 || seqs[0] != start.seq || !isCleared(bs[0]) {
		t.Fatalf("replay from %d: seqs %v, want only the new incarnation: its Cleared at %d and 2 batches", end.seq,
			seqs, start.seq)
	}
	// One that holds nothing (from 0) gets no Cleared: the reset batch is left out (and the reply is not filled:
	// seqs from 0 to above the clock in µs are far more than --zmq-replay-fill).
	if seqs, bs = replayFrom(t, rep, 0); len(seqs) != 2 || seqs[0] != start.seq+1 || isCleared(bs[0]) {
		t.Fatalf("replay from 0: seqs %v, want the new incarnation's 2 batches", seqs)
	}
}

// TestDaemonRestartWireSeqs: a new daemon on the same ring (nothing on disk) publishes above every seq the
// previous daemon published, and a daemon restart is not the end of the engine's incarnation (no Cleared).
func TestDaemonRestartWireSeqs(t *testing.T) {
	ts1 := startServer(t, nil)
	p := newProducer(t, ts1.SocketPath(), 3, 4, 1<<20)
	dir := t.TempDir()
	ep := "ipc://" + filepath.Join(dir, "pub.sock")
	cfg := &sock.Publish{Endpoint: ep, Topic: "t", HWM: 1000, BufferSteps: 10}
	attachPublishing(t, p, cfg)
	got := goSub(t, ep)
	next := joinProbes(t, p, 1, got)
	p.mustPublish(stored(next, 0, nil, []uint64{5}, tokens(1, 1, 4)))
	max1 := nextWire(t, ts1, 3) - 1
	ts1.stop(t)

	ts2 := startServer(t, nil)
	p.conn.Close()
	p.conn, p.socket = nil, ts2.SocketPath()
	rep := attachPublishing(t, p, cfg)
	if !rep.Resumed {
		t.Fatalf("attach to the new daemon: %+v, want resumed", rep)
	}
	got2 := goSub(t, ep)
	probe := stored(next+1, 0, nil, []uint64{6}, tokens(2, 1, 4))
	deadline := time.Now().Add(20 * time.Second)
	var m zmsg
	for m.frames == 0 {
		p.mustPublish(probe)
		probe.Seq++
		select {
		case m = <-got2:
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no batch from the new daemon")
		}
	}
	if m.seq <= max1 {
		t.Fatalf("the new daemon's first seq %d is not above the previous daemon's last %d", m.seq, max1)
	}
	if b := decodeBatch(t, m); isCleared(b) {
		t.Fatalf("the new daemon published a Cleared at %d: a daemon restart is not the end of an incarnation", m.seq)
	}
}

// TestHeartbeat: an idle publishing stream publishes an empty batch with the next wire seq every --zmq-heartbeat;
// the index does not log it.
func TestHeartbeat(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.ZMQHeartbeat = 20 * time.Millisecond })
	p := newRankProducer(t, ts.SocketPath(), 4, u32p(2), 4, 1<<20)
	dir := t.TempDir()
	ep := "ipc://" + filepath.Join(dir, "pub.sock")
	attachPublishing(t, p, &sock.Publish{Endpoint: ep, HWM: 1000, BufferSteps: 10})
	got := goSub(t, ep)
	var m zmsg
	deadline := time.Now().Add(20 * time.Second) // a hang guard
	for m.frames == 0 {                          // the heartbeats alone reach a subscriber that joins late
		select {
		case m = <-got:
		case <-time.After(time.Second):
		}
		if time.Now().After(deadline) {
			t.Fatal("an idle subscriber got no heartbeat")
		}
	}
	for range 2 {
		h := nextBatch(t, got, m.seq+1)
		if b := decodeBatch(t, h); h.seq != m.seq+1 || len(b.Events) != 0 || b.DpRank != 2 {
			t.Fatalf("heartbeat after seq %d: seq %d %+v, want seq %d, no event, dp_rank 2", m.seq, h.seq, b, m.seq+1)
		}
		m = h
	}
	ts.mu.Lock()
	st := ts.streams[keyOf(4, u32p(2))]
	ts.mu.Unlock()
	ix, _ := st.Current()
	if is := ix.Stats(); is.LastSeenID >= m.seq {
		t.Fatalf("the index logged a heartbeat: last id %d, heartbeat %d", is.LastSeenID, m.seq)
	}
}

// TestPrivateDaemonExit: when --parent-pid is gone, the daemon drains, publishes the end of every incarnation (a
// subscriber gets it: the sockets are flushed before they close) and removes --cleanup-dir. Also when the
// producer's connection broke first while its pid lived (a dying engine closes its descriptors before it is gone:
// its stream is detached and its pid watched, a watch the daemon's exit ends): make e2e's private rows caught it
// once the parent was watched through a pidfd, which sees the engine's exit before that watch does.
func TestPrivateDaemonExit(t *testing.T) {
	for _, broken := range []bool{false, true} {
		t.Run(fmt.Sprintf("connection_broken_first=%v", broken), func(t *testing.T) {
			parent := exec.Command("sleep", "60")
			if err := parent.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = parent.Process.Kill(); _ = parent.Wait() })
			private := filepath.Join(t.TempDir(), "private")
			if err := os.Mkdir(private, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(private, "daemon.log"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			token := writeToken(t, private)
			ts := startServer(t, func(c *Config) {
				c.ParentPID, c.ParentPoll, c.CleanupDir, c.CleanupToken = parent.Process.Pid, 10*time.Millisecond, private, token
			})
			p := newProducer(t, ts.SocketPath(), 6, 4, 1<<20)
			ep := "ipc://" + filepath.Join(t.TempDir(), "pub.sock")
			attachPublishing(t, p, &sock.Publish{Endpoint: ep, HWM: 1000, BufferSteps: 10})
			got := goSub(t, ep)
			next := joinProbes(t, p, 1, got)
			p.mustPublish(stored(next, 0, nil, []uint64{9}, tokens(1, 1, 4)))
			w := nextWire(t, ts, 6)
			if broken {
				p.conn.Close() // the producer (this process) lives: detached, its pid watched
				ts.mu.Lock()
				st := ts.streams[keyOf(6, nil)]
				ts.mu.Unlock()
				waitUntil(t, func() bool { _, a := st.Current(); return a == nil }, "the stream detached")
			}
			_ = parent.Process.Kill()
			_ = parent.Wait()
			select {
			case err := <-ts.done:
				if err != nil {
					t.Fatalf("Serve: %v", err)
				}
				ts.once.Do(func() {})
			case <-time.After(30 * time.Second):
				t.Fatal("the daemon did not exit after its parent")
			}
			if m := nextBatch(t, got, w); m.seq != w || !isCleared(decodeBatch(t, m)) {
				t.Fatalf("at the private daemon's exit: seq %d, want the end Cleared at %d", m.seq, w)
			}
			if _, err := os.Lstat(private); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("--cleanup-dir after exit: %v, want removed", err)
			}
		})
	}
}

// TestLossTranslation: on a publishing stream a LOSS record's engine seqs take wire seqs: a subscriber sees a gap
// of exactly that many seqs and the index reports exactly those ids lost; an engine seq gap without a LOSS record
// takes none.
func TestLossTranslation(t *testing.T) {
	ts := startServer(t, nil)
	p := newProducer(t, ts.SocketPath(), 4, 4, 1<<16)
	ep := "ipc://" + filepath.Join(t.TempDir(), "pub.sock")
	cfg := &sock.Publish{Endpoint: ep, HWM: 100000, BufferSteps: 10}
	attachPublishing(t, p, cfg)
	got := goSub(t, ep)
	joinProbes(t, p, 1, got)
	if err := p.conn.DetachStream(ctxT(t), sock.WorkerRequest{WorkerID: &p.worker}); err != nil { // nobody drains now
		t.Fatal(err)
	}
	endSeq := nextWire(t, ts, 4) - 1 // the end Cleared of the detached incarnation
	_, first, last := dropUntil(t, p, 100, 50)
	p.conn.Close()
	p.conn = nil
	attachPublishing(t, p, cfg)                                          // a new incarnation drains the ring: events 100..first-1, then the drops
	nextWire(t, ts, 4)                                                   // a barrier: the ring is drained (the header's pending loss is marked)
	p.mustPublish(stored(last+10, 0, nil, []uint64{7}, tokens(7, 1, 4))) // carries the LOSS record; +9: a plain gap
	start := nextBatch(t, got, endSeq+1)
	if !isCleared(decodeBatch(t, start)) {
		t.Fatalf("seq %d: want the new incarnation's Cleared", start.seq)
	}
	k := first - 100 // events that fit
	prev := start.seq
	for range k {
		m := nextBatch(t, got, prev+1)
		if m.seq != prev+1 {
			t.Fatalf("seq %d after %d: the events before the drops take consecutive seqs", m.seq, prev)
		}
		prev = m.seq
	}
	n := last - first + 1
	if m := nextBatch(t, got, prev+1); m.seq != prev+n+1 {
		t.Fatalf("after the drops: seq %d, want %d (a gap of exactly the %d lost batches)", m.seq, prev+n+1, n)
	}
	s := checkStats(t, ts.SocketPath(), 4, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == prev+n+1 })
	if s.LostEvents != n || len(s.LostRanges) != 1 || s.LostRanges[0].First != prev+1 || s.LostRanges[0].Last != prev+n {
		t.Fatalf("lost %d %+v, want exactly the wire seqs %d..%d", s.LostEvents, s.LostRanges, prev+1, prev+n)
	}
}

// TestKillRestartDefaultStateDir: kvshmd serve keeps checkpoints by default (a state directory beside a
// non-default socket, --checkpoint-interval 10s): a SIGKILLed daemon's successor answers complete.
func TestKillRestartDefaultStateDir(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kvshmd.sock")
	d1 := startDaemon(t, socket)
	p := newProducer(t, socket, 5, 4, 1<<20)
	for i := range uint64(10) {
		p.mustPublish(stored(i, 0, nil, []uint64{500 + i}, tokens(uint32(i*10), 1, 4)))
	}
	checkStats(t, socket, 5, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == 9 })
	fi, err := os.Stat(socket + ".state")
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("default state dir: %v %v, want a 0700 directory beside the socket", fi, err)
	}
	d1.kill() // SIGKILL
	for i := uint64(10); i < 20; i++ {
		p.mustPublish(stored(i, 0, nil, []uint64{500 + i}, tokens(uint32(i*10), 1, 4)))
	}
	startDaemon(t, socket)
	p.attach()
	st := checkStats(t, socket, 5, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == 19 })
	if st.Tainted || st.Incomplete || st.ResidentBlocks != 20 {
		t.Fatalf("after a SIGKILL with the default state dir: %+v, want complete with 20 blocks", st)
	}
}

// TestWireSeqRule: each incarnation starts at max(last wire seq + 1, the clock in µs) (the clock injected).
func TestWireSeqRule(t *testing.T) {
	var clock atomic.Int64
	clock.Store(5_000_000)
	ts := startServer(t, func(c *Config) { c.Clock = func() time.Time { return time.UnixMicro(clock.Load()) } })
	p := newProducer(t, ts.SocketPath(), 8, 4, 1<<20)
	cfg := &sock.Publish{Endpoint: "ipc://" + filepath.Join(t.TempDir(), "pub.sock"), HWM: 10, BufferSteps: 10}
	wire := func() uint64 {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return ts.streams[keyOf(8, nil)].WireSeq()
	}
	cases := []struct {
		name  string
		clock int64
		want  uint64 // the start Cleared's seq (after the previous incarnation's end Cleared)
	}{
		{"first incarnation: the clock", 5_000_000, 5_000_000},
		{"clock behind the last seq: last + 1 (after the end Cleared)", 4_000_000, 5_000_002},
		{"clock ahead: the clock", 9_000_000, 9_000_000},
	}
	for _, c := range cases {
		clock.Store(c.clock)
		attachPublishing(t, p, cfg) // DETACH ends the previous incarnation, the attach begins one
		if got := wire(); got != c.want {
			t.Errorf("%s: start Cleared at %d, want %d", c.name, got, c.want)
		}
	}
}

// TestWireSeqZero: with ZMQSeqZero the clock is ignored: the first incarnation's Cleared takes seq 1, each later
// one continues after the previous incarnation's end Cleared.
func TestWireSeqZero(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.ZMQSeqZero = true
		c.Clock = func() time.Time { return time.UnixMicro(5_000_000) }
	})
	p := newProducer(t, ts.SocketPath(), 8, 4, 1<<20)
	cfg := &sock.Publish{Endpoint: "ipc://" + filepath.Join(t.TempDir(), "pub.sock"), HWM: 10, BufferSteps: 10}
	for i, want := range []uint64{1, 3, 5} {
		attachPublishing(t, p, cfg) // DETACH ends the previous incarnation (its Cleared), the attach begins one
		ts.mu.Lock()
		got := ts.streams[keyOf(8, nil)].WireSeq()
		ts.mu.Unlock()
		if got != want {
			t.Errorf("incarnation %d: start Cleared at %d, want %d", i+1, got, want)
		}
	}
}
