package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// ringAt creates a ring of capacity bytes for worker w in dir and returns its path.
func ringAt(t *testing.T, dir string, w, capacity uint64) string {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("w%d.ring", w))
	rw, err := shm.Create(path, shm.Options{Capacity: capacity, WorkerID: w, KVBlockSize: 4, MaxBufferSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	return path
}

// wantLimit fails unless err is a limit reply naming flag.
func wantLimit(t *testing.T, what string, err error, flag string) {
	t.Helper()
	var re *sock.RemoteError
	if !errors.As(err, &re) || re.Code != sock.CodeLimit || !strings.Contains(re.Message, flag) {
		t.Fatalf("%s: %v, want a %q error naming %s", what, err, sock.CodeLimit, flag)
	}
}

// TestAttachBounds: every per-producer bound an ATTACH can exceed is refused with limit, naming the bound's flag;
// vLLM's defaults (buffer_steps 10000, hwm 100000, a 64 MiB ring) pass the default bounds.
func TestAttachBounds(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.Bounds = Bounds{MaxBufferSteps: 100, MaxHWM: 50, MaxRingBytes: 1 << 20}
	})
	dir := t.TempDir()
	rep := "ipc://" + filepath.Join(dir, "replay.sock")
	pub := func(hwm, steps int) *sock.Publish {
		return &sock.Publish{Endpoint: "ipc://" + filepath.Join(dir, "pub.sock"), ReplayEndpoint: &rep, HWM: hwm, BufferSteps: steps}
	}
	for _, c := range []struct {
		name     string
		capacity uint64
		publish  *sock.Publish
		flag     string // "" = accepted
	}{
		{"ring beyond --max-ring-bytes", 2 << 20, nil, "--max-ring-bytes"},
		{"buffer_steps 2^31-1", 1 << 16, pub(10, 1<<31-1), "--max-buffer-steps"},
		{"buffer_steps just beyond", 1 << 16, pub(10, 101), "--max-buffer-steps"},
		{"hwm beyond", 1 << 16, pub(51, 10), "--max-hwm"},
		{"within every bound", 1 << 20, pub(50, 100), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := uint64(len(c.name))
			path := ringAt(t, t.TempDir(), w, c.capacity)
			cl := dialT(t, ts.SocketPath())
			_, err := cl.Attach(ctxT(t), sock.AttachRequest{RingPath: path, WorkerID: w, KVBlockSize: 4, MaxBufferSize: 1024,
				Publish: c.publish})
			if c.flag == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantLimit(t, c.name, err, c.flag)
		})
	}

	t.Run("vLLM's defaults pass the default bounds", func(t *testing.T) {
		ts := startServer(t, nil)
		path := ringAt(t, t.TempDir(), 3, 64<<20)
		d := t.TempDir()
		rep := "ipc://" + filepath.Join(d, "r.sock")
		cl := dialT(t, ts.SocketPath())
		if _, err := cl.Attach(ctxT(t), sock.AttachRequest{RingPath: path, WorkerID: 3, KVBlockSize: 4, MaxBufferSize: 1024,
			Publish: &sock.Publish{Endpoint: "ipc://" + filepath.Join(d, "p.sock"), ReplayEndpoint: &rep, HWM: 100000,
				BufferSteps: 10000}}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestPeerBounds: a peer (uid+pid) beyond --max-conns-per-peer gets a limit frame at connect; beyond
// --max-streams-per-peer its ATTACH is refused; a stream ended frees its place.
func TestPeerBounds(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.Bounds = Bounds{MaxConnsPerPeer: 4, MaxStreamsPerPeer: 2} })
	var conns []*sock.Client
	for range 4 {
		c := dialT(t, ts.SocketPath())
		if _, err := c.Health(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	frames, closed := rawExchange(t, ts.SocketPath(), nil, false, nil)
	if len(frames) != 1 || errCode(t, frames[0]) != sock.CodeLimit || !closed ||
		!strings.Contains(string(frames[0].Body), "--max-conns-per-peer") {
		t.Fatalf("fifth connection: %d frames %v closed=%v, want one limit error naming --max-conns-per-peer", len(frames),
			frames, closed)
	}
	dir := t.TempDir()
	var third string
	for i, c := range conns[:3] {
		w := uint64(10 + i)
		third = ringAt(t, dir, w, 1<<16)
		_, err := c.Attach(ctxT(t), sock.AttachRequest{RingPath: third, WorkerID: w, KVBlockSize: 4,
			MaxBufferSize: 1024})
		if i < 2 && err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			wantLimit(t, "third stream", err, "--max-streams-per-peer")
		}
	}
	conns[0].Close() // its stream ends: a place frees up
	statsOn(t, conns[3], 10, func(s sock.StreamStats) bool { return !s.Attached })
	if _, err := conns[2].Attach(ctxT(t), sock.AttachRequest{RingPath: third, WorkerID: 12,
		KVBlockSize: 4, MaxBufferSize: 1024}); err != nil {
		t.Fatalf("attach after a stream ended: %v", err)
	}
}

// TestHostileProducerCannotStopAnother: one producer process takes every connection it may, attaches every stream
// it may and asks for huge rings and replay buffers; another producer process still attaches and its stream is
// served. Before the per-peer bounds the hostile one took all --max-conns connections and the other got busy (and
// buffer_steps 2^31-1 killed the daemon with a 64 GiB allocation).
func TestHostileProducerCannotStopAnother(t *testing.T) {
	ts := startServer(t, func(c *Config) {
		c.MaxConns = 16
		c.Bounds = Bounds{MaxConnsPerPeer: 8, MaxStreamsPerPeer: 4, MaxRingBytes: 1 << 20}
	})
	// The hostile peer is this process: every connection it can get, then every stream, then huge asks.
	var hostile []*sock.Client
	for len(hostile) < 32 {
		c, err := sock.Dial(ctxT(t), ts.SocketPath())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Health(ctxT(t)); err != nil {
			c.Close()
			break
		}
		hostile = append(hostile, c)
		t.Cleanup(func() { c.Close() })
	}
	dir := t.TempDir()
	d := t.TempDir()
	rep := "ipc://" + filepath.Join(d, "r.sock")
	for i, c := range hostile {
		w := uint64(100 + i)
		path := ringAt(t, dir, w, 1<<16)
		req := sock.AttachRequest{RingPath: path, WorkerID: w, KVBlockSize: 4, MaxBufferSize: 1024}
		if i%2 == 1 {
			req.Publish = &sock.Publish{Endpoint: "ipc://" + filepath.Join(d, fmt.Sprintf("p%d.sock", w)),
				ReplayEndpoint: &rep, HWM: 1 << 30, BufferSteps: 1<<31 - 1}
		}
		_, _ = c.Attach(ctxT(t), req) // some attach, the rest are refused
	}
	huge := ringAt(t, dir, 99, 64<<20)
	if len(hostile) > 0 {
		_, err := hostile[len(hostile)-1].Attach(ctxT(t), sock.AttachRequest{RingPath: huge, WorkerID: 99, KVBlockSize: 4,
			MaxBufferSize: 1024})
		if err == nil {
			t.Fatal("a 64 MiB ring was accepted beyond --max-ring-bytes 1 MiB")
		}
	}

	// The other producer: a process of its own (producerMain) attaches worker 21 and publishes.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "KVSHMD_TEST_PRODUCER=1", "KVSHMD_TEST_SOCKET="+ts.SocketPath(),
		"KVSHMD_TEST_RING="+filepath.Join(t.TempDir(), "victim.ring"), "KVSHMD_TEST_EVENTS=50")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "published\n" {
		t.Fatalf("the other producer (%d hostile connections): %q %v\n%s", len(hostile), line, err, stderr.String())
	}
	// The last hostile connection's ATTACH was refused: it can still query.
	st := statsOn(t, hostile[len(hostile)-1], 21, func(s sock.StreamStats) bool {
		return s.LastEventID != nil && *s.LastEventID == n-1
	})
	if !st.Attached {
		t.Fatalf("the other producer's stream: %+v", st)
	}
}

// statsOn polls worker's stats on c until ok (a hang guard of 10 s).
func statsOn(t *testing.T, c *sock.Client, worker uint64, ok func(sock.StreamStats) bool) sock.StreamStats {
	t.Helper()
	var last sock.StreamStats
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		r, err := c.Stats(ctxT(t), &worker)
		if err != nil {
			t.Fatal(err)
		}
		if last = r.Streams[0]; ok(last) {
			return last
		}
	}
	t.Fatalf("worker %d: stats %+v", worker, last)
	return last
}

// TestZmqCutAndIncompleteMetrics: a publishing stream exports zmqpub's replay-incomplete and cut counters.
func TestZmqCutAndIncompleteMetrics(t *testing.T) {
	ts := startServer(t, nil)
	d := t.TempDir()
	rep := "ipc://" + filepath.Join(d, "r.sock")
	cl := dialT(t, ts.SocketPath())
	if _, err := cl.Attach(ctxT(t), sock.AttachRequest{RingPath: ringAt(t, t.TempDir(), 5, 1<<16), WorkerID: 5,
		KVBlockSize: 4, MaxBufferSize: 1024, Publish: &sock.Publish{Endpoint: "ipc://" + filepath.Join(d, "p.sock"),
			ReplayEndpoint: &rep, HWM: 10, BufferSteps: 10}}); err != nil {
		t.Fatal(err)
	}
	m := scrape(t, ts.Server)
	for _, name := range []string{"kvshm_zmq_replay_incomplete_total", "kvshm_zmq_subscribers_cut_total",
		"kvshm_zmq_replay_clients_cut_total"} {
		if want := name + `{dp_rank="",worker_id="5"} 0`; !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestZmqConnsPerAddr: --zmq-conns-per-addr reaches the stream's sockets, and a connection past it is counted in
// kvshm_zmq_peers_cut_total{reason="addr_conns"} (zmqpub/doc.go has the bound's tests).
func TestZmqConnsPerAddr(t *testing.T) {
	ts := startServer(t, func(c *Config) { c.Bounds.ZmqConnsPerAddr = 1 })
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cl := dialT(t, ts.SocketPath())
	if _, err := cl.Attach(ctxT(t), sock.AttachRequest{RingPath: ringAt(t, t.TempDir(), 5, 1<<16), WorkerID: 5,
		KVBlockSize: 4, MaxBufferSize: 1024, Publish: &sock.Publish{Endpoint: fmt.Sprintf("tcp://*:%d", port)}}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the first is held (its handshake waits), the second is past the address's share of 1
		c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	want := `kvshm_zmq_peers_cut_total{dp_rank="",reason="addr_conns",worker_id="5"} 1`
	deadline := time.Now().Add(20 * time.Second) // a hang guard
	for m := scrape(t, ts.Server); !strings.Contains(m, want); m = scrape(t, ts.Server) {
		if time.Now().After(deadline) {
			t.Fatalf("metrics lack %s:\n%s", want, grepLines(m, "kvshm_zmq_peers_cut_total"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
