package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/proto/sock"
)

// The end-to-end proof of replay snapshots (docs/replay-snapshots.md) with the real consumer: Dynamo 1.6.1's standalone
// indexer (the conformance crate's `standalone` binary), registered on a real kvshmd's ZMQ publisher with a replay
// buffer of 8 batches. Its state (GET /dump: block hash and its own tokens hash, computed from the token ids it
// received) must equal the producer's truth exactly after (a) it was down while far more than 8 batches were
// published, and (b) kvshmd was SIGKILLed, restarted from its state dir, and the router restarted after it. With
// --zmq-snapshots=false the same run leaves the router stale (what vLLM's publisher gives): the test would fail
// without snapshots.
//
// The binary: $KVSHM_STANDALONE, else build/cargo-target/release/standalone (make e2e-build builds it). Without
// it the test skips, unless KVSHM_STANDALONE is set (then it must exist). ~15 s.

func standaloneBin(t *testing.T) string {
	t.Helper()
	p := os.Getenv("KVSHM_STANDALONE")
	if p == "" {
		p = filepath.Join("..", "build", "cargo-target", "release", "standalone")
		if _, err := os.Stat(p); err != nil {
			t.Skipf("no standalone router at %s (make e2e-build, or set KVSHM_STANDALONE)", p)
		}
	}
	_, err := os.Stat(p)
	testenv.Require(t, err, "Dynamo 1.6.1's standalone indexer", "make e2e-build; KVSHM_STANDALONE=path")
	abs, _ := filepath.Abs(p)
	return abs
}

// router is one standalone process.
type router struct {
	t    *testing.T
	bin  string
	port int
	log  *testenv.SyncBuffer
	cmd  *exec.Cmd
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (r *router) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "--port", fmt.Sprint(r.port))
	r.cmd.Stderr = r.log
	if *verbose {
		r.cmd.Stderr = io.MultiWriter(r.log, os.Stderr)
	}
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	cmd := r.cmd
	r.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitUntil(r.t, func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", r.port))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, "router /health")
}

func (r *router) kill() {
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
}

func (r *router) register(worker uint64, ep, rep string, bs uint32) {
	r.t.Helper()
	body, _ := json.Marshal(map[string]any{"instance_id": worker, "endpoint": ep, "replay_endpoint": rep,
		"model_name": "snap", "block_size": bs, "dp_rank": 0})
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/register", r.port), "application/json", bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(resp.Body)
		r.t.Fatalf("register: %d %s", resp.StatusCode, b)
	}
}

// state returns the router's blocks of worker as "block_hash/tokens_hash" (nil when /dump fails).
func (r *router) state(worker uint64) map[string]bool {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/dump", r.port))
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var doc map[string]struct {
		Events []struct {
			WorkerID uint64 `json:"worker_id"`
			Event    struct {
				Data json.RawMessage `json:"data"`
			} `json:"event"`
		} `json:"events"`
	}
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&doc) != nil {
		return nil
	}
	out := map[string]bool{}
	for _, entry := range doc {
		for _, ev := range entry.Events {
			if ev.WorkerID != worker {
				continue
			}
			var d struct {
				Stored *struct {
					Blocks []struct {
						BlockHash  uint64 `json:"block_hash"`
						TokensHash uint64 `json:"tokens_hash"`
					} `json:"blocks"`
				} `json:"stored"`
			}
			if json.Unmarshal(ev.Event.Data, &d) == nil && d.Stored != nil {
				for _, b := range d.Stored.Blocks {
					out[fmt.Sprintf("%d/%d", b.BlockHash, b.TokensHash)] = true
				}
			}
		}
	}
	return out
}

// truth is the producer's resident tree: block hash -> parent, its tokens hash (Dynamo's local hash), children.
type truth struct {
	rng    *rand.Rand
	bs     uint32
	seq    uint64
	next   uint64
	blocks map[uint64]*tblock
}

type tblock struct {
	parent   uint64 // 0: root
	th       uint64
	children int
}

func (tr *truth) want() map[string]bool {
	out := map[string]bool{}
	for h, b := range tr.blocks {
		out[fmt.Sprintf("%d/%d", h, b.th)] = true
	}
	return out
}

// step publishes one engine-like event: a chain of 1..4 blocks under a resident block or the root, or the removal
// of a leaf.
func (tr *truth) step(t *testing.T, p *producer) {
	t.Helper()
	tr.seq++
	var leaves []uint64
	for h, b := range tr.blocks {
		if b.children == 0 {
			leaves = append(leaves, h)
		}
	}
	if len(leaves) > 6 && tr.rng.IntN(3) == 0 {
		h := leaves[tr.rng.IntN(len(leaves))]
		if par := tr.blocks[h].parent; par != 0 {
			tr.blocks[par].children--
		}
		delete(tr.blocks, h)
		p.mustPublish(removed(tr.seq, 0, h))
		return
	}
	var parent *uint64
	var ph uint64
	if len(leaves) > 0 && tr.rng.IntN(4) != 0 {
		ph = leaves[tr.rng.IntN(len(leaves))]
		parent = &ph
	}
	n := 1 + tr.rng.IntN(4)
	var hs []uint64
	var toks []uint32
	prev := ph
	for range n {
		tr.next++
		w := make([]uint32, tr.bs)
		for i := range w {
			w[i] = uint32(tr.rng.IntN(30000))
		}
		th, err := index.HashTokens(w, tr.bs, "", false)
		if err != nil {
			t.Fatal(err)
		}
		tr.blocks[tr.next] = &tblock{parent: prev, th: th[0]}
		if prev != 0 {
			tr.blocks[prev].children++
		}
		hs, toks, prev = append(hs, tr.next), append(toks, w...), tr.next
	}
	p.mustPublish(stored(tr.seq, 0, parent, hs, toks))
}

// converged polls the router until its state equals the truth (a 30 s hang guard, not a performance bound).
func converged(t *testing.T, r *router, worker uint64, tr *truth, what string) {
	t.Helper()
	want := tr.want()
	deadline := time.Now().Add(30 * time.Second)
	var got map[string]bool
	for time.Now().Before(deadline) {
		if got = r.state(worker); equalSets(got, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	extra, missing := setDiff(got, want)
	t.Fatalf("%s: the router never converged: %d stale, %d missing of %d\nrouter log:\n%s", what, extra, missing,
		len(want), tail(r.log.String(), 3000))
}

func equalSets(a, b map[string]bool) bool {
	if a == nil || len(a) != len(b) {
		return false
	}
	for k := range b {
		if !a[k] {
			return false
		}
	}
	return true
}

func setDiff(got, want map[string]bool) (extra, missing int) {
	for k := range got {
		if !want[k] {
			extra++
		}
	}
	for k := range want {
		if !got[k] {
			missing++
		}
	}
	return extra, missing
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// reattachPublish attaches p again (its daemon restarted: no DETACH) asking for pub.
func reattachPublish(t *testing.T, p *producer, pub *sock.Publish) sock.AttachReply {
	t.Helper()
	if p.conn != nil {
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
	return rep
}

// replayDone waits for the router to log a finished replay after offset (its log's length before the fault).
func replayDone(t *testing.T, r *router, offset int) {
	t.Helper()
	waitUntil(t, func() bool { return strings.Contains(r.log.String()[offset:], "Replay complete") }, "the router's replay")
}

func TestRouterConvergesThroughSnapshots(t *testing.T) {
	bin := standaloneBin(t)
	for _, snapshots := range []bool{true, false} {
		t.Run(fmt.Sprintf("snapshots=%v", snapshots), func(t *testing.T) {
			routerScenario(t, bin, snapshots)
		})
	}
}

func routerScenario(t *testing.T, bin string, snapshots bool) {
	const worker, bs = 41, 4
	dir := t.TempDir()
	socket, state := filepath.Join(dir, "kvshmd.sock"), filepath.Join(dir, "state")
	args := []string{"--state-dir", state, "--checkpoint-interval", "100ms", "--zmq-heartbeat", "100ms",
		fmt.Sprintf("--zmq-snapshots=%v", snapshots), "--http", "127.0.0.1:0"}
	d := startDaemon(t, socket, args...)
	p := newProducer(t, socket, worker, bs, 1<<22)
	ep, rep := "ipc://"+filepath.Join(dir, "pub.sock"), "ipc://"+filepath.Join(dir, "replay.sock")
	pub := &sock.Publish{Endpoint: ep, ReplayEndpoint: &rep, Topic: "", BufferSteps: 8, HWM: 64}
	attachPublishing(t, p, pub)
	r := &router{t: t, bin: bin, port: freePort(t), log: &testenv.SyncBuffer{}}
	r.start()
	r.register(worker, ep, rep, bs)
	tr := &truth{rng: rand.New(rand.NewPCG(7, 11)), bs: bs, seq: 100, next: 5000, blocks: map[uint64]*tblock{}}
	for range 5 {
		tr.step(t, p)
	}
	converged(t, r, worker, tr, "live")

	// (a) The router is down while 200 batches (25 buffers) are published; it restarts and registers again.
	r.kill()
	for range 200 {
		tr.step(t, p)
	}
	off := len(r.log.String())
	r.start()
	r.register(worker, ep, rep, bs)
	if !snapshots {
		replayDone(t, r, off)
		if got := r.state(worker); equalSets(got, tr.want()) {
			t.Fatalf("without snapshots the router converged after missing 25 buffers: the test cannot fail")
		}
		extra, missing := setDiff(r.state(worker), tr.want())
		t.Logf("without snapshots (vLLM's replay): %d stale, %d missing of %d blocks after the router's restart",
			extra, missing, len(tr.want()))
		return
	}
	converged(t, r, worker, tr, "(a) router down past the replay buffer")
	logReplays(t, r, off, "(a)")

	// (a') The router stays up but is cut off (SIGSTOP): kvshmd cuts its subscriber once the socket is full and 64
	// messages are queued; the router resumes with a gap far behind the buffer and replays from watermark+1.
	off = len(r.log.String())
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cut := func() bool { return metricSum(t, d, "kvshm_zmq_subscribers_cut_total") >= 1 }
	for i := 0; !cut(); i++ {
		for range 50 {
			tr.step(t, p)
		}
		if i > 400 {
			t.Fatal("kvshmd never cut the stopped router's subscriber")
		}
	}
	for range 20 {
		tr.step(t, p)
	}
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	converged(t, r, worker, tr, "(a') router cut off past the replay buffer")
	logReplays(t, r, off, "(a')")

	// (b) kvshmd is SIGKILLed (events go on into the ring meanwhile), restarted from its state dir; the router
	// restarts after it (it gets the restarted daemon's snapshot, restored from the checkpoint plus the ring).
	for range 20 {
		tr.step(t, p)
	}
	time.Sleep(300 * time.Millisecond) // let a periodic checkpoint happen (either way the state must be exact)
	d.kill()
	for range 10 {
		tr.step(t, p)
	}
	d = startDaemon(t, socket, args...)
	if a := reattachPublish(t, p, pub); !a.Resumed || !a.Restored {
		t.Fatalf("reattach after SIGKILL: %+v, want resumed and restored from the checkpoint\n%s", a, d.log)
	}
	r.kill()
	for range 10 {
		tr.step(t, p)
	}
	off = len(r.log.String())
	r.start()
	r.register(worker, ep, rep, bs)
	converged(t, r, worker, tr, "(b) router restarted after kvshmd restarted")
	logReplays(t, r, off, "(b)")
	for range 10 { // and it follows live
		tr.step(t, p)
	}
	converged(t, r, worker, tr, "(b) live after the restarts")
}

// metricSum sums the samples of a metric on the daemon's /metrics.
func metricSum(t *testing.T, d *daemonProc, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, name+" ") || strings.HasPrefix(l, name+"{") {
			var v float64
			if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// logReplays logs the router's replay lines since offset (what it asked, what it got).
func logReplays(t *testing.T, r *router, offset int, what string) {
	for _, l := range strings.Split(r.log.String()[offset:], "\n") {
		if strings.Contains(l, "eplay") || strings.Contains(l, "Gap") {
			t.Logf("%s router: %s", what, tail(l, 300))
		}
	}
}

// TestRouterSnapshotScale (KVSHM_SNAPSHOT_SCALE=1; a measurement for issue 18's restart figures, not a gate): a
// stream of 100 k resident blocks (block size 16, chains of 32), the router restarted: how long until its state is
// exact through one snapshot reply.
func TestRouterSnapshotScale(t *testing.T) {
	if os.Getenv("KVSHM_SNAPSHOT_SCALE") == "" {
		t.Skip("set KVSHM_SNAPSHOT_SCALE=1 to measure")
	}
	bin := standaloneBin(t)
	const worker, bs, n = 42, 16, 100_000
	dir := t.TempDir()
	socket := filepath.Join(dir, "kvshmd.sock")
	d := startDaemon(t, socket, "--state-dir", "", "--zmq-heartbeat", "100ms", "--http", "127.0.0.1:0")
	p := newProducer(t, socket, worker, bs, 1<<27)
	ep, rep := "ipc://"+filepath.Join(dir, "pub.sock"), "ipc://"+filepath.Join(dir, "replay.sock")
	attachPublishing(t, p, &sock.Publish{Endpoint: ep, ReplayEndpoint: &rep, BufferSteps: 8})
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[string]bool{}
	for id := range n / 32 {
		hs := make([]uint64, 32)
		toks := make([]uint32, 32*bs)
		for i := range toks {
			toks[i] = uint32(rng.IntN(128000))
		}
		ths, err := index.HashTokens(toks, bs, "", false)
		if err != nil {
			t.Fatal(err)
		}
		for i := range hs {
			hs[i] = rng.Uint64() >> 1
			want[fmt.Sprintf("%d/%d", hs[i], ths[i])] = true
		}
		p.mustPublish(stored(uint64(id+1), 0, nil, hs, toks))
	}
	r := &router{t: t, bin: bin, port: freePort(t), log: &testenv.SyncBuffer{}}
	start := time.Now()
	r.start()
	up := time.Since(start)
	r.register(worker, ep, rep, bs)
	deadline := time.Now().Add(120 * time.Second)
	for !equalSets(r.state(worker), want) {
		if time.Now().After(deadline) {
			t.Fatalf("not converged: %s", tail(r.log.String(), 2000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("router start to exact state of %d blocks: %v (of which the router's own start %v; /dump polled every "+
		"100 ms; snapshots %v)", n, time.Since(start), up, metricSum(t, d, "kvshm_zmq_snapshots_total"))
}
