package daemon

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvshm/kvshm/daemon/internal/stream"
)

// TestCheckpointAsyncDrainContinues: while a continuous checkpoint's write is blocked (stream.CheckpointWriteHook), the drain
// keeps applying the records published meanwhile and the ring head stays where it was (the attach head, 0); once
// the write completes the head moves to exactly the checkpoint's position P, not to the read position past it.
func TestCheckpointAsyncDrainContinues(t *testing.T) {
	const worker = 31
	started, unblock := make(chan uint64, 1), make(chan struct{})
	hook := func(head uint64) {
		started <- head
		<-unblock
	}
	stream.CheckpointWriteHook.Store(&hook)
	t.Cleanup(func() { stream.CheckpointWriteHook.Store(nil) })
	state := filepath.Join(t.TempDir(), "state")
	ts := startServer(t, func(c *Config) { c.StateDir, c.CheckpointInterval = state, time.Hour })
	socket := ts.SocketPath()
	p := newProducer(t, socket, worker, 4, ckptRing)

	// Past half the ring: the half-ring trigger starts a checkpoint at P and its writer blocks in the hook.
	next := uint64(0)
	var pos uint64
	for {
		publishAll(p, ckptEvents(next, next+1))
		next++
		select {
		case pos = <-started:
		case <-time.After(10 * time.Millisecond):
			continue
		}
		break
	}
	publishAll(p, ckptEvents(next, next+20)) // applied while the write is blocked
	next += 20
	lastID(t, socket, p, next-1)
	rs := ringPositions(t, p)
	if rs.Head != 0 || pos == 0 || pos >= rs.Tail {
		t.Fatalf("write blocked: head %d tail %d, checkpoint at %d; want head 0 < checkpoint < tail", rs.Head, rs.Tail, pos)
	}
	if _, err := os.Stat(ckptFile(state, p)); !os.IsNotExist(err) {
		t.Fatalf("checkpoint file before its write completed: %v", err)
	}
	close(unblock)
	deadline := time.Now().Add(20 * time.Second)
	for rs = ringPositions(t, p); rs.Head == 0 && time.Now().Before(deadline); rs = ringPositions(t, p) {
		time.Sleep(5 * time.Millisecond)
	}
	if rs.Head != pos {
		t.Fatalf("after the write: head %d, want exactly the checkpoint's position %d (tail %d)", rs.Head, pos, rs.Tail)
	}
	if _, err := os.Stat(ckptFile(state, p)); err != nil {
		t.Fatalf("no checkpoint after its write: %v", err)
	}
}
