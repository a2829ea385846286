package daemon

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvshm/kvshm/proto/sock"
)

// scrape returns the /metrics text of an in-process server.
func scrape(t *testing.T, s *Server) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, err := io.ReadAll(rec.Result().Body)
	if err != nil || rec.Code != 200 {
		t.Fatalf("/metrics: status %d, err %v", rec.Code, err)
	}
	return string(b)
}

// TestForget: FORGET is refused while the producer is attached, then drops the stream, its index and every metric
// series of the worker; the other worker is untouched and the forgotten worker can attach again from scratch.
func TestForget(t *testing.T) {
	ts := startServer(t, nil)
	socket := ts.SocketPath()
	q := dialT(t, socket)

	p1 := newProducer(t, socket, 1, 4, 1<<16)
	p2 := newProducer(t, socket, 2, 4, 1<<16)
	p1.mustPublish(stored(0, 0, nil, []uint64{10}, tokens(0, 1, 4)))
	p2.mustPublish(stored(0, 0, nil, []uint64{20}, tokens(0, 1, 4)))
	if _, err := q.Dump(ctxT(t), u64p(1)); err != nil { // creates the recovery series of worker 1
		t.Fatal(err)
	}

	tests := []struct {
		name string
		body string
		code string
	}{
		{"no worker_id", `{}`, sock.CodeBadRequest},
		{"null worker_id", `{"worker_id":null}`, sock.CodeBadRequest},
		{"unknown field", `{"worker":1}`, sock.CodeBadRequest},
		{"unknown worker", `{"worker_id":7}`, sock.CodeNotFound},
		{"attached producer", `{"worker_id":1}`, sock.CodeConflict},
	}
	for _, tt := range tests {
		if _, err := q.Do(ctxT(t), sock.KindForget, []byte(tt.body)); !sock.IsCode(err, tt.code) {
			t.Errorf("%s: FORGET %s = %v, want code %s", tt.name, tt.body, err, tt.code)
		}
	}
	if r, err := q.Stats(ctxT(t), u64p(1)); err != nil || len(r.Streams) != 1 || r.Streams[0].ResidentBlocks != 1 {
		t.Fatalf("refused FORGET changed the stream: %+v %v", r, err)
	}

	// The producer dies: the stream stays queryable until forgotten.
	p1.conn.Close()
	checkStats(t, socket, 1, func(s sock.StreamStats) bool { return !s.Attached && !s.ProducerAlive })
	if m := scrape(t, ts.Server); !strings.Contains(m, `worker_id="1"`) {
		t.Fatalf("metrics lack worker 1 before FORGET:\n%s", m)
	}
	if err := q.Forget(ctxT(t), 1); err != nil {
		t.Fatalf("FORGET of a dead producer's stream: %v", err)
	}
	if _, err := q.Stats(ctxT(t), u64p(1)); !sock.IsCode(err, sock.CodeNotFound) {
		t.Fatalf("STATS after FORGET = %v, want not_found", err)
	}
	if _, err := q.Dump(ctxT(t), u64p(1)); !sock.IsCode(err, sock.CodeNotFound) {
		t.Fatalf("DUMP after FORGET = %v, want not_found", err)
	}
	if err := q.Forget(ctxT(t), 1); !sock.IsCode(err, sock.CodeNotFound) {
		t.Fatalf("second FORGET = %v, want not_found", err)
	}
	m := scrape(t, ts.Server)
	if strings.Contains(m, `worker_id="1"`) {
		t.Fatalf("metrics still carry worker 1 after FORGET:\n%s", m)
	}
	if !strings.Contains(m, `kvshm_producer_up{dp_rank="",worker_id="2"} 1`) || !strings.Contains(m, "kvshm_streams 1") {
		t.Fatalf("metrics of worker 2 or the stream count are wrong after forgetting worker 1:\n%s", m)
	}
	// With one stream left, worker_id null selects it.
	if _, err := q.Dump(ctxT(t), nil); err != nil {
		t.Fatalf("DUMP without worker_id after FORGET: %v", err)
	}

	// The same ring attaches again: a new stream (epoch 1) that knows it resumed someone else's ring.
	rep := p1.attach()
	if rep.StreamEpoch != 1 || !rep.Resumed {
		t.Fatalf("attach after FORGET = %+v, want a fresh stream resuming the ring", rep)
	}
}
