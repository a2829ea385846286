package daemon

import (
	"testing"
	"time"

	"github.com/kvshm/kvshm/daemon/internal/stream"
)

// TestSyncFastPath: a query finds everything published already applied and answers without a round trip
// to the drain goroutine; while a published record is not yet applied it still waits for it (read-your-writes).
func TestSyncFastPath(t *testing.T) {
	ts := startServer(t, nil)
	socket := ts.SocketPath()
	q := dialT(t, socket)
	p := newProducer(t, socket, 40, 4, 1<<16)
	p.mustPublish(stored(0, 0, nil, []uint64{1}, tokens(0, 1, 4)))
	eventsEqual(t, q, p, u64p(0), "first event")
	ts.mu.Lock()
	st := ts.streams[keyOf(40, nil)]
	ts.mu.Unlock()
	_, a := st.Current()
	deadline := time.Now().Add(30 * time.Second) // a liveness bound: the drain's next pass stores applied
	for !a.AppliedAll() {
		if time.Now().After(deadline) {
			t.Fatal("appliedAll never became true with an empty ring")
		}
		time.Sleep(time.Millisecond)
	}
	waits := a.SyncWaits()
	for range 100 {
		eventsEqual(t, q, p, u64p(0), "idle stream")
	}
	if got := a.SyncWaits() - waits; got != 0 {
		t.Fatalf("%d of 100 queries on a fully applied stream waited for the drain goroutine, want 0", got)
	}

	// Hold the drain goroutine inside event 1: published but not applied.
	entered, release := make(chan struct{}), make(chan struct{})
	hook := func(worker, seq uint64) {
		if worker == 40 && seq == 1 {
			close(entered)
			<-release
		}
	}
	stream.ApplyHook.Store(&hook)
	t.Cleanup(func() { stream.ApplyHook.Store(nil) })
	p.mustPublish(stored(1, 0, u64p(1), []uint64{2}, tokens(4, 1, 4)))
	<-entered
	if a.AppliedAll() {
		t.Fatal("appliedAll is true while a published record is being applied")
	}
	close(release)
	eventsEqual(t, q, p, u64p(0), "after the held event") // waits for it: read-your-writes
}
