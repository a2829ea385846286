package daemon

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/vllmwire"
)

// TestDaemonRestartLateSubscriber is make e2e-dynamo's kvshmd-restart race at the daemon: a new daemon on the same
// ring publishes the engine's batches as soon as the engine reattaches, before a subscriber of the old daemon's
// PUB is back (dynamo.vllm's relay: libzmq reconnects every 100 ms; it has no replay). The late subscriber gets
// them first, in order, then the live ones (zmqpub, "Late joiners"); before, it got only the live ones.
func TestDaemonRestartLateSubscriber(t *testing.T) {
	ts1 := startServer(t, nil)
	p := newProducer(t, ts1.SocketPath(), 3, 4, 1<<20)
	ep := "ipc://" + filepath.Join(t.TempDir(), "pub.sock")
	cfg := &sock.Publish{Endpoint: ep, Topic: "t", HWM: 1000, BufferSteps: 100}
	attachPublishing(t, p, cfg)
	next := joinProbes(t, p, 1, goSub(t, ep))
	ts1.stop(t)

	ts2 := startServer(t, nil)
	p.conn.Close()
	p.conn, p.socket = nil, ts2.SocketPath()
	if rep := attachPublishing(t, p, cfg); !rep.Resumed {
		t.Fatalf("attach to the new daemon: %+v, want resumed", rep)
	}
	before := nextWire(t, ts2, 3)
	for i := range uint64(3) {
		p.mustPublish(stored(next+i, 0, nil, []uint64{100 + i}, tokens(uint32(i+1), 1, 4)))
	}
	next += 3
	deadline := time.Now().Add(20 * time.Second) // a hang guard
	for nextWire(t, ts2, 3) < before+3 {
		if time.Now().After(deadline) {
			t.Fatal("the new daemon did not publish the 3 batches")
		}
		time.Sleep(time.Millisecond)
	}
	got := goSub(t, ep) // after they were published
	var hashes []uint64
	for deadline := time.Now().Add(5 * time.Second); len(hashes) < 3; { // probes (Cleared) until the join arrives
		if time.Now().After(deadline) {
			t.Fatalf("the late subscriber got block hashes %v, want [100 101 102]", hashes)
		}
		p.mustPublish(cleared(next))
		next++
		select {
		case m := <-got:
			if b := decodeBatch(t, m); len(b.Events) == 1 && b.Events[0].Kind == vllmwire.KindStored {
				hashes = append(hashes, b.Events[0].BlockHashes...)
			}
		case <-time.After(20 * time.Millisecond):
		}
	}
	if hashes[0] != 100 || hashes[1] != 101 || hashes[2] != 102 {
		t.Fatalf("the late subscriber got block hashes %v, want [100 101 102] in order", hashes)
	}
	// One join; it was given the 3 batches and any probe published before it.
	m := scrape(t, ts2.Server)
	joined := 0
	if g := regexp.MustCompile(`kvshm_zmq_late_joined_batches_total\{dp_rank="",worker_id="3"\} (\d+)`).FindStringSubmatch(m); g != nil {
		joined, _ = strconv.Atoi(g[1])
	}
	if !strings.Contains(m, `kvshm_zmq_late_joins_total{dp_rank="",worker_id="3"} 1`) || joined < 3 {
		t.Fatalf("the late join is not in /metrics:\n%s", grepLines(m, "late_join"))
	}
}
