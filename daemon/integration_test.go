package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/proto/sock"
)

// queryCase is one recovery query; nil bounds are open.
type queryCase struct{ start, end *uint64 }

func (q queryCase) String() string {
	f := func(p *uint64) string {
		if p == nil {
			return "null"
		}
		return fmt.Sprint(*p)
	}
	return f(q.start) + ".." + f(q.end)
}

func (q queryCase) httpQuery(worker uint64) string {
	s := fmt.Sprintf("worker_id=%d&start=", worker)
	if q.start != nil {
		s += fmt.Sprint(*q.start)
	}
	s += "&end="
	if q.end != nil {
		s += fmt.Sprint(*q.end)
	}
	return s
}

var queryCases = []queryCase{
	{nil, nil}, {u64p(0), nil}, {u64p(0), u64p(20)}, {u64p(3), u64p(5)}, {u64p(9), u64p(9)}, {u64p(10), u64p(12)},
	{u64p(11), nil}, {u64p(12), u64p(12)}, {u64p(13), nil}, {u64p(40), u64p(50)}, {u64p(5), u64p(3)}, {nil, u64p(4)},
}

// checkAgainstOracle compares every query kind over the socket (and HTTP when httpAddr != "") with the oracle.
func checkAgainstOracle(t *testing.T, p *producer, socket, httpAddr, phase string) {
	t.Helper()
	ctx := ctxT(t)
	c, err := sock.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := p.worker
	for _, q := range queryCases {
		got, err := c.Events(ctx, &w, q.start, q.end)
		if err != nil {
			t.Fatalf("%s: events %v: %v", phase, q, err)
		}
		want, err := p.oracle.Recover(ctx, q.start, q.end)
		if err != nil {
			t.Fatalf("%s: oracle %v: %v", phase, q, err)
		}
		if !sameRecovery(t, got, want.JSON) {
			t.Errorf("%s: events %v over the socket:\n got %s\nwant %s", phase, q, got, want.JSON)
		}
		if httpAddr != "" {
			resp, err := http.Get("http://" + httpAddr + "/kv_recover?" + q.httpQuery(w))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !sameRecovery(t, body, want.JSON) {
				t.Errorf("%s: GET /kv_recover %v: status %d\n got %s\nwant %s", phase, q, resp.StatusCode, body, want.JSON)
			}
			wantState, wantLost := "", ""
			if want.Incomplete {
				wantState, wantLost = "incomplete", lostHeader(want.Lost)
			}
			if resp.Header.Get(HeaderState) != wantState || resp.Header.Get(HeaderLostEvents) != wantLost {
				t.Errorf("%s: GET /kv_recover %v: loss headers %q %q, want %q %q", phase, q, resp.Header.Get(HeaderState), resp.Header.Get(HeaderLostEvents), wantState, wantLost)
			}
		}
	}
	dump, err := c.Dump(ctx, nil) // the only stream
	if err != nil {
		t.Fatal(err)
	}
	wantDump, _ := p.oracle.Recover(ctx, nil, nil)
	if !sameRecovery(t, dump, wantDump.JSON) {
		t.Errorf("%s: dump:\n got %s\nwant %s", phase, dump, wantDump.JSON)
	}

	st, err := c.Stats(ctx, &w)
	if err != nil || len(st.Streams) != 1 {
		t.Fatalf("%s: stats: %v %+v", phase, err, st)
	}
	got, want := st.Streams[0], p.oracle.Stats()
	if got.Buffered != want.Buffered || got.ResidentBlocks != want.ResidentBlocks || got.Tainted != want.Tainted ||
		got.LostEvents != want.LostIDs || len(got.LostRanges) != len(want.LostRanges) {
		t.Errorf("%s: stats %+v\nwant index stats %+v", phase, got, want)
	}
	if want.Buffered > 0 && (got.FirstEventID == nil || *got.FirstEventID != want.FirstEventID || *got.LastEventID != want.LastEventID) {
		t.Errorf("%s: stats event ids %v..%v, want %d..%d", phase, got.FirstEventID, got.LastEventID, want.FirstEventID, want.LastEventID)
	}
	if !got.ProducerAlive || !got.Attached || got.StreamEpoch != 1 || got.Epoch != p.rep.Epoch || got.RingCapacity == 0 {
		t.Errorf("%s: stats lifecycle fields %+v", phase, got)
	}

	for _, toks := range [][]uint32{tokens(1000, 2, p.bs), tokens(1000, 1, p.bs), tokens(5000, 1, p.bs), nil} {
		m, err := c.Match(ctx, sock.MatchRequest{WorkerID: &w, Tokens: toks})
		if err != nil {
			t.Fatal(err)
		}
		wantScores, _ := p.oracle.MatchTokens(toks, "", false)
		if len(m.Scores) != len(wantScores) {
			t.Fatalf("%s: match %v: %+v, want %+v", phase, toks, m.Scores, wantScores)
		}
		for i, s := range wantScores {
			if m.Scores[i] != (sock.MatchScore{WorkerID: s.WorkerID, DpRank: s.DpRank, Blocks: s.Blocks}) {
				t.Errorf("%s: match score %d: %+v, want %+v", phase, i, m.Scores[i], s)
			}
		}
	}
	h, err := c.Health(ctx)
	if err != nil || h.Status != "ok" || h.Streams != 1 {
		t.Errorf("%s: health %+v %v", phase, h, err)
	}
}

// TestIntegrationProcess runs the real kvshmd, attaches a Go producer and checks every query kind, over the socket
// and over HTTP, against an index fed the same events.
func TestIntegrationProcess(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "run", "kvshmd.sock")
	d := startDaemon(t, socket, "--http", "127.0.0.1:0")
	if d.http == "" {
		t.Fatalf("no http address in the log:\n%s", d.log)
	}
	p := newProducer(t, socket, 7, 4, 1<<20)

	// Phase 1: stores on three dp_ranks, removes (one of an unknown block), a LoRA store, an orphan, a gap.
	p.mustPublish(stored(0, 0, nil, []uint64{100, 101}, tokens(1000, 2, 4)))
	p.mustPublish(stored(1, 0, u64p(101), []uint64{102}, tokens(1008, 1, 4)))
	p.mustPublish(stored(2, 1, nil, []uint64{200}, tokens(1000, 1, 4)))
	p.mustPublish(removed(3, 0, 102))
	lora := stored(4, 0, u64p(101), []uint64{103}, tokens(2000, 1, 4))
	lora.LoraName = "adapter-a"
	p.mustPublish(lora)
	p.mustPublish(removed(5, 0, 999))
	p.mustPublish(stored(6, 0, u64p(555), []uint64{104}, tokens(3000, 1, 4)))
	p.mustPublish(stored(9, 2, nil, []uint64{105}, tokens(4000, 1, 4))) // ids 7, 8 never handed over: a gap, not a loss
	checkAgainstOracle(t, p, socket, d.http, "before clear")
	assertDumpPrefix(t, socket, `{"TreeDump":`) // answered across the gap, as Dynamo does

	// Phase 2: a Cleared re-bases the stream after the gap; then more stores and an Eagle store.
	p.mustPublish(cleared(10))
	p.mustPublish(stored(11, 0, nil, []uint64{106, 107}, tokens(1000, 2, 4)))
	eagle := stored(12, 3, nil, []uint64{300}, tokens(6000, 1, 4))
	eagle.TokenIDs = append(eagle.TokenIDs, 6004)
	eagle.IsEagle = true
	p.mustPublish(eagle)
	checkAgainstOracle(t, p, socket, d.http, "after clear")
	assertDumpPrefix(t, socket, `{"TreeDump":`) // the Cleared at 10 re-based the stream

	// HTTP errors are clear 400s; /healthz answers.
	for _, q := range []string{"start=abc", "start=1&start=2", "bogus=1", "start=-1", "worker_id=99"} {
		resp, err := http.Get("http://" + d.http + "/kv_recover?" + q)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := 400
		if strings.HasPrefix(q, "worker_id") {
			want = 404
		}
		if resp.StatusCode != want || !bytes.Contains(body, []byte(`"error"`)) {
			t.Errorf("GET /kv_recover?%s: %d %s, want %d with an error body", q, resp.StatusCode, body, want)
		}
	}
	resp, err := http.Get("http://" + d.http + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	resp.Body.Close()

	// Operator subcommands against the same daemon.
	out, err := exec.Command(kvshmdBin, "events", "--socket", socket, "--start", "11").Output()
	want, _ := p.oracle.Recover(context.Background(), u64p(11), nil)
	if err != nil || !bytes.Equal(bytes.TrimSpace(out), want.JSON) {
		t.Errorf("kvshmd events --start 11: %v\n got %s\nwant %s", err, out, want.JSON)
	}
	out, err = exec.Command(kvshmdBin, "stats", "--socket", socket).Output()
	var sr sock.StatsReply
	if err != nil || json.Unmarshal(out, &sr) != nil || len(sr.Streams) != 1 || sr.Streams[0].WorkerID != 7 {
		t.Errorf("kvshmd stats: %v %s", err, out)
	}
	out, err = exec.Command(kvshmdBin, "inspect", p.path).Output()
	if err != nil || !bytes.Contains(out, []byte("worker_id      7")) {
		t.Errorf("kvshmd inspect: %v %s", err, out)
	}
	cmd := exec.Command(kvshmdBin, "dump", "--socket", socket, "--worker", "8")
	if out, err := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 1 || !bytes.Contains(out, []byte("not_found")) {
		t.Errorf("kvshmd dump --worker 8: exit %d (%v) %s, want exit 1 naming not_found", cmd.ProcessState.ExitCode(), err, out)
	}
	cmd = exec.Command(kvshmdBin, "health", "--socket", filepath.Join(t.TempDir(), "nope.sock"))
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 3 || !bytes.Contains(out, []byte("is `kvshmd serve` running?")) {
		t.Errorf("kvshmd health on a missing socket: exit %d %s, want 3 with a hint", cmd.ProcessState.ExitCode(), out)
	}

	// /metrics passes promtool and carries the stream's numbers.
	resp, err = http.Get("http://" + d.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`kvshm_events_received_total{dp_rank="",type="stored",worker_id="7"} 8`,
		`kvshm_events_applied_total{dp_rank="",status="parent_not_found",type="stored",worker_id="7"} 1`,
		`kvshm_seq_gaps_total{dp_rank="",worker_id="7"} 1`,
		`kvshm_lost_events_total{dp_rank="",worker_id="7"} 0`,
		`kvshm_newest_event_id{dp_rank="",worker_id="7"} 12`,
		`kvshm_stream_tainted{dp_rank="",worker_id="7"} 0`,
		`kvshm_ring_capacity_bytes{dp_rank="",worker_id="7"} 1.048576e+06`,
		`kvshm_build_info{`,
		`kvshm_recovery_requests_total{dp_rank="",result="tree_dump",worker_id="7"}`,
	} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	promtool(t, metrics)
	if code := d.terminate(t); code != 0 {
		t.Errorf("kvshmd exit code after SIGTERM = %d, want 0\n%s", code, d.log)
	}
}

// getter answers GET path: over a real connection (realGet) or through an in-process handler (handlerGet).
type getter func(path string) (int, http.Header, string)

func realGet(t *testing.T, addr string) getter {
	return func(path string) (int, http.Header, string) { return httpGet(t, addr, path) }
}

func handlerGet(h http.Handler) getter {
	return func(path string) (int, http.Header, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Header(), rec.Body.String()
	}
}

// assertIncompleteDump: /kv_recover?start=&end= answers a TreeDump (the best state kvshm has) marked
// Kvshm-State: incomplete, with Kvshm-Lost-Events starting with lostPrefix.
func assertIncompleteDump(t *testing.T, get getter, lostPrefix string) {
	t.Helper()
	code, h, body := get("/kv_recover?start=&end=")
	if code != http.StatusOK || !strings.HasPrefix(body, `{"TreeDump":`) || h.Get(HeaderState) != "incomplete" ||
		!strings.HasPrefix(h.Get(HeaderLostEvents), lostPrefix) {
		t.Fatalf("dump = %d %v %.200s; want an incomplete TreeDump with lost events %s...", code, h, body, lostPrefix)
	}
}

func assertDumpPrefix(t *testing.T, socket, prefix string) {
	t.Helper()
	c := dialT(t, socket)
	b, err := c.Dump(ctxT(t), nil)
	if err != nil || !bytes.HasPrefix(b, []byte(prefix)) {
		t.Fatalf("dump = %.200s (%v), want prefix %s", b, err, prefix)
	}
}

// promtool runs `promtool check metrics` on the exposition. promtool comes from Debian's prometheus package
// (.ci/run installs it).
func promtool(t *testing.T, metrics []byte) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	testenv.Require(t, err, "promtool", "install Debian's prometheus package (apt-get install prometheus), as .ci/run does")
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = bytes.NewReader(metrics)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
