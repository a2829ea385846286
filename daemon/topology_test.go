package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// httpServer starts an in-process daemon with a real HTTP listener on loopback.
func httpServer(t *testing.T, mod func(*Config)) *testServer {
	t.Helper()
	return startServer(t, func(c *Config) {
		c.HTTPAddr = "127.0.0.1:0"
		if mod != nil {
			mod(c)
		}
	})
}

// httpGet sends GET http://addr+path over a real connection and returns status, headers and body.
func httpGet(t *testing.T, addr, path string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), "GET", "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", path, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// wantJSON fails unless GET addr+path answers 200 with exactly want (the oracle's bytes).
func wantJSON(t *testing.T, addr, path string, want []byte) {
	t.Helper()
	code, h, body := httpGet(t, addr, path)
	if code != http.StatusOK || body != string(want) {
		t.Fatalf("GET %s = %d %.300s\nwant 200 %.300s", path, code, body, want)
	}
	if h.Get(HeaderState) != "" || h.Get(HeaderLostEvents) != "" {
		t.Fatalf("GET %s: loss headers on a complete answer: %v", path, h)
	}
}

// wantStatus fails unless GET addr+path answers code with a {"error","code"} body containing every part of want.
func wantStatus(t *testing.T, addr, path string, code int, want ...string) string {
	t.Helper()
	got, _, body := httpGet(t, addr, path)
	var eb sock.ErrorBody
	if got != code || json.Unmarshal([]byte(body), &eb) != nil || eb.Code == "" {
		t.Fatalf("GET %s = %d %s, want %d with an error body", path, got, body, code)
	}
	for _, w := range want {
		if !strings.Contains(eb.Error, w) {
			t.Fatalf("GET %s: error %q lacks %q", path, eb.Error, w)
		}
	}
	return eb.Error
}

// oracleJSON is the oracle's answer to a recovery query (rank: its rank view).
func oracleJSON(t *testing.T, p *producer, start, end *uint64, rank *uint32) []byte {
	t.Helper()
	var resp index.Response
	var err error
	if rank != nil {
		resp, err = p.oracle.RecoverRank(context.Background(), start, end, *rank)
	} else {
		resp, err = p.oracle.Recover(context.Background(), start, end)
	}
	if err != nil {
		t.Fatal(err)
	}
	return resp.JSON
}

// publishChain publishes n single-block Stored events of rank dp, chained by parent, from seq first.
func publishChain(p *producer, first uint64, n int, dp uint32, hashBase uint64) {
	var parent *uint64
	for i := range n {
		h := hashBase + uint64(i)
		p.mustPublish(stored(first+uint64(i), dp, parent, []uint64{h}, tokens(uint32(h), 1, p.bs)))
		parent = &h
	}
}

// TestSharedDaemonPerWorkerURLs: a shared daemon with two workers answers /kv_recover without worker_id with 409
// naming each worker's URL, and each /workers/{w}/kv_recover answers exactly that worker's state.
func TestSharedDaemonPerWorkerURLs(t *testing.T) {
	ts := httpServer(t, nil)
	addr := ts.HTTPAddr()
	p1 := newProducer(t, ts.SocketPath(), 1, 4, 1<<16)
	p2 := newProducer(t, ts.SocketPath(), 2, 4, 1<<16)
	publishChain(p1, 0, 5, 0, 100)
	publishChain(p2, 0, 3, 0, 200)
	wantStatus(t, addr, "/kv_recover?start=0&end=4", http.StatusConflict, "/workers/1/kv_recover", "/workers/2/kv_recover")
	for _, p := range []*producer{p1, p2} {
		base := fmt.Sprintf("/workers/%d/kv_recover", p.worker)
		wantJSON(t, addr, base+"?start=&end=", oracleJSON(t, p, nil, nil, nil))
		wantJSON(t, addr, base+"?start=1&end=2", oracleJSON(t, p, u64p(1), u64p(2), nil))
		wantJSON(t, addr, fmt.Sprintf("/kv_recover?start=0&worker_id=%d", p.worker), oracleJSON(t, p, u64p(0), nil, nil))
	}
	wantStatus(t, addr, "/workers/3/kv_recover?start=0", http.StatusNotFound, "worker_id 3")
	wantStatus(t, addr, "/workers/1/kv_recover?start=0&worker_id=1", http.StatusBadRequest, "path")
	wantStatus(t, addr, "/workers/x1/kv_recover", http.StatusBadRequest, "worker_id")
	wantStatus(t, addr, "/workers/1/dp/4294967296/kv_recover", http.StatusBadRequest, "dp_rank")
	// dp_rank alone with two workers: 409 naming each worker's rank URL.
	wantStatus(t, addr, "/kv_recover?start=0&dp_rank=0", http.StatusConflict, "/workers/1/dp/0/kv_recover", "/workers/2/dp/0/kv_recover")
}

// TestPerRankProducers: two producers of one worker, each attached with its dp_rank and its own seq space (vLLM),
// share a daemon; each rank's URL, dp_rank query and socket request answer exactly that producer's state; a second
// live producer for the same (worker, rank) is refused; STATS, FORGET and metrics tell the streams apart.
func TestPerRankProducers(t *testing.T) {
	ts := httpServer(t, nil)
	addr, socket := ts.HTTPAddr(), ts.SocketPath()
	r0 := newRankProducer(t, socket, 5, u32p(0), 4, 1<<16)
	r1 := newRankProducer(t, socket, 5, u32p(1), 4, 1<<16)
	publishChain(r0, 0, 4, 0, 500) // seqs 0..3
	publishChain(r1, 0, 6, 1, 600) // seqs 0..5: its own seq space

	// A second producer for (5, rank 0) while the first lives: conflict, with the hint.
	dup := newRankProducerNoAttach(t, socket, 5, u32p(0))
	if _, err := dup.Attach(ctxT(t), dup.req); !sock.IsCode(err, sock.CodeConflict) || !strings.Contains(err.Error(), "dp_rank 0") || !strings.Contains(err.Error(), "must pass dp_rank") {
		t.Fatalf("second live producer for worker 5 dp_rank 0: %v, want conflict with the dp_rank hint", err)
	}

	wantStatus(t, addr, "/workers/5/kv_recover?start=0", http.StatusConflict, "/workers/5/dp/0/kv_recover", "/workers/5/dp/1/kv_recover")
	wantStatus(t, addr, "/kv_recover?start=0", http.StatusConflict, "/workers/5/dp/0/kv_recover", "/workers/5/dp/1/kv_recover")
	for i, p := range []*producer{r0, r1} {
		rank := uint32(i)
		for _, q := range []struct {
			start, end *uint64
			qs         string
		}{{nil, nil, "start=&end="}, {u64p(0), nil, "start=0"}, {u64p(2), u64p(3), "start=2&end=3"}, {u64p(99), nil, "start=99"}} {
			want := oracleJSON(t, p, q.start, q.end, nil)
			wantJSON(t, addr, fmt.Sprintf("/workers/5/dp/%d/kv_recover?%s", rank, q.qs), want)
			wantJSON(t, addr, fmt.Sprintf("/kv_recover?dp_rank=%d&%s", rank, q.qs), want)
			wantJSON(t, addr, fmt.Sprintf("/kv_recover?worker_id=5&dp_rank=%d&%s", rank, q.qs), want)
			got, err := dialT(t, socket).EventsOf(ctxT(t), sock.EventsRequest{WorkerID: u64p(5), Start: q.start, End: q.end, DpRank: &rank})
			if err != nil || string(got) != string(want) {
				t.Fatalf("socket EVENTS rank %d %s = %s, %v; want %s", rank, q.qs, got, err, want)
			}
		}
	}
	wantStatus(t, addr, "/workers/5/dp/2/kv_recover?start=0", http.StatusNotFound, "dp_rank 2")

	c := dialT(t, socket)
	sr, err := c.Stats(ctxT(t), u64p(5))
	if err != nil || len(sr.Streams) != 2 || sr.Streams[0].DpRank == nil || *sr.Streams[0].DpRank != 0 ||
		sr.Streams[1].DpRank == nil || *sr.Streams[1].DpRank != 1 || *sr.Streams[1].LastEventID != 5 {
		t.Fatalf("STATS worker 5 = %+v, %v; want the rank 0 and rank 1 streams", sr, err)
	}
	sr, err = c.StatsOf(ctxT(t), sock.WorkerRequest{DpRank: u32p(1)})
	if err != nil || len(sr.Streams) != 1 || *sr.Streams[0].DpRank != 1 {
		t.Fatalf("STATS dp_rank 1 = %+v, %v; want the rank 1 stream", sr, err)
	}
	m := scrape(t, ts.Server)
	for _, want := range []string{`kvshm_newest_event_id{dp_rank="0",worker_id="5"} 3`, `kvshm_newest_event_id{dp_rank="1",worker_id="5"} 5`} {
		if !hasSample(t, m, want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
	// DETACH and FORGET of rank 1 only: rank 0 keeps answering.
	if err := c.Detach(ctxT(t), 5); !sock.IsCode(err, sock.CodeConflict) {
		t.Fatalf("DETACH worker 5 without dp_rank = %v, want conflict (two per-rank streams)", err)
	}
	if err := c.DetachStream(ctxT(t), sock.WorkerRequest{WorkerID: u64p(5), DpRank: u32p(1)}); !sock.IsCode(err, sock.CodeForbidden) {
		t.Fatalf("DETACH of rank 1 from another client = %v, want forbidden (only its producer detaches it)", err)
	}
	if err := r1.conn.DetachStream(ctxT(t), sock.WorkerRequest{WorkerID: u64p(5), DpRank: u32p(1)}); err != nil {
		t.Fatal(err)
	}
	if err := c.ForgetStream(ctxT(t), sock.WorkerRequest{WorkerID: u64p(5), DpRank: u32p(1)}); err != nil {
		t.Fatal(err)
	}
	if m := scrape(t, ts.Server); strings.Contains(m, `dp_rank="1"`) {
		t.Fatal("metrics of the forgotten rank 1 stream remain")
	}
	wantJSON(t, addr, "/workers/5/kv_recover?start=0", oracleJSON(t, r0, u64p(0), nil, nil))
	wantJSON(t, addr, "/kv_recover?start=0", oracleJSON(t, r0, u64p(0), nil, nil))
}

// rawAttach is an attaching connection with its request, for tests that expect the ATTACH to fail.
type rawAttach struct {
	*sock.Client
	req sock.AttachRequest
}

// newRankProducerNoAttach creates a ring for (worker, rank) and a connection, without attaching.
func newRankProducerNoAttach(t *testing.T, socket string, worker uint64, rank *uint32) rawAttach {
	t.Helper()
	path := fmt.Sprintf("%s/dup-w%d.ring", t.TempDir(), worker)
	w, err := shm.Create(path, shm.Options{Capacity: 1 << 16, WorkerID: worker, KVBlockSize: 4, MaxBufferSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return rawAttach{dialT(t, socket), sock.AttachRequest{RingPath: path, WorkerID: worker, KVBlockSize: 4, MaxBufferSize: 1024, DpRank: rank}}
}

// TestAllStreamRankViews: one producer for every rank (TensorRT-LLM, no dp_rank) publishes ranks 0 and 1; each
// rank's URL answers RecoverRank of that rank, the worker's URL the whole stream.
func TestAllStreamRankViews(t *testing.T) {
	ts := httpServer(t, nil)
	addr := ts.HTTPAddr()
	p := newProducer(t, ts.SocketPath(), 8, 4, 1<<16)
	publishChain(p, 0, 3, 0, 800) // seqs 0..2, rank 0
	publishChain(p, 3, 2, 1, 900) // seqs 3..4, rank 1
	p.mustPublish(removed(5, 0, 802))
	for _, qs := range []struct {
		start, end *uint64
		s          string
	}{{nil, nil, "start=&end="}, {u64p(0), nil, "start=0"}, {u64p(3), u64p(5), "start=3&end=5"}} {
		wantJSON(t, addr, "/workers/8/kv_recover?"+qs.s, oracleJSON(t, p, qs.start, qs.end, nil))
		for _, r := range []uint32{0, 1} {
			want := oracleJSON(t, p, qs.start, qs.end, &r)
			wantJSON(t, addr, fmt.Sprintf("/workers/8/dp/%d/kv_recover?%s", r, qs.s), want)
			wantJSON(t, addr, fmt.Sprintf("/kv_recover?dp_rank=%d&%s", r, qs.s), want)
			got, err := dialT(t, ts.SocketPath()).DumpOf(ctxT(t), sock.WorkerRequest{DpRank: &r})
			if want := oracleJSON(t, p, nil, nil, &r); err != nil || string(got) != string(want) {
				t.Fatalf("socket DUMP dp_rank %d = %s, %v; want %s", r, got, err, want)
			}
		}
	}
}

// freePorts returns a base port such that base..base+n-1 were free a moment ago on 127.0.0.1.
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := base+n-1 <= 65535
		for i := 1; i < n && ok; i++ {
			l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l2)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no run of free ports found")
	return 0
}

// TestRankPorts: --rank-ports opens port BASE+r when the daemon first holds a stream covering r (a per-rank attach:
// before its reply; the first rank-r event of an ALL stream: before a query that follows it is answered); each
// answers as /workers/{w}/dp/{r}/kv_recover for the only worker; a port that cannot be bound is logged and counted;
// a second worker makes them 409.
func TestRankPorts(t *testing.T) {
	base := freePorts(t, 3)
	ts := httpServer(t, func(c *Config) { c.RankPortsBase = base })
	socket := ts.SocketPath()
	if a := ts.RankAddr(0); a != "" {
		t.Fatalf("rank 0 port open before any stream: %s", a)
	}
	r0 := newRankProducer(t, socket, 9, u32p(0), 4, 1<<16)
	a0 := ts.RankAddr(0)
	if a0 != "127.0.0.1:"+strconv.Itoa(base) {
		t.Fatalf("rank 0 port after a rank-0 attach = %q, want 127.0.0.1:%d", a0, base)
	}
	publishChain(r0, 0, 3, 0, 100)
	wantJSON(t, a0, "/kv_recover?start=&end=", oracleJSON(t, r0, nil, nil, nil))
	wantJSON(t, a0, "/kv_recover?start=1", oracleJSON(t, r0, u64p(1), nil, nil))
	wantStatus(t, a0, "/kv_recover?dp_rank=1", http.StatusBadRequest, "dp_rank 0")

	// Port base+2 is taken by someone else: rank 2 gets none, counted; nothing else changes.
	blocker, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+2))
	if err != nil {
		t.Skipf("port %d taken meanwhile: %v", base+2, err)
	}
	defer blocker.Close()

	all := newProducer(t, socket, 9, 4, 1<<16) // the worker's ALL stream: ranks 1 and 2
	publishChain(all, 0, 2, 1, 300)
	publishChain(all, 2, 1, 2, 400)
	if _, err := dialT(t, socket).Stats(ctxT(t), nil); err != nil { // barrier: the events are applied
		t.Fatal(err)
	}
	a1 := ts.RankAddr(1)
	if a1 != "127.0.0.1:"+strconv.Itoa(base+1) {
		t.Fatalf("rank 1 port after the first rank-1 event = %q", a1)
	}
	r1 := uint32(1)
	wantJSON(t, a1, "/kv_recover?start=&end=", oracleJSON(t, all, nil, nil, &r1))
	wantJSON(t, a0, "/kv_recover?start=0", oracleJSON(t, r0, u64p(0), nil, nil)) // still the per-rank stream
	if a := ts.RankAddr(2); a != "" {
		t.Fatalf("rank 2 port = %q although the port is taken", a)
	}
	if m := scrape(t, ts.Server); !hasSample(t, m, "kvshm_rank_port_errors_total 1") || !hasSample(t, m, "kvshm_rank_ports_open 2") {
		t.Fatal("rank port metrics: want 1 error and 2 open ports")
	}
	wantJSON(t, ts.HTTPAddr(), "/workers/9/dp/2/kv_recover?start=&end=", oracleJSON(t, all, nil, nil, u32p(2)))

	newProducer(t, socket, 10, 4, 1<<16) // a second worker: the rank ports no longer know whom they serve
	wantStatus(t, a0, "/kv_recover?start=0", http.StatusConflict, "/workers/10/dp/0/kv_recover", "/workers/9/dp/0/kv_recover")
}

// TestPerRankCheckpoints: with --state-dir, the ALL stream and the per-rank streams of one worker are checkpointed
// under their own names (w<worker>-<epoch>.ckpt, w<worker>r<rank>-<epoch>.ckpt) and each is restored into its own
// stream after a graceful restart.
func TestPerRankCheckpoints(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	socket := filepath.Join(dir, "s", "kvshmd.sock")
	srv := func() *testServer {
		return startServer(t, func(c *Config) { c.SocketPath, c.StateDir = socket, state })
	}
	ts := srv()
	ps := []*producer{
		newProducer(t, socket, 6, 4, 1<<16),
		newRankProducer(t, socket, 6, u32p(0), 4, 1<<16),
		newRankProducer(t, socket, 6, u32p(1), 4, 1<<16),
	}
	for i, p := range ps {
		publishChain(p, 0, i+2, 0, uint64(100*(i+1)))
	}
	if _, err := dialT(t, socket).Stats(ctxT(t), nil); err != nil { // barrier: everything applied
		t.Fatal(err)
	}
	ts.stop(t)
	for _, p := range ps {
		if _, err := os.Stat(ckptFile(state, p)); err != nil {
			t.Fatalf("checkpoint of %v: %v", p.rank, err)
		}
	}
	srv() // the restarted daemon (stopped by its cleanup)
	for _, p := range ps {
		if rep := p.attach(); !rep.Restored {
			t.Fatalf("reattach of rank %v = %+v, want restored", p.rank, rep)
		}
	}
	for _, p := range ps {
		want := oracleJSON(t, p, nil, nil, nil)
		got, err := dialT(t, socket).DumpOf(ctxT(t), sock.WorkerRequest{WorkerID: u64p(6), DpRank: p.rank}) // no rank: the ALL stream
		if err != nil || string(got) != string(want) {
			t.Fatalf("rank %v after restore: %s, %v; want %s", p.rank, got, err, want)
		}
	}
}

// TestServeFlagsProcess: the kvshmd binary wires --rank-ports, --on-loss and --dump-shape: a per-rank producer's
// port answers at once, in the single-block dump shape, and the daemon says which loss policy it runs.
func TestServeFlagsProcess(t *testing.T) {
	base := freePorts(t, 2)
	socket := filepath.Join(t.TempDir(), "kvshmd.sock")
	d := startDaemon(t, socket, "--http", "127.0.0.1:0", "--rank-ports", strconv.Itoa(base), "--on-loss", "error", "--dump-shape", "blocks")
	d.waitLog(t, "on_loss=error")
	p := newRankProducer(t, socket, 4, u32p(1), 4, 1<<16)
	ix, err := index.New(index.Config{WorkerID: 4, BlockSize: 4, MaxBufferSize: int(p.maxBuf), OnLoss: index.LossError, DumpShape: index.DumpBlocks})
	if err != nil {
		t.Fatal(err)
	}
	p.oracle = ix
	publishChain(p, 0, 3, 1, 100)
	want := oracleJSON(t, p, nil, nil, nil)
	if strings.Contains(string(want), "reset_scope") {
		t.Fatalf("the blocks shape carries reset_scope: %s", want)
	}
	wantJSON(t, "127.0.0.1:"+strconv.Itoa(base+1), "/kv_recover?start=&end=", want)
	wantJSON(t, d.http, "/workers/4/dp/1/kv_recover?start=&end=", want)
}

// TestRankPortRequestNeverListens: the drain path's request for a rank port returns without binding it (the bind
// runs on the opener goroutine, even while it hangs), and settle waits until it is open.
func TestRankPortRequestNeverListens(t *testing.T) {
	base := freePorts(t, 6)
	ts := httpServer(t, func(c *Config) { c.RankPortsBase = base })
	release := make(chan struct{})
	listening := make(chan struct{}, 1)
	listenTCP = func(network, addr string) (net.Listener, error) {
		listening <- struct{}{}
		<-release
		return net.Listen(network, addr)
	}
	t.Cleanup(func() { listenTCP = net.Listen })

	returned := make(chan struct{})
	go func() {
		ts.rankPorts.request(5)
		close(returned)
	}()
	<-listening // the opener is inside the bind
	select {
	case <-returned:
	case <-time.After(20 * time.Second): // a liveness bound: request is a few stores
		t.Fatal("request waited for the listen it asked for")
	}
	if a := ts.RankAddr(5); a != "" {
		t.Fatalf("rank 5 port open while its bind is held: %s", a)
	}
	settled := make(chan struct{})
	go func() {
		ts.rankPorts.settle()
		close(settled)
	}()
	close(release)
	<-settled
	if a, want := ts.RankAddr(5), "127.0.0.1:"+strconv.Itoa(base+5); a != want {
		t.Fatalf("rank 5 port after settle = %q, want %s", a, want)
	}
}
