package daemon

import (
	"testing"
)

// TestLazyStreamAttach: attaching a stream nobody subscribes to sets its ring's doorbell level (a quarter of a
// 64 KiB ring: package stream, TestLazyStreams), and the lazy stream is not starved: a record far below the level
// is applied without any query, by the worker's own deadline.
func TestLazyStreamAttach(t *testing.T) {
	ts := startServer(t, nil)
	p := newProducer(t, ts.SocketPath(), 40, 4, 1<<16)
	ts.mu.Lock()
	st := ts.streams[keyOf(40, nil)]
	ts.mu.Unlock()
	_, a := st.Current()
	if got, want := a.Ring().DoorbellLevel(), uint32(16<<10); got != want {
		t.Fatalf("attached stream's doorbell level = %d, want %d", got, want)
	}
	p.mustPublish(stored(0, 0, nil, []uint64{1}, tokens(0, 1, 4))) // ~100 bytes: far below the level
	waitUntil(t, func() bool { return st.Status().Batches > 0 }, "the record applied by the worker's deadline, no query asking")
}
