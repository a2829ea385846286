package daemon

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/internal/wiretest"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// procEvents is what the producer process publishes: a chain of stores on dp_rank 0, one block each.
func procEvents(n int) []fbs.EventSpec {
	evs := make([]fbs.EventSpec, n)
	for i := range evs {
		evs[i] = procEvent(i)
	}
	return evs
}

// procEvent is the i-th event of procEvents.
func procEvent(i int) fbs.EventSpec {
	var parent *uint64
	if i > 0 {
		parent = u64p(uint64(1000 + i - 1))
	}
	return stored(uint64(i), 0, parent, []uint64{uint64(1000 + i)}, tokens(uint32(4*i), 1, 4))
}

// producerMain runs in a child process (the test binary re-executed with KVSHMD_TEST_PRODUCER=1): it creates a
// ring, attaches (asking for ZMQ publishing on KVSHMD_TEST_PUBLISH, replay on KVSHMD_TEST_REPLAY, when set),
// publishes KVSHMD_TEST_EVENTS events, says "published"; then each stdin line "pub K" publishes the next K events
// of the chain and says "ok". It waits to be killed.
func producerMain() int {
	socket, path := os.Getenv("KVSHMD_TEST_SOCKET"), os.Getenv("KVSHMD_TEST_RING")
	n, _ := strconv.Atoi(os.Getenv("KVSHMD_TEST_EVENTS"))
	var pub *sock.Publish
	if ep := os.Getenv("KVSHMD_TEST_PUBLISH"); ep != "" {
		rep := os.Getenv("KVSHMD_TEST_REPLAY")
		pub = &sock.Publish{Endpoint: ep, ReplayEndpoint: &rep, HWM: 100000, BufferSteps: 1000}
	}
	w, err := shm.Create(path, shm.Options{Capacity: 1 << 20, WorkerID: 21, KVBlockSize: 4, MaxBufferSize: 1024})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := sock.Dial(context.Background(), socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := c.Attach(context.Background(), sock.AttachRequest{RingPath: path, WorkerID: 21, KVBlockSize: 4, MaxBufferSize: 1024, Publish: pub}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b := flatbuffers.NewBuilder(1024)
	for _, ev := range procEvents(n) {
		if err := w.WriteEvent(ev.Seq, fbs.Build(b, &ev)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Println("published")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var k int
		if _, err := fmt.Sscanf(sc.Text(), "pub %d", &k); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for range k {
			ev := procEvent(n)
			n++
			if err := w.WriteEvent(ev.Seq, fbs.Build(b, &ev)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		fmt.Println("ok")
	}
	select {}
}

// TestProducerProcessKilled: a real producer process attaches, publishes and is SIGKILLed; the daemon notices
// (socket EOF and its pid gone), drains what was published, marks the producer dead, and ends its incarnation: the
// index applies a Cleared after its last event (docs/lifecycle.md: /kv_recover never holds a dead engine's blocks), and
// the events answer holds every event and that Cleared.
func TestProducerProcessKilled(t *testing.T) {
	ts := startServer(t, nil)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ring := filepath.Join(t.TempDir(), "proc.ring")
	const n = 300
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "KVSHMD_TEST_PRODUCER=1", "KVSHMD_TEST_SOCKET="+ts.SocketPath(),
		"KVSHMD_TEST_RING="+ring, "KVSHMD_TEST_EVENTS="+strconv.Itoa(n))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "published\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("producer process: %q %v\n%s", line, err, stderr.String())
	}
	st := checkStats(t, ts.SocketPath(), 21, func(s sock.StreamStats) bool { return s.Attached })
	if st.ProducerPID != uint32(cmd.Process.Pid) {
		t.Errorf("producer pid %d, want %d", st.ProducerPID, cmd.Process.Pid)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	st = checkStats(t, ts.SocketPath(), 21, func(s sock.StreamStats) bool { return !s.Attached && !s.ProducerAlive })
	st = checkStats(t, ts.SocketPath(), 21, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == n })
	if st.Tainted || st.ResidentBlocks != 0 || st.EventsReceived != n {
		t.Fatalf("after the producer died: %+v, want all %d events applied, then a Cleared at id %d", st, n, n)
	}
	oracle, _ := index.New(index.Config{WorkerID: 21, BlockSize: 4, MaxBufferSize: 1024})
	for _, ev := range procEvents(n) {
		_, _ = oracle.ApplyStoredTokens(ev.Seq, 0, ev.HasParent, ev.ParentHash, wiretest.LE64(ev.BlockHashes), wiretest.LE32(ev.TokenIDs), nil, false)
	}
	_, _ = oracle.Apply(&index.Event{ID: n, Kind: index.KindCleared})
	c, err := sock.Dial(ctxT(t), ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, start := range []*uint64{nil, u64p(0), u64p(n - 10)} {
		got, err := c.Events(ctxT(t), u64p(21), start, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := oracle.Recover(context.Background(), start, nil)
		if !sameRecovery(t, got, want.JSON) {
			t.Fatalf("events %v after the producer died:\n got %.300s\nwant %.300s", start, got, want.JSON)
		}
	}
}
