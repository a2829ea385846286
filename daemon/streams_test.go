package daemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

func eventsEqual(t *testing.T, c *sock.Client, p *producer, start *uint64, what string) {
	t.Helper()
	got, err := c.Events(ctxT(t), &p.worker, start, nil)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	want, _ := p.oracle.Recover(context.Background(), start, nil)
	if !sameRecovery(t, got, want.JSON) {
		t.Fatalf("%s:\n got %s\nwant %s", what, got, want.JSON)
	}
}

// TestProducerLifecycle walks one worker through death, reattach, conflict, restart with a new epoch and
// detach, checking the defined outcome of each step.
func TestProducerLifecycle(t *testing.T) {
	ts := startServer(t, nil)
	socket := ts.SocketPath()
	q := dialT(t, socket)
	stats := func() sock.StreamStats {
		t.Helper()
		r, err := q.Stats(ctxT(t), u64p(1))
		if err != nil {
			t.Fatal(err)
		}
		return r.Streams[0]
	}

	p := newProducer(t, socket, 1, 4, 1<<16)
	if p.rep.Resumed || p.rep.StreamEpoch != 1 || p.rep.Head != 0 {
		t.Fatalf("first attach = %+v", p.rep)
	}
	for i := range uint64(5) {
		p.mustPublish(stored(i, 0, nil, []uint64{10 + i}, tokens(uint32(i), 1, 4)))
	}
	eventsEqual(t, q, p, u64p(0), "attached")

	// Producer "dies": its attaching connection closes (EOF). Events published just before are still applied
	// (final drain) and the index stays queryable.
	p.mustPublish(stored(5, 0, nil, []uint64{15}, tokens(5, 1, 4)))
	p.conn.Close()
	checkStats(t, socket, 1, func(s sock.StreamStats) bool { return !s.Attached && !s.ProducerAlive })
	eventsEqual(t, q, p, u64p(0), "after producer death")

	// The same ring (same epoch) reattached: the index continues.
	rep := p.attach()
	if !rep.Resumed || rep.StreamEpoch != 1 || rep.Epoch != p.rep.Epoch {
		t.Fatalf("reattach same ring = %+v", rep)
	}
	p.mustPublish(removed(6, 0, 12))
	eventsEqual(t, q, p, u64p(0), "after reattach")
	if s := stats(); s.Tainted || s.Resets != 0 || !s.ProducerAlive {
		t.Fatalf("stats after reattach = %+v", s)
	}

	// A second live producer for the same worker is refused.
	other := filepath.Join(t.TempDir(), "other.ring")
	w2, err := shm.Create(other, shm.Options{Capacity: 1 << 16, WorkerID: 1, KVBlockSize: 4, MaxBufferSize: p.maxBuf})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	c2 := dialT(t, socket)
	_, err = c2.Attach(ctxT(t), sock.AttachRequest{RingPath: other, WorkerID: 1, KVBlockSize: 4, MaxBufferSize: p.maxBuf})
	if !sock.IsCode(err, sock.CodeConflict) {
		t.Fatalf("second live producer: %v, want conflict", err)
	}

	// The producer restarts: a new ring (new epoch) for the same worker resets the stream.
	p.conn.Close()
	checkStats(t, socket, 1, func(s sock.StreamStats) bool { return !s.Attached })
	_ = p.w.Close()
	if err := os.Remove(p.path); err != nil {
		t.Fatal(err)
	}
	p.w, err = shm.Create(p.path, shm.Options{Capacity: 1 << 16, WorkerID: 1, KVBlockSize: 4, MaxBufferSize: p.maxBuf})
	if err != nil {
		t.Fatal(err)
	}
	p.newOracle()
	oldEpoch := p.rep.Epoch
	rep = p.attach()
	if rep.Resumed || rep.StreamEpoch != 2 || rep.Epoch == oldEpoch {
		t.Fatalf("attach after producer restart = %+v", rep)
	}
	p.mustPublish(stored(0, 0, nil, []uint64{77}, tokens(77, 1, 4)))
	eventsEqual(t, q, p, u64p(0), "after producer restart")
	if s := stats(); s.Resets != 1 || s.StreamEpoch != 2 {
		t.Fatalf("stats after restart = %+v", s)
	}

	// DETACH is the producer's own (issue 10, defect 2: another client could end a live producer's stream, which
	// then published into a ring nobody read): from another client it is forbidden; on the producer's ATTACH
	// connection it drains and keeps the index.
	p.mustPublish(stored(1, 0, u64p(77), []uint64{78}, tokens(81, 1, 4)))
	if err := q.Detach(ctxT(t), 1); !sock.IsCode(err, sock.CodeForbidden) {
		t.Fatalf("DETACH of a live producer from another client = %v, want forbidden", err)
	}
	if s := stats(); !s.Attached {
		t.Fatalf("a refused DETACH ended the stream: %+v", s)
	}
	if err := p.conn.Detach(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	// DETACH ends the producer's incarnation: a Cleared after its last event (docs/lifecycle.md).
	p.applyOracle(cleared(2))
	if s := stats(); s.Attached || s.LastEventID == nil || *s.LastEventID != 2 || s.ResidentBlocks != 0 {
		t.Fatalf("stats after detach = %+v, want the end Cleared at id 2 and no block", s)
	}
	eventsEqual(t, q, p, nil, "after detach")

	// Several streams: a null worker_id is ambiguous for queries, STATS lists all.
	p2 := newProducer(t, socket, 2, 4, 1<<16)
	p2.mustPublish(cleared(0))
	if _, err := q.Dump(ctxT(t), nil); !sock.IsCode(err, sock.CodeConflict) {
		t.Fatalf("dump with two streams and no worker_id: %v, want conflict", err)
	}
	if r, err := q.Stats(ctxT(t), nil); err != nil || len(r.Streams) != 2 {
		t.Fatalf("stats of all streams: %+v %v", r, err)
	}
	if _, err := q.Events(ctxT(t), u64p(3), nil, nil); !sock.IsCode(err, sock.CodeNotFound) {
		t.Fatalf("events of an unknown worker: %v, want not_found", err)
	}
}

// TestAttachValidation: every attach precondition has its own clear refusal.
func TestAttachValidation(t *testing.T) {
	ts := startServer(t, nil)
	dir := t.TempDir()
	path := filepath.Join(dir, "r.ring")
	w, err := shm.Create(path, shm.Options{Capacity: 1 << 16, WorkerID: 9, KVBlockSize: 16, MaxBufferSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	link := filepath.Join(dir, "link.ring")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	loose := filepath.Join(dir, "loose.ring")
	wl, err := shm.Create(loose, shm.Options{Capacity: 1 << 16, WorkerID: 9, KVBlockSize: 16, Mode: 0o600})
	if err != nil {
		t.Fatal(err)
	}
	defer wl.Close()
	_ = os.Chmod(loose, 0o622)
	junk := filepath.Join(dir, "junk.ring")
	_ = os.WriteFile(junk, bytes.Repeat([]byte{0xAB}, 8192), 0o600)

	tests := []struct {
		name string
		req  sock.AttachRequest
		code string
		msg  string
	}{
		{"missing file", sock.AttachRequest{RingPath: filepath.Join(dir, "nope"), WorkerID: 9, KVBlockSize: 16}, sock.CodeNotFound, "no such file"},
		{"symlink", sock.AttachRequest{RingPath: link, WorkerID: 9, KVBlockSize: 16}, sock.CodeForbidden, "not a regular file"},
		{"group writable", sock.AttachRequest{RingPath: loose, WorkerID: 9, KVBlockSize: 16}, sock.CodeForbidden, "group/other writable"},
		{"not a ring", sock.AttachRequest{RingPath: junk, WorkerID: 9, KVBlockSize: 16}, sock.CodeBadRequest, "open ring"},
		{"worker mismatch", sock.AttachRequest{RingPath: path, WorkerID: 8, KVBlockSize: 16}, sock.CodeBadRequest, "worker_id"},
		{"block size mismatch", sock.AttachRequest{RingPath: path, WorkerID: 9, KVBlockSize: 32}, sock.CodeBadRequest, "kv_block_size"},
		{"buffer mismatch", sock.AttachRequest{RingPath: path, WorkerID: 9, KVBlockSize: 16, MaxBufferSize: 9}, sock.CodeBadRequest, "max_buffer_size"},
		{"zero block size", sock.AttachRequest{RingPath: path, WorkerID: 9}, sock.CodeBadRequest, "kv_block_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := sock.Dial(ctxT(t), ts.SocketPath())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Attach(ctxT(t), tt.req)
			if !sock.IsCode(err, tt.code) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("attach: %v, want code %s mentioning %q", err, tt.code, tt.msg)
			}
		})
	}
	// After all refusals the valid attach works, and attaching twice on one connection is a conflict.
	c, err := sock.Dial(ctxT(t), ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Attach(ctxT(t), sock.AttachRequest{RingPath: path, WorkerID: 9, KVBlockSize: 16, MaxBufferSize: 8}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Attach(ctxT(t), sock.AttachRequest{RingPath: path, WorkerID: 9, KVBlockSize: 16}); !sock.IsCode(err, sock.CodeConflict) {
		t.Fatalf("second attach on one connection: %v, want conflict", err)
	}
}

// TestRingLossAndCorruption: producer-reported loss (ring full while detached), a corrupt record and a malformed
// event each mark the stream honestly (tainted, counted) and ingest continues after them.
func TestRingLossAndCorruption(t *testing.T) {
	ts := startServer(t, nil)
	socket := ts.SocketPath()
	p := newProducer(t, socket, 4, 4, 1<<16) // 64 KiB: fills quickly
	p.mustPublish(cleared(0))
	if err := p.conn.Detach(ctxT(t), 4); err != nil { // nobody drains now
		t.Fatal(err)
	}
	seq := uint64(1)
	drops := 0
	for drops < 10 {
		if err := p.publish(stored(seq, 0, nil, []uint64{seq}, tokens(uint32(seq), 8, 4)[:4])); err != nil {
			drops++
		}
		seq++
	}
	p.attach() // same ring: resume, drain, then the LOSS record arrives with the next event
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if st := p.w.Stats(); st.Head == st.Tail {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reattached ring was not drained within 10s")
		}
	}
	p.mustPublish(stored(seq, 0, nil, []uint64{seq}, tokens(uint32(seq), 1, 4)))
	s := checkStats(t, socket, 4, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == seq })
	if !s.Tainted || s.LostEvents != 10 || s.DroppedEvents != 10 || len(s.LostRanges) == 0 {
		t.Fatalf("after ring-full loss: %+v, want tainted with 10 lost", s)
	}
	assertIncompleteDump(t, handlerGet(ts.Handler()), "")
	seq++
	p.mustPublish(cleared(seq)) // re-bases
	seq++
	assertDumpPrefix(t, socket, `{"TreeDump":`)

	// A record of an unknown type is corruption: skipped to the tail, counted, history unknown.
	// (Stage a valid record, then overwrite its type word in the file before publishing it.)
	recPos := p.w.Stats().Tail // published tail: the next record starts here unless it needs a wrap
	if recPos%(1<<16)+16 > 1<<16 {
		t.Fatal("test assumption: no wrap padding before the record")
	}
	if !p.w.Append(shm.TypeEvent, []byte("12345678")) {
		t.Fatal("append")
	}
	f, err := os.OpenFile(p.path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{7, 0, 0, 0}, int64(shm.HeaderSize+recPos%(1<<16)+4)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	p.w.Publish()
	s = checkStats(t, socket, 4, func(s sock.StreamStats) bool { return s.CorruptRecords == 1 })
	if !s.Tainted {
		t.Fatalf("after corruption: %+v, want tainted", s)
	}
	// A malformed FlatBuffer in an EVENT record.
	if !p.w.Append(shm.TypeEvent, bytes.Repeat([]byte{0xEE}, 40)) {
		t.Fatal("append")
	}
	p.w.Publish()
	checkStats(t, socket, 4, func(s sock.StreamStats) bool { return s.MalformedEvents == 1 })
	// Ingest continues; a Cleared re-bases again.
	p.mustPublish(cleared(seq))
	s = checkStats(t, socket, 4, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == seq })
	if s.Tainted {
		t.Fatalf("a Cleared after the corruption should re-base: %+v", s)
	}
}

// TestConfigDefaults: a zero Config stands for DefaultConfig (the one home of the defaults kvshmd serve shows).
func TestConfigDefaults(t *testing.T) {
	var c Config
	c.fill()
	if c.Clock == nil {
		t.Fatal("a zero Config has no clock after fill")
	}
	c.Logger, c.Registry, c.Clock = nil, nil, nil
	d := DefaultConfig()
	d.ZMQHeartbeat, d.ZMQReplayFill = 0, 0 // the fields whose zero means off (kvshmd serve's defaults are DefaultConfig's)
	if !reflect.DeepEqual(c, d) {
		t.Fatalf("zero Config filled to\n%+v\nDefaultConfig\n%+v", c, d)
	}
}
