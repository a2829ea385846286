package daemon

import (
	"fmt"
	"testing"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/proto/sock"
)

// TestDrainPanicContained: a panic while applying one record (injected through stream.ApplyHook) does not crash the
// daemon: it is counted as a malformed event, logged, the history becomes unknown, and the drain continues with
// the next record.
func TestDrainPanicContained(t *testing.T) {
	const worker = 77
	hook := func(w, seq uint64) {
		if w == worker && (seq == 2 || seq == 5) {
			panic(fmt.Sprintf("injected panic at seq %d", seq))
		}
	}
	stream.ApplyHook.Store(&hook)
	t.Cleanup(func() { stream.ApplyHook.Store(nil) })

	ts := startServer(t, nil)
	p := newProducer(t, ts.SocketPath(), worker, 4, 1<<16)
	p.mustPublish(stored(0, 0, nil, []uint64{10}, tokens(0, 1, 4)))
	p.mustPublish(stored(1, 0, u64p(10), []uint64{11}, tokens(4, 1, 4)))
	p.mustPublish(stored(2, 0, u64p(11), []uint64{12}, tokens(8, 1, 4))) // panics
	p.mustPublish(stored(3, 0, nil, []uint64{20}, tokens(20, 1, 4)))
	s := checkStats(t, ts.SocketPath(), worker, func(s sock.StreamStats) bool { return s.EventsReceived >= 3 })
	if s.MalformedEvents != 1 || !s.Tainted || !s.Attached || !s.ProducerAlive {
		t.Fatalf("after the panic: %+v, want 1 malformed event, tainted, producer still attached", s)
	}
	if s.ResidentBlocks != 3 {
		t.Fatalf("resident blocks %d, want 3 (seq 0, 1 and 3; seq 2 was lost to the panic)", s.ResidentBlocks)
	}
	assertIncompleteDump(t, handlerGet(ts.Handler()), "unknown-2") // id 2 (the record that panicked) on is unknown
	// The drain goes on: a second panic is contained too, and a Cleared re-bases the stream.
	p.mustPublish(stored(4, 0, nil, []uint64{30}, tokens(30, 1, 4)))
	p.mustPublish(stored(5, 0, nil, []uint64{40}, tokens(40, 1, 4))) // panics
	p.mustPublish(cleared(6))
	p.mustPublish(stored(7, 0, nil, []uint64{50}, tokens(50, 1, 4)))
	s = checkStats(t, ts.SocketPath(), worker, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == 7 })
	if s.MalformedEvents != 2 || s.Tainted || s.ResidentBlocks != 1 {
		t.Fatalf("after the second panic and a Cleared: %+v, want 2 malformed, untainted, 1 block", s)
	}
	if m := scrape(t, ts.Server); !hasSample(t, m, `kvshm_malformed_events_total{dp_rank="",worker_id="77"} 2`) {
		t.Fatalf("malformed_events_total is not 2:\n%s", m)
	}
}
