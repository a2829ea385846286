package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// cycleWorkers is how many worker ids TestCycleWorkersFlat cycles: a few hundred in make test (the bound is
// reached after MaxDeadStreams of them, so every later cycle repeats the steady state), 10,000 for the full proof:
// go test ./daemon -run TestCycleWorkersFlat -cycle-workers 10000 (soak/sc_cycle.py runs it on a real kvshmd).
var cycleWorkers = flag.Int("cycle-workers", 300, "worker ids TestCycleWorkersFlat cycles")

func streamOf(ts *testServer, worker uint64) *entry {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.streams[keyOf(worker, nil)]
}

// advance moves the reaper's clock forward by d and sweeps.
func advance(ts *testServer, d time.Duration) {
	ts.monoSkew.Add(int64(d))
	ts.reap()
}

// publishingWorker attaches a producer for worker that publishes on TCP ports (PUB and replay) and applies one
// block; it returns the producer and the bound endpoints (host:port).
func publishingWorker(t *testing.T, ts *testServer, worker uint64) (p *producer, pub, rep string) {
	t.Helper()
	p = newProducer(t, ts.SocketPath(), worker, 4, 1<<16)
	port := freePorts(t, 2)
	pub, rep = "127.0.0.1:"+strconv.Itoa(port), "127.0.0.1:"+strconv.Itoa(port+1)
	repEP := "tcp://" + rep
	attachPublishing(t, p, &sock.Publish{Endpoint: "tcp://*:" + strconv.Itoa(port), ReplayEndpoint: &repEP, HWM: 100, BufferSteps: 100})
	p.mustPublish(stored(1, 0, nil, []uint64{worker}, tokens(0, 1, 4)))
	nextWire(t, ts, worker) // applied
	return p, pub, rep
}

func detach(t *testing.T, p *producer) {
	t.Helper()
	if err := p.conn.DetachStream(ctxT(t), sock.WorkerRequest{WorkerID: &p.worker, DpRank: p.rank}); err != nil {
		t.Fatal(err)
	}
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// TestDeadStreamReclaimed: a dead stream is kept (queryable, its ports bound, its last checkpoint on disk) for the
// retention, then forgotten as FORGET forgets it: ports closed, STATS not_found, metric series and checkpoint
// gone; a live worker is untouched and the forgotten worker attaches again as a new stream. Before the reaper,
// the stream, its ports and series stayed until an operator sent FORGET.
func TestDeadStreamReclaimed(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	ts := startServer(t, func(c *Config) { c.DeadRetention, c.StateDir, c.CheckpointInterval = time.Hour, state, time.Hour })
	p, pub, rep := publishingWorker(t, ts, 1)
	newProducer(t, ts.SocketPath(), 2, 4, 1<<16) // live all along
	detach(t, p)
	ckpt := ckptFile(state, p)
	q := dialT(t, ts.SocketPath())

	advance(ts, 59*time.Minute)
	if _, err := q.Stats(ctxT(t), u64p(1)); err != nil { // STATS is not a consumer asking: it keeps nothing alive
		t.Fatalf("dead stream within its retention: %v", err)
	}
	if _, err := os.Stat(ckpt); err != nil || !listening(pub) || !listening(rep) {
		t.Fatalf("within the retention: checkpoint %v, PUB listening %v, replay listening %v", err, listening(pub), listening(rep))
	}
	advance(ts, 2*time.Minute)
	if _, err := q.Stats(ctxT(t), u64p(1)); !sock.IsCode(err, sock.CodeNotFound) {
		t.Fatalf("STATS after the retention = %v, want not_found", err)
	}
	if _, err := os.Stat(ckpt); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("checkpoint after the retention: %v, want removed", err)
	}
	if listening(pub) || listening(rep) {
		t.Errorf("after the retention: PUB listening %v, replay listening %v, want both closed", listening(pub), listening(rep))
	}
	m := scrape(t, ts.Server)
	if strings.Contains(m, `worker_id="1"`) || !strings.Contains(m, `kvshm_producer_up{dp_rank="",worker_id="2"} 1`) {
		t.Fatalf("metrics after reclaiming worker 1 (want none of it, worker 2 up):\n%s", m)
	}
	if rep := p.attach(); rep.StreamEpoch != 1 {
		t.Fatalf("attach after the reclaim = %+v, want a new stream", rep)
	}
}

// TestDeadStreamAskedKept: a recovery query and a replay request each restart the retention; a producer whose
// connection broke while its pid lives (watched) is never dead, whatever the time.
func TestDeadStreamAskedKept(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.DeadRetention = time.Hour })
	p, _, rep := publishingWorker(t, ts, 1)
	detach(t, p)
	q := dialT(t, ts.SocketPath())
	gone := func() bool { return streamOf(ts, 1) == nil }

	advance(ts, 50*time.Minute)
	if _, err := q.Dump(ctxT(t), u64p(1)); err != nil {
		t.Fatal(err)
	}
	advance(ts, 50*time.Minute)
	if gone() {
		t.Fatal("reclaimed 50 min after a recovery query (retention 1 h)")
	}
	replayFrom(t, "tcp://"+rep, 0)
	ts.reap() // sees the replay request
	advance(ts, 50*time.Minute)
	if gone() {
		t.Fatal("reclaimed 50 min after a replay request (retention 1 h)")
	}
	advance(ts, 11*time.Minute)
	if !gone() {
		t.Fatal("kept 61 min after the last request (retention 1 h)")
	}

	w := newProducer(t, ts.SocketPath(), 3, 4, 1<<16)
	w.conn.Close() // this process, the producer, lives: its pid is watched
	waitUntil(t, func() bool { _, a := streamOf(ts, 3).Current(); return a == nil }, "the broken connection's detach")
	advance(ts, 3*time.Hour)
	if streamOf(ts, 3) == nil {
		t.Fatal("a watched producer's stream (pid alive) was reclaimed")
	}
}

// TestMaxDeadStreams: beyond MaxDeadStreams dead streams the ones longest not asked for are forgotten at once, long
// before the retention.
func TestMaxDeadStreams(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.DeadRetention, c.MaxDeadStreams = time.Hour, 3 })
	q := dialT(t, ts.SocketPath())
	kept := func() string {
		var ws []uint64
		for _, st := range ts.streamList() {
			ws = append(ws, st.key.Worker)
		}
		return fmt.Sprint(ws)
	}
	for w := uint64(1); w <= 6; w++ {
		p := newProducer(t, ts.SocketPath(), w, 4, 1<<16)
		detach(t, p)
		ts.reap()
		switch w {
		case 3:
			if _, err := q.Dump(ctxT(t), u64p(1)); err != nil { // worker 1 becomes the most recently asked
				t.Fatal(err)
			}
		case 4:
			if k := kept(); k != "[1 3 4]" {
				t.Fatalf("dead streams kept: %v, want [1 3 4] (worker 1 asked for after 3 died)", k)
			}
		}
	}
	if k := kept(); k != "[4 5 6]" {
		t.Fatalf("dead streams kept: %v, want [4 5 6]", k)
	}
}

// fdCount is the number of open descriptors of this process.
func fdCount(t *testing.T) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// streamSeries counts the per-stream metric series (those with a worker_id label).
func streamSeries(t *testing.T, s *Server) int {
	n := 0
	for _, l := range strings.Split(scrape(t, s), "\n") {
		if strings.Contains(l, `worker_id="`) && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	return n
}

// TestCycleWorkersFlat: a producer that publishes and shuts down worker after worker (a new worker id each time,
// each publishing on its own PUB and replay ports) leaves the daemon's descriptors, metric series, streams and heap
// where they were once MaxDeadStreams streams are dead. Before the reaper each cycle kept 2 more descriptors, a
// set of series and an index (the red team: 120 workers, +240 fds, +20 MiB).
func TestCycleWorkersFlat(t *testing.T) {
	const maxDead = 16
	ts := startServer(t, func(c *Config) { c.MaxDeadStreams, c.Logger = maxDead, slog.New(slog.DiscardHandler) }) // t.Log would keep every line
	dir := t.TempDir()
	pubEP, repEP := "tcp://*:0", "tcp://127.0.0.1:0" // a PUB binds with *, as vLLM's
	cycle := func(w uint64) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // not ctxT: its cleanups would pile up
		defer cancel()
		p := &producer{t: t, socket: ts.SocketPath(), worker: w, bs: 4, maxBuf: 1024, b: flatbuffers.NewBuilder(256),
			path: filepath.Join(dir, "ring")}
		var err error
		if p.w, err = shm.Create(p.path, shm.Options{Capacity: 1 << 16, WorkerID: w, KVBlockSize: 4, MaxBufferSize: p.maxBuf}); err != nil {
			t.Fatal(err)
		}
		p.newOracle()
		if p.conn, err = sock.Dial(ctx, p.socket); err != nil {
			t.Fatal(err)
		}
		if _, err := p.conn.Attach(ctx, sock.AttachRequest{RingPath: p.path, WorkerID: w, KVBlockSize: 4, MaxBufferSize: p.maxBuf,
			Publish: &sock.Publish{Endpoint: pubEP, ReplayEndpoint: &repEP, HWM: 100, BufferSteps: 100}}); err != nil {
			t.Fatalf("attach worker %d: %v", w, err)
		}
		for i := range 8 {
			p.mustPublish(stored(uint64(i), 0, nil, []uint64{w<<8 | uint64(i)}, tokens(uint32(i), 1, 4)))
		}
		if err := p.conn.DetachStream(ctx, sock.WorkerRequest{WorkerID: &w}); err != nil {
			t.Fatal(err)
		}
		p.conn.Close()
		_ = p.w.Close()
		_ = os.Remove(p.path)
	}
	type sample struct{ fds, series, streams int }
	var heap [2]uint64
	measure := func(i int) sample {
		waitUntil(t, func() bool { return len(ts.streamList()) <= maxDead }, "the reaper's count bound")
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		heap[i] = ms.HeapAlloc
		return sample{fdCount(t), streamSeries(t, ts.Server), len(ts.streamList())}
	}
	n := max(*cycleWorkers, 4*maxDead)
	w := uint64(1)
	for ; w <= 2*maxDead; w++ {
		cycle(w)
	}
	warm := measure(0)
	for ; w <= uint64(n); w++ {
		cycle(w)
	}
	end := measure(1)
	t.Logf("after %d workers: %+v heap %d KiB; after %d: %+v heap %d KiB", 2*maxDead, warm, heap[0]>>10, n, end, heap[1]>>10)
	if end.streams != maxDead || end.fds > warm.fds+4 || end.series > warm.series {
		t.Fatalf("after %d cycled workers: %+v, want %d streams and no more fds or series than after %d: %+v",
			n, end, maxDead, 2*maxDead, warm)
	}
	// A dead stream's index, replay buffer and publisher are ~10 KiB here; n kept streams would hold n times that.
	if grow := int64(heap[1]) - int64(heap[0]); grow > 2<<20 {
		t.Fatalf("heap grew by %d KiB over %d cycled workers, want flat (< 2 MiB)", grow>>10, n-2*maxDead)
	}
}
