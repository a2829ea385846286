package daemon

import (
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// TestClosedStateWhileLeased is a defect the soak found: a live producer's stream ended without the producer knowing,
// so it published into a ring nobody read (it still reported attached). Only the producer ends its stream (another
// client's DETACH is refused: TestStreams, TestPerRankProducers), and a ring state word that reads CLOSED while
// the producer's connection is open does not end it.
func TestClosedStateWhileLeased(t *testing.T) {
	ts := startServer(t, nil)
	socket := ts.SocketPath()
	q := dialT(t, socket)
	p := newProducer(t, socket, 9, 4, 1<<16)
	p.mustPublish(stored(0, 0, nil, []uint64{1}, tokens(1, 1, 4)))

	// (b) Scribble CLOSED over the state word: the daemon keeps draining what the producer publishes.
	f, err := os.OpenFile(p.path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var word [4]byte
	binary.LittleEndian.PutUint32(word[:], uint32(shm.StateClosed))
	if _, err := f.WriteAt(word[:], 0x48); err != nil { // state: shm/FORMAT.md
		t.Fatal(err)
	}
	time.Sleep(3 * stream.SnapshotPeriod) // past the drain's next look at the header (this waits, it times nothing)
	for seq := uint64(1); seq < 20; seq++ {
		p.mustPublish(stored(seq, 0, u64p(seq), []uint64{seq + 1}, tokens(uint32(seq+1), 1, 4)))
	}
	eventsEqual(t, q, p, u64p(0), "after the state word read CLOSED")
	checkStats(t, socket, 9, func(s sock.StreamStats) bool { return s.Attached })

}
