package daemon

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/internal/wirevectors"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/vllmwire"
)

// ---- the shared vllmwire vectors, as BATCH records ---------------------------------------------------------

// publishableVectors returns the shared vllmwire vectors (internal/wirevectors) a producer can send through the
// ring: at least one event (an empty BATCH is malformed), a dp_rank (the daemon always has one) and a ts (0 is
// "unknown": the daemon stamps it). wire picks the release's file ("": 0.33).
func publishableVectors(t testing.TB, wire ...string) []wirevectors.Vector {
	t.Helper()
	file := wirevectors.Files["0.33"]
	if len(wire) > 0 && wire[0] != "" {
		file = wirevectors.Files[wire[0]]
	}
	vs, err := wirevectors.Load("../testdata/vllmwire/"+file, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []wirevectors.Vector
	for _, v := range vs {
		if len(v.Events) > 0 && v.DpRank != nil && v.TS != 0 {
			out = append(out, v)
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d publishable vectors", len(out))
	}
	return out
}

// vectorSubs builds the BATCH sub-records of a vector for a stream of kv_block_size bs: each event's FlatBuffer,
// preceded by the Meta carrying what vLLM sends and the index does not need.
func vectorSubs(t testing.TB, v wirevectors.Vector, seq uint64, bs uint32) []shm.Sub {
	t.Helper()
	b := flatbuffers.NewBuilder(1024)
	var subs []shm.Sub
	for _, e := range v.Events {
		spec := fbs.EventSpec{Seq: seq, DpRank: uint32(*v.DpRank), BlockHashes: e.BlockHashes, TokenIDs: e.TokenIDs, IsEagle: e.IsEagle}
		var m fbs.MetaSpec
		switch e.Kind {
		case "stored":
			spec.Kind = fbs.KindStored
			if e.Parent != nil {
				spec.HasParent, spec.ParentHash = true, *e.Parent
			}
			if e.LoraName != nil {
				spec.LoraName = *e.LoraName
			}
			if e.BlockSize != bs {
				m.HasBlockSize, m.BlockSize = true, e.BlockSize
			}
			if e.LoraID != nil {
				m.HasLoraID, m.LoraID = true, *e.LoraID
			}
			if e.SpecKind != nil {
				m.HasKind, m.Kind = true, *e.SpecKind
			}
			if e.Window != nil {
				m.HasSlidingWindow, m.SlidingWindow = true, *e.Window
			}
			x, err := e.ExtraKeys()
			if err != nil {
				t.Fatal(err)
			}
			m.ExtraKeys = x
			if e.CacheSalt != nil {
				m.HasCacheSalt, m.CacheSalt = true, *e.CacheSalt
			}
			if e.SessionID != nil {
				m.HasSessionID, m.SessionID = true, *e.SessionID
			}
		case "removed":
			spec.Kind = fbs.KindRemoved
		case "cleared":
			spec.Kind = fbs.KindCleared
		}
		if e.Medium != nil {
			m.HasMedium, m.Medium = true, *e.Medium
		}
		if e.GroupIdx != nil {
			m.HasGroupIdx, m.GroupIdx = true, *e.GroupIdx
		}
		var err error
		if m.HashBytes, err = e.HashBytes(); err != nil {
			t.Fatal(err)
		}
		if m.ParentBytes, err = e.ParentBytes(); err != nil {
			t.Fatal(err)
		}
		if spec.Kind != fbs.KindCleared {
			subs = append(subs, shm.Sub{Type: shm.SubMeta, Payload: append([]byte(nil), fbs.BuildMeta(b, &m)...)})
		}
		subs = append(subs, shm.Sub{Type: shm.SubEvent, Payload: append([]byte(nil), fbs.Build(b, &spec)...)})
	}
	return subs
}

// attachPublishing re-attaches p (a new connection) asking for ZMQ publishing.
func attachPublishing(t testing.TB, p *producer, pub *sock.Publish) sock.AttachReply {
	t.Helper()
	if p.conn != nil {
		// DETACH on the lease: the attachment ends (final drain) before the reply, so the new ATTACH is a
		// re-attach, not a conflict with an attachment whose connection close is not seen yet.
		if err := p.conn.DetachStream(ctxT(t), sock.WorkerRequest{WorkerID: &p.worker, DpRank: p.rank}); err != nil {
			t.Fatalf("detach: %v", err)
		}
		p.conn.Close()
	}
	c, err := sock.Dial(ctxT(t), p.socket)
	if err != nil {
		t.Fatal(err)
	}
	p.conn = c
	t.Cleanup(func() { c.Close() })
	rep, err := c.Attach(ctxT(t), sock.AttachRequest{RingPath: p.path, WorkerID: p.worker, KVBlockSize: p.bs,
		MaxBufferSize: p.maxBuf, DpRank: p.rank, Publish: pub})
	if err != nil {
		t.Fatalf("attach with publish: %v", err)
	}
	if !rep.Batches || rep.Publishing != (pub != nil) {
		t.Fatalf("attach reply %+v: want batches, publishing %v", rep, pub != nil)
	}
	p.rep = rep
	return rep
}

func writeBatch(t testing.TB, p *producer, ts float64, subs []shm.Sub) {
	t.Helper()
	ok, err := p.w.WriteBatch(ts, subs)
	if err != nil || !ok {
		t.Fatalf("WriteBatch: %v, %v", ok, err)
	}
}

// ---- subscribers ------------------------------------------------------------------------------------------------

// zmsg is one message a subscriber received.
type zmsg struct {
	frames  int
	topic   string
	seq     uint64
	payload []byte
}

// joinProbes publishes one-event batches (Cleared at seq probe, probe+1, ...) until the subscriber's first
// message arrives, so that the batches under test are not lost to the PUB/SUB slow-joiner race. It returns the
// next probe seq.
func joinProbes(t testing.TB, p *producer, probe uint64, got <-chan zmsg) uint64 {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second) // a hang guard, not a performance bound
	for {
		p.mustPublish(cleared(probe))
		probe++
		select {
		case <-got:
			return probe
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("subscriber never received a probe")
		}
	}
}

// nextWire returns the wire seq the worker's ALL stream gives its next batch (docs/lifecycle.md: kvshmd numbers the
// wire, +1 per published batch), once everything published before the call is applied (STATS is a
// read-your-writes barrier).
func nextWire(t testing.TB, ts *testServer, worker uint64) uint64 {
	t.Helper()
	if _, err := dialT(t, ts.cfg.SocketPath).Stats(ctxT(t), &worker); err != nil {
		t.Fatal(err)
	}
	ts.mu.Lock()
	st := ts.streams[keyOf(worker, nil)]
	ts.mu.Unlock()
	return st.WireSeq() + 1
}

// nextBatch returns the next message with seq >= min (probes below it are skipped).
func nextBatch(t testing.TB, got <-chan zmsg, min uint64) zmsg {
	t.Helper()
	for {
		select {
		case m, ok := <-got:
			if !ok {
				t.Fatal("subscriber ended")
			}
			if m.seq >= min {
				return m
			}
		case <-time.After(20 * time.Second): // a hang guard, not a performance bound
			t.Fatal("no message within 20s")
		}
	}
}

// goSub is a zmq4 (pure Go) SUB delivering messages on a channel.
func goSub(t testing.TB, ep string) <-chan zmsg {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { cancel(); _ = sub.Close() })
	if err := sub.Dial(ep); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	ch := make(chan zmsg, 1024)
	go func() {
		defer close(ch)
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			z := zmsg{frames: len(m.Frames)}
			if len(m.Frames) == 3 {
				z.topic, z.seq, z.payload = string(m.Frames[0]), binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]
			}
			ch <- z
		}
	}()
	return ch
}

// ---- tests ------------------------------------------------------------------------------------------------------

// sendVectors writes each vector as one BATCH record (seqs from 1000) and checks that sub receives its payload
// byte for byte, in order, under topic.
func sendVectors(t *testing.T, p *producer, sub <-chan zmsg, vecs []wirevectors.Vector, topic string, base uint64) {
	t.Helper()
	for i, v := range vecs {
		writeBatch(t, p, v.TS, vectorSubs(t, v, 1000+uint64(i), 4))
	}
	for i, v := range vecs {
		m := nextBatch(t, sub, base)
		if m.frames != 3 || m.topic != topic || m.seq != base+uint64(i) {
			t.Fatalf("%s: message %d frames, topic %q, seq %d; want 3, %s, %d", v.Name, m.frames, m.topic, m.seq, topic, base+uint64(i))
		}
		if hex.EncodeToString(m.payload) != v.PayloadHex {
			t.Fatalf("%s: payload differs from msgspec's:\n got %x\nwant %s", v.Name, m.payload, v.PayloadHex)
		}
	}
}

// TestZmqPublishWire: a producer asking for vLLM 0.32.0's layout (sock.Publish.Wire "0.32"), or 0.31.0's (the same
// layout under its own name), gets every shared vector of that release byte for byte (BlockStored's fixmap header);
// re-attaching with the default switches back to 0.33.0's on the same publisher; an unknown release is a
// bad_request that names the known ones.
func TestZmqPublishWire(t *testing.T) {
	for _, rel := range []string{"0.32", "0.31"} {
		t.Run(rel, func(t *testing.T) { testZmqPublishWire(t, rel) })
	}
}

func testZmqPublishWire(t *testing.T, rel string) {
	ts := startServer(t, nil)
	p := newProducer(t, ts.cfg.SocketPath, 7, 4, 1<<22)
	ep := "ipc://" + filepath.Join(t.TempDir(), "pub.sock")
	attachPublishing(t, p, &sock.Publish{Endpoint: ep, Topic: "kv", HWM: 1000, BufferSteps: 10, Wire: rel})
	got := goSub(t, ep)
	joinProbes(t, p, 1, got)
	sendVectors(t, p, got, publishableVectors(t, rel), "kv", nextWire(t, ts, 7))

	c, err := sock.Dial(ctxT(t), ts.cfg.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := sock.AttachRequest{WorkerID: 8, RingPath: p.path, KVBlockSize: 4,
		Publish: &sock.Publish{Endpoint: ep + "x", Topic: "kv", Wire: "0.30"}}
	var se *sock.RemoteError
	if _, err := c.Attach(ctxT(t), req); !errors.As(err, &se) || se.Code != sock.CodeBadRequest ||
		!strings.Contains(se.Message, `"0.30"`) || !strings.Contains(se.Message, `"0.31"`) {
		t.Fatalf("attach with wire 0.30: %v, want bad_request naming 0.30 and the known releases", err)
	}
}

// TestZmqPublishSGLang: a producer asking for SGLang's wire (sock.Publish.Wire "sglang") gets every SGLang vector
// byte for byte, as SGLang 0.5.23's own structs encode it: signed int64 hashes from the ring's u64 keys, SGLang's
// BlockStored with cache_salt and session_id from the META.
func TestZmqPublishSGLang(t *testing.T) {
	ts := startServer(t, nil)
	p := newProducer(t, ts.cfg.SocketPath, 7, 4, 1<<22)
	ep := "ipc://" + filepath.Join(t.TempDir(), "pub.sock")
	attachPublishing(t, p, &sock.Publish{Endpoint: ep, Topic: "kv", HWM: 1000, BufferSteps: 10, Wire: "sglang"})
	got := goSub(t, ep)
	joinProbes(t, p, 1, got)
	sendVectors(t, p, got, publishableVectors(t, "sglang"), "kv", nextWire(t, ts, 7))
}

// TestZmqPublishVectors (pure Go peers): every shared vector, written as one BATCH record, reaches a zmq4 SUB as
// [topic, seq, payload] with the payload byte-identical to msgspec's; EVENT records go out as one-event batches;
// what the device-tree filter excludes is counted and not indexed; a malformed batch is counted and not published; STATS and
// the replay socket answer.
func TestZmqPublishVectors(t *testing.T) {
	ts := startServer(t, nil)
	p := newProducer(t, ts.cfg.SocketPath, 7, 4, 1<<22)
	dir := t.TempDir()
	ep, rep := "ipc://"+filepath.Join(dir, "pub.sock"), "ipc://"+filepath.Join(dir, "replay.sock")
	attachPublishing(t, p, &sock.Publish{Endpoint: ep, ReplayEndpoint: &rep, Topic: "kv@7", HWM: 1000, BufferSteps: 100})
	got := goSub(t, ep)
	joinProbes(t, p, 1, got)

	// The engine's seqs (1000+i) are not the wire's: kvshmd numbers its batches, +1 each.
	base := nextWire(t, ts, 7)
	vecs := publishableVectors(t)
	sendVectors(t, p, got, vecs, "kv@7", base)

	// A single EVENT record: a one-event batch, medium GPU, lora_id None, block_size the stream's.
	p.mustPublish(stored(2000, 1, nil, []uint64{11, 12}, tokens(1, 2, 4)))
	evWire := base + uint64(len(vecs))
	m := nextBatch(t, got, evWire)
	b, err := vllmwire.Decode(m.payload)
	if err != nil {
		t.Fatal(err)
	}
	want := vllmwire.Event{Kind: vllmwire.KindStored, BlockHashes: []uint64{11, 12}, TokenIDs: tokens(1, 2, 4), BlockSize: 4,
		HasMedium: true, Medium: "GPU"}
	if m.seq != evWire || len(b.Events) != 1 || b.DpRank != 1 || fmt.Sprint(b.Events[0]) != fmt.Sprint(want) {
		t.Fatalf("one-event batch: seq %d, %+v; want seq %d, dp_rank 1, %+v", m.seq, b, evWire, want)
	}

	// A malformed batch (two events with different seqs): counted, skipped, not published; the next one is.
	bad := vectorSubs(t, vecs[0], 3000, 4)
	bad = append(bad, vectorSubs(t, vecs[0], 3001, 4)...)
	writeBatch(t, p, 1, bad)
	writeBatch(t, p, 1, vectorSubs(t, vecs[0], 3002, 4))
	if m := nextBatch(t, got, evWire+1); m.seq != evWire+1 {
		t.Fatalf("after a malformed batch (which takes no wire seq): seq %d, want %d", m.seq, evWire+1)
	}

	st, err := dialT(t, ts.cfg.SocketPath).Stats(ctxT(t), u64p(7))
	if err != nil {
		t.Fatal(err)
	}
	s := st.Streams[0]
	if s.MalformedEvents != 1 || s.Zmq == nil || s.Zmq.Endpoint != ep || s.Zmq.ReplayEndpoint == nil || *s.Zmq.ReplayEndpoint != rep {
		t.Fatalf("stats %+v (zmq %+v): want 1 malformed, the endpoints", s, s.Zmq)
	}
	if s.EventsNotIndexed == 0 {
		t.Fatalf("stats: no event counted as not indexed, but vectors carry CPU media and sliding-window groups")
	}

	// /metrics: the ZMQ and filter series, promtool-clean.
	_, _, metrics := handlerGet(ts.Handler())("/metrics")
	for _, want := range []string{
		`kvshm_zmq_published_batches_total{dp_rank="",worker_id="7"}`,
		`kvshm_zmq_dropped_batches_total{dp_rank="",reason="queue_full",worker_id="7"} 0`,
		`kvshm_zmq_replay_requests_total{dp_rank="",worker_id="7"} 0`,
		`kvshm_zmq_replayed_batches_total{dp_rank="",worker_id="7"} 0`,
		`kvshm_events_not_indexed_total{dp_rank="",reason="medium",worker_id="7"}`,
		`kvshm_events_not_indexed_total{dp_rank="",reason="kv_cache_spec_kind",worker_id="7"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	promtool(t, []byte(metrics))

	// Replay from the first vector's seq: every vector batch (and the later ones), then the end marker.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithID(zmq4.SocketIdentity("replayer")))
	defer d.Close()
	if err := d.Dial(rep); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, base))); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		r, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Frames) != 4 {
			t.Fatalf("replay message %d: %d frames, want 4 (\"\", topic, seq, payload)", i, len(r.Frames))
		}
		seq := binary.BigEndian.Uint64(r.Frames[2])
		if seq == 1<<64-1 {
			if i != len(vecs)+2 {
				t.Fatalf("replay: %d batches before the end marker, want %d", i, len(vecs)+2)
			}
			break
		}
		if i < len(vecs) && (seq != base+uint64(i) || hex.EncodeToString(r.Frames[3]) != vecs[i].PayloadHex) {
			t.Fatalf("replay message %d: seq %d, payload %x; want %d and the vector's", i, seq, r.Frames[3], base+uint64(i))
		}
	}

	// A malformed request (a 9-byte seq) gets no answer, and is counted in STATS and /metrics.
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, make([]byte, 9))); err != nil {
		t.Fatal(err)
	}
	c := dialT(t, ts.cfg.SocketPath)
	deadline := time.Now().Add(30 * time.Second) // a liveness bound: the ROUTER reads the request asynchronously
	for {
		st, err := c.Stats(ctxT(t), u64p(7))
		if err != nil {
			t.Fatal(err)
		}
		if z := st.Streams[0].Zmq; z != nil && z.BadReplayRequests == 1 && z.ReplayRequests == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("STATS zmq after a malformed replay request: %+v", st.Streams[0].Zmq)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m := scrape(t, ts.Server); !strings.Contains(m, `kvshm_zmq_bad_replay_requests_total{dp_rank="",worker_id="7"} 1`) {
		t.Fatalf("/metrics lacks the bad replay request:\n%s", m)
	}
}

// TestZmqPublisherLifecycle: the publisher survives a re-attach with the same config (a subscriber stays
// connected), rebinds on another config, stops on a re-attach without publish; a bind failure is a bad_request
// naming the endpoint.
func TestZmqPublisherLifecycle(t *testing.T) {
	ts := startServer(t, nil)
	p := newProducer(t, ts.cfg.SocketPath, 3, 4, 1<<20)
	dir := t.TempDir()
	ep := "ipc://" + filepath.Join(dir, "a.sock")
	cfg := &sock.Publish{Endpoint: ep, Topic: "t", HWM: 10, BufferSteps: 10}
	attachPublishing(t, p, cfg)
	got := goSub(t, ep)
	next := joinProbes(t, p, 1, got)
	st := ts.streams[keyOf(3, nil)]
	first := st.Publisher()
	checkIdle := func(every time.Duration) {
		t.Helper()
		_, a := st.Current()
		if a == nil {
			t.Fatal("no attachment")
		}
		if a.Every() != every { // set at construction, never changed
			t.Fatalf("attachment's idle housekeeping (lost-doorbell bound) every %v, want %v", a.Every(), every)
		}
	}
	// A publishing stream's lost doorbell costs its subscribers at most stream.PublishIdleEvery.
	checkIdle(stream.PublishIdleEvery)
	attachPublishing(t, p, cfg) // same config: same publisher, the subscriber keeps receiving
	if st.Publisher() != first {
		t.Fatal("re-attach with the same publish config replaced the publisher")
	}
	// DETACH ended the incarnation and the re-attach began a new one: a Cleared each, then the next batch.
	w := nextWire(t, ts, 3)
	p.mustPublish(cleared(next + 100))
	if m := nextBatch(t, got, w); m.seq != w {
		t.Fatalf("after re-attach: seq %d, want %d", m.seq, w)
	}
	cfg2 := *cfg
	cfg2.Topic = "u"
	attachPublishing(t, p, &cfg2) // another config: a new publisher on the same endpoint
	if st.Publisher() == first || st.Publisher().Config().Topic != "u" {
		t.Fatal("re-attach with another config kept the old publisher")
	}
	attachPublishing(t, p, nil)
	if st.Publisher() != nil {
		t.Fatal("re-attach without publish kept a publisher")
	}
	checkIdle(stream.IdleEvery)
	if _, err := os.Stat(filepath.Join(dir, "a.sock")); !os.IsNotExist(err) {
		t.Fatalf("ipc socket file after the publisher closed: %v", err)
	}

	// A bind failure: the endpoint is a path in a missing directory.
	c := dialT(t, ts.cfg.SocketPath)
	if err := p.conn.DetachStream(ctxT(t), sock.WorkerRequest{WorkerID: &p.worker}); err != nil {
		t.Fatal(err)
	}
	bad := "ipc://" + filepath.Join(dir, "missing", "x.sock")
	_, err := c.Attach(ctxT(t), sock.AttachRequest{RingPath: p.path, WorkerID: 3, KVBlockSize: 4, MaxBufferSize: p.maxBuf,
		Publish: &sock.Publish{Endpoint: bad}})
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), sock.CodeBadRequest) {
		t.Fatalf("attach with an unbindable endpoint: %v, want bad_request naming %s", err, bad)
	}
	for _, e := range []string{"inproc://x", "tcp://"} {
		_, err := c.Attach(ctxT(t), sock.AttachRequest{RingPath: p.path, WorkerID: 3, KVBlockSize: 4, MaxBufferSize: p.maxBuf,
			Publish: &sock.Publish{Endpoint: e}})
		if err == nil || !strings.Contains(err.Error(), sock.CodeBadRequest) {
			t.Fatalf("attach with endpoint %q: %v, want bad_request", e, err)
		}
	}
}

// ---- libzmq peers (pyzmq) ---------------------------------------------------------------------------------------

// pyPeer runs daemon/testdata/zmqpeer.py with the dev venv's Python (pyzmq, libzmq).
type pyPeer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan map[string]any
}

func venvPython(t testing.TB) string {
	t.Helper()
	return testenv.VenvPython(t, "../.venv/bin/python", "zmq, msgspec")
}

func startPeer(t testing.TB, args ...string) *pyPeer {
	t.Helper()
	cmd := exec.Command(venvPython(t), append([]string{"testdata/zmqpeer.py"}, args...)...)
	in, out := startPiped(t, cmd)
	p := &pyPeer{cmd: cmd, stdin: in, lines: make(chan map[string]any, 4096)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<26)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.lines <- m
			}
		}
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

func (p *pyPeer) stop() {
	_ = p.stdin.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (p *pyPeer) line(t testing.TB) map[string]any {
	t.Helper()
	select {
	case m, ok := <-p.lines:
		if !ok {
			t.Fatal("python peer ended")
		}
		return m
	case <-time.After(20 * time.Second): // a hang guard, not a performance bound
		t.Fatal("python peer: no line within 20s")
	}
	return nil
}

// subMessages turns a "sub" peer's lines into messages.
func (p *pyPeer) subMessages(t testing.TB) <-chan zmsg {
	if m := p.line(t); m["ready"] != true {
		t.Fatalf("python sub: %v, want ready", m)
	}
	ch := make(chan zmsg, 4096)
	go func() {
		defer close(ch)
		for m := range p.lines {
			topic, _ := hex.DecodeString(m["topic"].(string))
			payload, _ := hex.DecodeString(m["payload"].(string))
			ch <- zmsg{frames: int(m["frames"].(float64)), topic: string(topic), seq: uint64(m["seq"].(float64)), payload: payload}
		}
	}()
	return ch
}

// TestZmqPyzmq: libzmq peers against the daemon's publisher. A pyzmq SUB gets every batch byte-identical to
// msgspec's encoding; a pyzmq DEALER replays from a start seq and gets the end marker; a late subscriber gets
// what is published after it joined (and replay gives it the rest); a subscriber that never reads does not slow
// ingest: every event still reaches the index and the ring drains.
// stuckIngestGuard bounds TestZmqPyzmq's wait for the drain to apply 6,000 batches behind a stuck subscriber.
const stuckIngestGuard = 10 * time.Minute

func TestZmqPyzmq(t *testing.T) {
	venvPython(t)
	// The catch-up wait below is a hang guard, not a timing: the query may wait as long as the client does.
	ts := startServer(t, func(c *Config) { c.QueryTimeout = stuckIngestGuard })
	p := newProducer(t, ts.cfg.SocketPath, 9, 4, 1<<26)
	dir := t.TempDir()
	ep, rep := "ipc://"+filepath.Join(dir, "pub.sock"), "ipc://"+filepath.Join(dir, "replay.sock")
	attachPublishing(t, p, &sock.Publish{Endpoint: ep, ReplayEndpoint: &rep, Topic: "", HWM: 100000, BufferSteps: 10000})

	early := startPeer(t, "sub", ep).subMessages(t)
	probe := joinProbes(t, p, 1, early)
	base := nextWire(t, ts, 9) // the wire seq of the first vector (kvshmd numbers the wire, +1 per batch)
	vecs := publishableVectors(t)
	for i, v := range vecs {
		writeBatch(t, p, v.TS, vectorSubs(t, v, 1000+uint64(i), 4))
	}
	for i, v := range vecs {
		m := nextBatch(t, early, base)
		if m.frames != 3 || m.topic != "" || m.seq != base+uint64(i) || hex.EncodeToString(m.payload) != v.PayloadHex {
			t.Fatalf("%s: pyzmq SUB got %d frames, topic %q, seq %d, payload %x; want 3, \"\", %d, msgspec's %s",
				v.Name, m.frames, m.topic, m.seq, m.payload, base+uint64(i), v.PayloadHex)
		}
	}

	// Replay from the second vector's seq through a pyzmq DEALER: vLLM's frames, then the end marker.
	r := startPeer(t, "replay", rep, fmt.Sprint(base+1))
	for i := 1; ; i++ {
		fr := r.line(t)["frames"].([]any)
		if len(fr) != 4 || fr[0] != "" {
			t.Fatalf("replay reply %v: want [\"\", topic, seq, payload]", fr)
		}
		if fr[2] == "ffffffffffffffff" {
			if fr[1] != "" || fr[3] != "" || i != len(vecs) {
				t.Fatalf("end marker %v after %d batches, want [\"\", \"\", -1, \"\"] after %d", fr, i-1, len(vecs)-1)
			}
			break
		}
		if fr[2] != fmt.Sprintf("%016x", base+uint64(i)) || fr[3] != vecs[i].PayloadHex {
			t.Fatalf("replay reply %d: seq %v, want %016x and the vector's payload", i, fr[2], base+uint64(i))
		}
	}

	// A late subscriber: it gets what comes after it joined, byte-identical too.
	late := startPeer(t, "sub", ep).subMessages(t)
	joinProbes(t, p, probe+100, late)
	w := nextWire(t, ts, 9)
	writeBatch(t, p, vecs[3].TS, vectorSubs(t, vecs[3], 5000, 4))
	if m := nextBatch(t, late, w); m.seq != w || hex.EncodeToString(m.payload) != vecs[3].PayloadHex {
		t.Fatalf("late subscriber: seq %d payload %x", m.seq, m.payload)
	}

	// A subscriber that never reads: ingest goes on (the drain goroutine never waits for a subscriber; zmqpub
	// cuts a subscriber whose writes stay blocked for its stall timeout, zmqpub/doc.go).
	stuck := startPeer(t, "stuck", ep)
	if m := stuck.line(t); m["ready"] != true {
		t.Fatalf("stuck peer: %v", m)
	}
	// Make sure its connection is up: a fresh subscriber that joins after it gets a probe.
	after := startPeer(t, "sub", ep).subMessages(t)
	joinProbes(t, p, probe+200, after)
	c := dialT(t, ts.cfg.SocketPath)
	before, err := c.Stats(ctxT(t), u64p(9))
	if err != nil {
		t.Fatal(err)
	}
	const n = 6000 // ~11 MB of payload: far beyond the socket buffers of the stuck subscriber
	hashes := make([]uint64, 64)
	for i := range n {
		for j := range hashes {
			hashes[j] = uint64(i)<<8 | uint64(j)
		}
		b := flatbuffers.NewBuilder(4096)
		ev := stored(10000+uint64(i), 0, nil, hashes, tokens(uint32(i), 64, 4))
		if i%100 == 99 {
			ev = cleared(10000 + uint64(i)) // keeps the tree small (the invariants build checks it after every event)
		}
		writeBatch(t, p, 1, []shm.Sub{{Type: shm.SubEvent, Payload: fbs.Build(b, &ev)}})
	}
	// Waits until the drain has applied everything written. The deadline only guards against a hang: under -race
	// with the whole suite on 2 vCPUs the 6,000 stores can take tens of seconds (seen once past 30 s), as arm64
	// binaries under qemu-user on a loaded machine they took more than 2 minutes.
	ctx, cancel := context.WithTimeout(context.Background(), stuckIngestGuard)
	defer cancel()
	st, err := c.Stats(ctx, u64p(9))
	if err != nil {
		t.Fatal(err)
	}
	s, s0 := st.Streams[0], before.Streams[0]
	if s.EventsReceived-s0.EventsReceived != n || s.RingUsedBytes != 0 {
		t.Fatalf("with a stuck subscriber: %d events ingested, ring used %d; want %d, 0", s.EventsReceived-s0.EventsReceived, s.RingUsedBytes, n)
	}
	if handed := (s.Zmq.Published + s.Zmq.Dropped) - (s0.Zmq.Published + s0.Zmq.Dropped); handed > n {
		t.Fatalf("%d batches published or dropped for %d offered", handed, n)
	}
	t.Logf("with a stuck subscriber: %d batches ingested; zmq published %d, dropped %d (queue_full)", n,
		s.Zmq.Published-s0.Zmq.Published, s.Zmq.Dropped-s0.Zmq.Dropped)
}

// TestBatchIndexing: a BATCH's indexable events are applied under its one id (BeginBatch: no id reset, EVENTS
// returns all of them), the excluded ones are counted by reason and left out of the index; a batch of which
// nothing is indexed leaves an id gap. No publisher is needed for any of it.
func TestBatchIndexing(t *testing.T) {
	ts := startServer(t, nil)
	p := newProducer(t, ts.cfg.SocketPath, 5, 2, 1<<20)
	b := flatbuffers.NewBuilder(1024)
	sub := func(ev fbs.EventSpec) shm.Sub {
		return shm.Sub{Type: shm.SubEvent, Payload: append([]byte(nil), fbs.Build(b, &ev)...)}
	}
	meta := func(m fbs.MetaSpec) shm.Sub {
		return shm.Sub{Type: shm.SubMeta, Payload: append([]byte(nil), fbs.BuildMeta(b, &m)...)}
	}
	writeBatch(t, p, 1, []shm.Sub{sub(cleared(1))})
	writeBatch(t, p, 2, []shm.Sub{
		sub(stored(2, 0, nil, []uint64{100}, tokens(1, 1, 2))),
		meta(fbs.MetaSpec{HasMedium: true, Medium: "CPU"}), // offloaded copy: published, not indexed
		sub(stored(2, 0, nil, []uint64{900}, tokens(1, 1, 2))),
		sub(stored(2, 0, u64p(100), []uint64{101}, tokens(3, 1, 2))),
		meta(fbs.MetaSpec{HasGroupIdx: true, GroupIdx: 1, HasKind: true, Kind: "sliding_window"}),
		sub(stored(2, 0, nil, []uint64{700}, tokens(1, 1, 2))),
	})
	writeBatch(t, p, 3, []shm.Sub{ // nothing indexable: an id gap
		meta(fbs.MetaSpec{HasBlockSize: true, BlockSize: 16}),
		sub(stored(3, 0, nil, []uint64{500}, tokens(1, 1, 16))),
	})
	writeBatch(t, p, 4, []shm.Sub{sub(removed(4, 0, 101))})
	c := dialT(t, ts.cfg.SocketPath)
	body, err := c.Events(ctxT(t), u64p(5), u64p(2), u64p(4))
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Events struct {
			Events []struct {
				Event struct {
					ID   uint64          `json:"event_id"`
					Data json.RawMessage `json:"data"`
				} `json:"event"`
			} `json:"events"`
		} `json:"Events"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("events answer %s: %v", body, err)
	}
	var ids []uint64
	for _, e := range resp.Events.Events {
		ids = append(ids, e.Event.ID)
	}
	if fmt.Sprint(ids) != "[2 2 4]" {
		t.Fatalf("events 2..4: ids %v, want [2 2 4] (two indexed events of batch 2, none of 3): %s", ids, body)
	}
	st, err := c.Stats(ctxT(t), u64p(5))
	if err != nil {
		t.Fatal(err)
	}
	s := st.Streams[0]
	if s.IDResets != 0 || s.EventsNotIndexed != 3 || s.EventsReceived != 7 || s.Zmq != nil {
		t.Fatalf("stats: id_resets %d, events_not_indexed %d, events_received %d, zmq %v; want 0, 3, 7, nil",
			s.IDResets, s.EventsNotIndexed, s.EventsReceived, s.Zmq)
	}
	for i, want := range []uint64{1, 1, 0, 1} { // CPU medium, sliding_window kind, -, block_size 16
		if got := ts.streams[keyOf(5, nil)].Status().NotIndexed[i]; got != want {
			t.Errorf("not indexed %s: %d, want %d", stream.NotIndexedLabels[i], got, want)
		}
	}
}
