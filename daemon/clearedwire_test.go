package daemon

import (
	"path/filepath"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/vllmwire"
)

// TestStreamKeepsPublishWire: the layout the ATTACH asked for is the stream's for its incarnation Cleareds, on a
// new stream (the first ATTACH creates it with its publisher) and when a re-attach changes it.
func TestStreamKeepsPublishWire(t *testing.T) {
	ts := startServer(t, nil)
	// A producer whose first ATTACH publishes (newProducer's attaches without publish first).
	p := &producer{t: t, socket: ts.cfg.SocketPath, worker: 9, bs: 4, maxBuf: 1024, b: flatbuffers.NewBuilder(1024)}
	p.path = filepath.Join(t.TempDir(), "w9.ring")
	w, err := shm.Create(p.path, shm.Options{Capacity: 1 << 22, WorkerID: 9, KVBlockSize: 4, MaxBufferSize: p.maxBuf})
	if err != nil {
		t.Fatal(err)
	}
	p.w = w
	t.Cleanup(func() { _ = p.w.Close() })
	p.newOracle()
	ep := "ipc://" + filepath.Join(t.TempDir(), "pub.sock")
	wire := func() vllmwire.Wire {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		return vllmwire.Wire(ts.streams[keyOf(9, nil)].PubWire())
	}
	attachPublishing(t, p, &sock.Publish{Endpoint: ep, Topic: "kv", HWM: 1000, BufferSteps: 10, Wire: "array"})
	if w := wire(); w != vllmwire.WireArray {
		t.Fatalf("new stream attached with wire array: the stream's layout is %v", w)
	}
	attachPublishing(t, p, &sock.Publish{Endpoint: ep, Topic: "kv", HWM: 1000, BufferSteps: 10, Wire: "0.32"})
	if w := wire(); w != vllmwire.Wire032 {
		t.Fatalf("re-attached with wire 0.32: the stream's layout is %v", w)
	}
}
