package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// dropUntil publishes single-block Stored events from seq on until drops events were dropped (ring full); it
// returns the next seq and the first and last dropped seqs.
func dropUntil(t *testing.T, p *producer, seq uint64, drops int) (next, first, last uint64) {
	t.Helper()
	n := 0
	for n < drops {
		if err := p.publish(stored(seq, 0, nil, []uint64{1000 + seq}, tokens(uint32(seq), 1, p.bs))); err != nil {
			if n == 0 {
				first = seq
			}
			last = seq
			n++
		}
		seq++
		if seq > 1<<20 {
			t.Fatal("the ring never filled")
		}
	}
	return seq, first, last
}

// stalledLoss builds the state the soak found first: a producer whose daemon stopped draining (DETACH here, SIGSTOP
// there) fills its 64 KiB ring, drops events, and publishes nothing more after the daemon drains again: the LOSS
// record that would report the drops comes only with the next event, which never comes.
func stalledLoss(t *testing.T, ts *testServer, policy index.LossPolicy) (p *producer, first, last uint64) {
	t.Helper()
	p = newProducer(t, ts.SocketPath(), 4, 4, 1<<16)
	ix, err := index.New(index.Config{WorkerID: 4, BlockSize: 4, MaxBufferSize: int(p.maxBuf), OnLoss: policy})
	if err != nil {
		t.Fatal(err)
	}
	p.oracle = ix
	p.mustPublish(cleared(0))
	if err := p.conn.Detach(ctxT(t), 4); err != nil { // nobody drains now
		t.Fatal(err)
	}
	_, first, last = dropUntil(t, p, 1, 50)
	p.attach() // the daemon drains the ring again; the engine has gone idle
	p.oracle.MarkLost(first, last, stream.HeaderLossReason)
	return p, first, last
}

// TestKnownLossInNextAnswer (found by the soak): a loss the ring header already reports (loss_pending, the seq range)
// shows in the very next answer, without waiting for a next publish that would carry its LOSS record: STATS says
// incomplete with the lost range, a dump is marked incomplete (best effort) or is the Error variant (strict). It
// failed before the drain marked header losses: STATS said loss_pending, tainted false, and the dump was a plain
// TreeDump missing the dropped blocks, indefinitely.
func TestKnownLossInNextAnswer(t *testing.T) {
	for _, policy := range []index.LossPolicy{index.LossBestEffort, index.LossError} {
		t.Run(policy.String(), func(t *testing.T) {
			ts := httpServer(t, func(c *Config) { c.OnLoss = policy })
			p, first, last := stalledLoss(t, ts, policy)
			sr, err := dialT(t, ts.SocketPath()).Stats(ctxT(t), u64p(4))
			if err != nil {
				t.Fatal(err)
			}
			s := sr.Streams[0]
			if !s.Incomplete || !s.Tainted || s.LostEvents != last-first+1 || len(s.LostRanges) != 1 ||
				s.LostRanges[0].First != first || s.LostRanges[0].Last != last {
				t.Fatalf("STATS right after the drain: incomplete=%v tainted=%v lost=%d ranges=%+v loss_pending=%v; want incomplete with %d..%d lost",
					s.Incomplete, s.Tainted, s.LostEvents, s.LostRanges, s.LossPending, first, last)
			}
			// The daemon's answer equals an index that was told the same loss.
			want := oracleJSON(t, p, nil, nil, nil)
			code, h, body := httpGet(t, ts.HTTPAddr(), "/kv_recover?start=&end=")
			if code != http.StatusOK || body != string(want) {
				t.Fatalf("dump = %d %.200s, want %.200s", code, body, want)
			}
			switch policy {
			case index.LossBestEffort:
				if h.Get(HeaderState) != "incomplete" || h.Get(HeaderLostEvents) != lostRange(first, last) {
					t.Fatalf("dump headers %v, want %s: incomplete and %s: %s", h, HeaderState, HeaderLostEvents, lostRange(first, last))
				}
			case index.LossError:
				if !strings.HasPrefix(body, `{"Error":`) || h.Get(HeaderState) != "" {
					t.Fatalf("strict dump = %v %.200s, want the Error variant without %s", h, body, HeaderState)
				}
			}
			// The LOSS record that finally comes with the next event adds nothing: the loss is counted once.
			seq := last + 1
			p.mustPublish(stored(seq, 0, nil, []uint64{1000 + seq}, tokens(uint32(seq), 1, p.bs)))
			s = checkStats(t, ts.SocketPath(), 4, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == seq })
			if s.LostEvents != last-first+1 || len(s.LostRanges) != 1 {
				t.Fatalf("after the LOSS record: lost=%d ranges=%+v, want the same single range %d..%d", s.LostEvents, s.LostRanges, first, last)
			}
		})
	}
}

func lostRange(first, last uint64) string {
	return lostHeader([]index.LostRange{{First: first, Last: last}})
}

// TestLossHeaders: every /kv_recover route answers an incomplete answer with Kvshm-State: incomplete and the lost
// ids, counts it and logs it; under --on-loss=error the same query is the Error variant without those headers; a
// complete answer (Events that do not cross the loss; everything after a Cleared) carries none.
func TestLossHeaders(t *testing.T) {
	for _, policy := range []index.LossPolicy{index.LossBestEffort, index.LossError} {
		t.Run(policy.String(), func(t *testing.T) {
			logs := &testenv.SyncBuffer{}
			ts := httpServer(t, func(c *Config) {
				c.OnLoss = policy
				c.Logger = slog.New(slog.NewTextHandler(logs, nil))
			})
			p, first, last := stalledLoss(t, ts, policy)
			if _, err := dialT(t, ts.SocketPath()).Stats(ctxT(t), nil); err != nil { // barrier: the ring is drained
				t.Fatal(err)
			}
			seq := last + 1
			p.mustPublish(stored(seq, 0, nil, []uint64{1000 + seq}, tokens(uint32(seq), 1, p.bs))) // + LOSS record
			for _, path := range []string{"/kv_recover?start=&end=", "/workers/4/kv_recover?start=0", "/workers/4/dp/0/kv_recover?start=&end="} {
				code, h, body := httpGet(t, ts.HTTPAddr(), path)
				if code != http.StatusOK {
					t.Fatalf("GET %s = %d %s", path, code, body)
				}
				switch policy {
				case index.LossBestEffort:
					if h.Get(HeaderState) != "incomplete" || h.Get(HeaderLostEvents) != lostRange(first, last) {
						t.Fatalf("GET %s headers %v, want incomplete and %s", path, h, lostRange(first, last))
					}
				case index.LossError:
					if !strings.HasPrefix(body, `{"Error":`) || h.Get(HeaderState) != "" || h.Get(HeaderLostEvents) != "" {
						t.Fatalf("GET %s = %v %.200s, want the Error variant without loss headers", path, h, body)
					}
				}
			}
			wantJSON(t, ts.HTTPAddr(), "/kv_recover?start="+itoa(int(seq)), oracleJSON(t, p, u64p(seq), nil, nil)) // after the loss: complete
			m := scrape(t, ts.Server)
			wantCount := "3"
			if policy == index.LossError {
				wantCount = "0"
			}
			if policy == index.LossBestEffort && !hasSample(t, m, `kvshm_incomplete_answers_total{dp_rank="",worker_id="4"} `+wantCount) {
				t.Fatalf("kvshm_incomplete_answers_total is not %s", wantCount)
			}
			if policy == index.LossError && strings.Contains(m, "kvshm_incomplete_answers_total{") {
				t.Fatal("strict policy counted incomplete answers")
			}
			// A warn line (rate-limited per stream: TestRateLog) names the lost ids; none under the strict policy.
			n := strings.Count(logs.String(), "recovery answer is incomplete")
			if policy == index.LossBestEffort && (n < 1 || !strings.Contains(logs.String(), "lost="+lostRange(first, last))) || policy == index.LossError && n != 0 {
				t.Fatalf("%d log lines about incomplete answers, want some naming %s (best effort) or none (strict):\n%s", n, lostRange(first, last), logs)
			}
			seq++
			p.mustPublish(cleared(seq)) // re-bases: complete again
			p.applyOracle(cleared(seq))
			wantJSON(t, ts.HTTPAddr(), "/kv_recover?start=&end=", oracleJSON(t, p, nil, nil, nil))
		})
	}
}

// TestTokenMismatchCounted: a Stored event whose token count is not blocks × block_size is applied as Dynamo does
// (never refused), counted in STATS token_mismatches and kvshm_token_count_mismatch_total, and logged.
func TestTokenMismatchCounted(t *testing.T) {
	logs := &testenv.SyncBuffer{}
	ts := httpServer(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	p := newProducer(t, ts.SocketPath(), 3, 4, 1<<16)
	p.mustPublish(stored(0, 0, nil, []uint64{1, 2}, tokens(0, 2, 4)[:6])) // 6 tokens for 2 blocks of 4
	p.mustPublish(stored(1, 0, nil, []uint64{3}, tokens(100, 1, 4)))
	s := checkStats(t, ts.SocketPath(), 3, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == 1 })
	if s.TokenMismatches != 1 || s.Incomplete {
		t.Fatalf("STATS token_mismatches=%d incomplete=%v, want 1 and complete", s.TokenMismatches, s.Incomplete)
	}
	if !hasSample(t, scrape(t, ts.Server), `kvshm_token_count_mismatch_total{dp_rank="",worker_id="3"} 1`) {
		t.Fatal("kvshm_token_count_mismatch_total is not 1")
	}
	if !strings.Contains(logs.String(), "token count is not blocks × block_size") || !strings.Contains(logs.String(), "seq=0") {
		t.Fatalf("no warn line naming the mismatched event:\n%s", logs)
	}
	resp, err := p.oracle.Recover(context.Background(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantJSON(t, ts.HTTPAddr(), "/kv_recover?start=&end=", resp.JSON)
}

// TestHeaderLossGrowsThenReported: a pending episode that grows after the drain marked it (an event too large for
// the ring is dropped even when the ring is empty) is marked up to its new last seq at the next answer, and the LOSS
// record that finally reports the whole episode adds nothing: every dropped id is lost exactly once.
func TestHeaderLossGrowsThenReported(t *testing.T) {
	ts := httpServer(t, nil)
	p, first, last := stalledLoss(t, ts, index.LossBestEffort)
	c := dialT(t, ts.SocketPath())
	if _, err := c.Stats(ctxT(t), nil); err != nil { // marks first..last
		t.Fatal(err)
	}
	big := last + 1
	if err := p.publish(stored(big, 0, nil, []uint64{1000 + big}, tokens(0, 1000, p.bs))); !errors.Is(err, shm.ErrTooLarge) {
		t.Fatalf("publishing a 16 KB event into a 64 KiB ring: %v, want ErrTooLarge", err)
	}
	p.oracle.MarkLost(big, big, stream.HeaderLossReason)
	sr, err := c.Stats(ctxT(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := sr.Streams[0]; s.LostEvents != big-first+1 || !s.LossPending {
		t.Fatalf("after the episode grew: lost=%d ranges=%+v pending=%v; want %d lost, still pending in the header", s.LostEvents, s.LostRanges, s.LossPending, big-first+1)
	}
	next := big + 1
	p.mustPublish(stored(next, 0, nil, []uint64{1000 + next}, tokens(uint32(next), 1, p.bs))) // carries LOSS first..big
	s := checkStats(t, ts.SocketPath(), 4, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == next })
	if s.LostEvents != big-first+1 || s.LossPending {
		t.Fatalf("after the LOSS record: lost=%d ranges=%+v pending=%v; want %d lost once", s.LostEvents, s.LostRanges, s.LossPending, big-first+1)
	}
	code, h, body := httpGet(t, ts.HTTPAddr(), "/kv_recover?start=&end=")
	if want := oracleJSON(t, p, nil, nil, nil); code != http.StatusOK || body != string(want) || h.Get(HeaderState) != "incomplete" {
		t.Fatalf("dump = %d %v %.200s, want the oracle's incomplete dump %.200s", code, h, body, want)
	}
}

// TestKnownLossAfterSIGSTOP is the soak's first finding as reported, with the real kvshmd: a shared daemon is stopped
// (SIGSTOP), the producer fills its 64 KiB ring and drops 50 events, the daemon continues (SIGCONT) and nothing more
// is published. The very next /kv_recover answer says the dump misses those events (before the fix: a silent
// TreeDump and stats with loss_pending true, tainted false, indefinitely).
func TestKnownLossAfterSIGSTOP(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kvshmd.sock")
	d := startDaemon(t, socket, "--http", "127.0.0.1:0")
	p := newProducer(t, socket, 12, 4, 1<<16)
	p.mustPublish(cleared(0))
	checkStats(t, socket, 12, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == 0 })
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, d.cmd.Process.Pid)
	_, first, last := dropUntil(t, p, 1, 50)
	if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	code, h, body := httpGet(t, d.http, "/kv_recover?start=&end=")
	if code != http.StatusOK || !strings.HasPrefix(body, `{"TreeDump":`) || h.Get(HeaderState) != "incomplete" || h.Get(HeaderLostEvents) != lostRange(first, last) {
		t.Fatalf("first dump after SIGCONT = %d %v %.120s; want an incomplete TreeDump losing %s", code, h, body, lostRange(first, last))
	}
	sr, err := dialT(t, socket).Stats(ctxT(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := sr.Streams[0]; !s.Incomplete || s.LostEvents != 50 || s.DroppedEvents != 50 {
		t.Fatalf("stats after SIGCONT: incomplete=%v lost=%d dropped=%d; want incomplete, 50 lost and dropped", s.Incomplete, s.LostEvents, s.DroppedEvents)
	}
}
