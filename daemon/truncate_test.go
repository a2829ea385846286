package daemon

import (
	"os"
	"testing"
	"time"

	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// TestTruncatedRing is a defect the soak found, on the daemon's side: a ring file truncated under a running shared
// daemon killed it with SIGBUS (every worker down). Now the fault ends only that attachment (counted, logged, the
// history after it marked unknown, the producer's connection closed) and the daemon serves the other workers.
func TestTruncatedRing(t *testing.T) {
	t.Run("to nothing", func(t *testing.T) {
		testenv.SkipIfEmulated(t, testenv.SIGBUSAddress)
		truncatedRing(t, 0)
	})
	// Found by the soak suite: the header page survives, so an idle drain goroutine (it reads only header words)
	// never faults; its periodic size check ends the stream instead, or the producer's drops would go unreported.
	t.Run("header page kept", func(t *testing.T) { truncatedRing(t, 2*shm.HeaderSize) })
}

func truncatedRing(t *testing.T, size int64) {
	ts := startServer(t, nil)
	socket := ts.SocketPath()
	q := dialT(t, socket)
	victim := newProducer(t, socket, 30, 4, 1<<16)
	other := newProducer(t, socket, 31, 4, 1<<16)
	for seq := uint64(0); seq < 5; seq++ {
		victim.mustPublish(stored(seq, 0, parentOf(seq), []uint64{seq + 1}, tokens(uint32(seq), 1, 4)))
		other.mustPublish(stored(seq, 0, parentOf(seq), []uint64{seq + 1}, tokens(uint32(seq), 1, 4)))
	}
	fi, err := os.Stat(victim.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(victim.path, size); err != nil {
		t.Fatal(err)
	}
	// The test's Go producer would fault too when it closes (the Python producer guards itself: pybind's
	// test_truncated_ring_does_not_kill_the_engine); give its mapping a file again before its cleanup runs.
	t.Cleanup(func() { _ = os.Truncate(victim.path, fi.Size()) })
	// The drain goroutine touches the header within stream.SnapshotPeriod even when idle; waiting for that only orders
	// the test, it times nothing.
	st := checkStats(t, socket, 30, func(s sock.StreamStats) bool { return !s.Attached })
	if st.CorruptRecords == 0 || !st.Incomplete {
		t.Fatalf("victim stream after the fault = %+v, want a corruption counted and the answer incomplete", st)
	}
	_ = victim.conn.Conn().SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := victim.conn.Conn().Read(make([]byte, 1)); err == nil {
		t.Fatal("the victim producer's connection is still open after its ring faulted")
	}
	// The daemon and the other worker go on.
	for seq := uint64(5); seq < 10; seq++ {
		other.mustPublish(stored(seq, 0, parentOf(seq), []uint64{seq + 1}, tokens(uint32(seq), 1, 4)))
	}
	eventsEqual(t, q, other, u64p(0), "the other worker after the victim's ring faulted")
	if _, err := q.Health(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

func parentOf(seq uint64) *uint64 {
	if seq == 0 {
		return nil
	}
	return u64p(seq)
}
