package daemon

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/internal/wiretest"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

var verbose = flag.Bool("daemon.log", false, "show daemon logs in tests")

// otherUserBin plays another local user in the tests that run a process as another uid (testdata/otheruser).
var otherUserBin string

// drainFallback runs every in-process server's drain workers in the fallback (one worker per ring on
// Reader.Park), as on a kernel without futex_waitv: go test ./daemon/ -args -drain-fallback.
var drainFallback = flag.Bool("drain-fallback", false, "drain with one worker per ring on Reader.Park (no futex_waitv)")

// kvshmdBin is the kvshmd binary built by TestMain for tests that need a real process.
var kvshmdBin string

func TestMain(m *testing.M) {
	if os.Getenv("KVSHMD_TEST_PRODUCER") != "" {
		os.Exit(producerMain())
	}
	flag.Parse()
	dir, err := os.MkdirTemp("", "kvshmd-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// World-readable so a setuid child (TestOtherUID) can execute it.
	_ = os.Chmod(dir, 0o755)
	kvshmdBin = filepath.Join(dir, "kvshmd")
	otherUserBin = filepath.Join(dir, "otheruser")
	for bin, pkg := range map[string]string{kvshmdBin: "../cmd/kvshmd", otherUserBin: "./testdata/otheruser"} {
		out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", pkg, err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// ---- in-process server ----------------------------------------------------------------------------------------

type testServer struct {
	*Server
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startServer(t testing.TB, mod func(*Config)) *testServer {
	t.Helper()
	cfg := Config{SocketPath: filepath.Join(t.TempDir(), "s", "kvshmd.sock"), Logger: testLogger(t)}
	cfg.Drain.NoWaitv = *drainFallback
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: s, cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- s.Serve(ctx) }()
	t.Cleanup(func() { ts.stop(t) })
	return ts
}

// stop shuts the server down once (a test may stop it before its cleanup does).
func (ts *testServer) stop(t testing.TB) {
	ts.once.Do(func() { ts.stopOnce(t) })
}

func (ts *testServer) stopOnce(t testing.TB) {
	ts.cancel()
	select {
	case err, ok := <-ts.done:
		if ok && err != nil {
			t.Errorf("Serve returned %v", err)
		}
		close(ts.done)
	case <-time.After(30 * time.Second):
		t.Error("server did not shut down within 30s")
	}
}

// ---- real process -----------------------------------------------------------------------------------------------

type daemonProc struct {
	cmd    *exec.Cmd
	socket string
	http   string
	log    *testenv.SyncBuffer
	waited chan struct{}
	err    error
}

// startDaemon runs `kvshmd serve --socket SOCKET args...` and waits until it answers HEALTH. The HTTP address
// (when args contain --http 127.0.0.1:0) is read from the log.
func startDaemon(t testing.TB, socket string, args ...string) *daemonProc {
	t.Helper()
	p := &daemonProc{socket: socket, log: &testenv.SyncBuffer{}, waited: make(chan struct{})}
	p.cmd = exec.Command(kvshmdBin, append([]string{"serve", "--socket", socket}, args...)...)
	p.cmd.Stderr = p.log
	if *verbose {
		p.cmd.Stderr = io.MultiWriter(p.log, os.Stderr)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.waited) }()
	t.Cleanup(func() { p.terminate(t) })
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := sock.Dial(ctx, socket)
		if err == nil {
			_, err = c.Health(ctx)
			c.Close()
		}
		cancel()
		if err == nil {
			break
		}
		select {
		case <-p.waited:
			t.Fatalf("kvshmd exited before answering HEALTH: %v\n%s", p.err, p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("kvshmd did not answer HEALTH within 20s: %v\n%s", err, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, a := range args {
		if strings.HasPrefix(a, "127.0.0.1:") {
			for i := 0; i < 200 && p.http == ""; i++ {
				if _, after, ok := strings.Cut(p.log.String(), "http="); ok {
					p.http = strings.Fields(after)[0]
				} else {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
	}
	return p
}

// terminate sends SIGTERM and waits for the exit; it returns the exit code.
func (p *daemonProc) terminate(t testing.TB) int {
	select {
	case <-p.waited:
		return p.cmd.ProcessState.ExitCode()
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // in case a test left it stopped
	select {
	case <-p.waited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.waited
		t.Errorf("kvshmd ignored SIGTERM for 30s\n%s", p.log)
	}
	return p.cmd.ProcessState.ExitCode()
}

// waitLog waits until the daemon's output contains want: the daemon logs a refusal after sending it, so a client
// can see the refusal before the log line has crossed the pipe. Fails the test after a generous bound.
func (p *daemonProc) waitLog(t testing.TB, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.log.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon log lacks %q:\n%s", want, p.log)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *daemonProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.waited
}

func (p *daemonProc) waitExit(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.waited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("kvshmd still running after %v\n%s", d, p.log)
		return -1
	}
}

// ---- producer with an oracle ----------------------------------------------------------------------------------

// producer writes events into a real ring attached to a daemon and applies the same events to an oracle index.
type producer struct {
	t      testing.TB
	w      *shm.Writer
	conn   *sock.Client
	socket string
	path   string
	worker uint64
	rank   *uint32 // AttachRequest.dp_rank (nil: an ALL stream)
	bs     uint32
	maxBuf uint32
	oracle *index.Indexer
	b      *flatbuffers.Builder
	rep    sock.AttachReply
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newProducer(t testing.TB, socket string, worker uint64, bs uint32, capacity uint64) *producer {
	t.Helper()
	return newRankProducer(t, socket, worker, nil, bs, capacity)
}

// newRankProducer is newProducer attaching with AttachRequest.dp_rank = rank (nil: scope ALL).
func newRankProducer(t testing.TB, socket string, worker uint64, rank *uint32, bs uint32, capacity uint64) *producer {
	t.Helper()
	p := &producer{t: t, socket: socket, worker: worker, rank: rank, bs: bs, maxBuf: 1024, b: flatbuffers.NewBuilder(1024)}
	name := fmt.Sprintf("w%d.ring", worker)
	if rank != nil {
		name = fmt.Sprintf("w%d-r%d.ring", worker, *rank)
	}
	p.path = filepath.Join(t.TempDir(), name)
	w, err := shm.Create(p.path, shm.Options{Capacity: capacity, WorkerID: worker, KVBlockSize: bs, MaxBufferSize: p.maxBuf})
	if err != nil {
		t.Fatal(err)
	}
	p.w = w
	t.Cleanup(func() { _ = p.w.Close() })
	p.newOracle()
	p.attach()
	return p
}

func (p *producer) newOracle() {
	ix, err := index.New(index.Config{WorkerID: p.worker, BlockSize: p.bs, MaxBufferSize: int(p.maxBuf)})
	if err != nil {
		p.t.Fatal(err)
	}
	p.oracle = ix
}

// attach opens a new attaching connection (closing the previous one first).
func (p *producer) attach() sock.AttachReply {
	p.t.Helper()
	if p.conn != nil {
		p.conn.Close()
	}
	c, err := sock.Dial(ctxT(p.t), p.socket)
	if err != nil {
		p.t.Fatal(err)
	}
	p.conn = c
	p.t.Cleanup(func() { c.Close() })
	rep, err := c.Attach(ctxT(p.t), sock.AttachRequest{RingPath: p.path, WorkerID: p.worker, KVBlockSize: p.bs, MaxBufferSize: p.maxBuf, DpRank: p.rank})
	if err != nil {
		p.t.Fatalf("attach: %v", err)
	}
	p.rep = rep
	return rep
}

// publish encodes ev into the ring; when ok it also feeds the oracle (a dropped event is not applied anywhere).
func (p *producer) publish(ev fbs.EventSpec) error {
	payload := fbs.Build(p.b, &ev)
	if err := p.w.WriteEvent(ev.Seq, payload); err != nil {
		return err
	}
	p.applyOracle(ev)
	return nil
}

func (p *producer) applyOracle(ev fbs.EventSpec) {
	switch ev.Kind {
	case fbs.KindStored:
		_, _ = p.oracle.ApplyStoredTokens(ev.Seq, ev.DpRank, ev.HasParent, ev.ParentHash, wiretest.LE64(ev.BlockHashes), wiretest.LE32(ev.TokenIDs), []byte(ev.LoraName), ev.IsEagle)
	case fbs.KindRemoved:
		_, _ = p.oracle.Apply(&index.Event{ID: ev.Seq, DpRank: ev.DpRank, Kind: index.KindRemoved, Hashes: ev.BlockHashes})
	case fbs.KindCleared:
		_, _ = p.oracle.Apply(&index.Event{ID: ev.Seq, DpRank: ev.DpRank, Kind: index.KindCleared})
	}
}

func (p *producer) mustPublish(ev fbs.EventSpec) {
	p.t.Helper()
	if err := p.publish(ev); err != nil {
		p.t.Fatalf("publish seq %d: %v", ev.Seq, err)
	}
}

// tokens returns n*bs deterministic token ids starting at base.
func tokens(base uint32, nblocks int, bs uint32) []uint32 {
	out := make([]uint32, nblocks*int(bs))
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func stored(seq uint64, dp uint32, parent *uint64, hashes []uint64, toks []uint32) fbs.EventSpec {
	ev := fbs.EventSpec{Seq: seq, DpRank: dp, Kind: fbs.KindStored, BlockHashes: hashes, TokenIDs: toks}
	if parent != nil {
		ev.HasParent, ev.ParentHash = true, *parent
	}
	return ev
}

func removed(seq uint64, dp uint32, hashes ...uint64) fbs.EventSpec {
	return fbs.EventSpec{Seq: seq, DpRank: dp, Kind: fbs.KindRemoved, BlockHashes: hashes}
}

func cleared(seq uint64) fbs.EventSpec { return fbs.EventSpec{Seq: seq, Kind: fbs.KindCleared} }

func u64p(v uint64) *uint64 { return &v }

func u32p(v uint32) *uint32 { return &v }

// dialT connects a query client to socket, failing the test if it cannot, and closes it when the test ends.
func dialT(t testing.TB, socket string) *sock.Client {
	t.Helper()
	c, err := sock.Dial(ctxT(t), socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// frameBytes is a frame with any header fields, including the malformed ones sock.AppendHeader never writes.
func frameBytes(length uint32, ver, kind byte, status uint16, body []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, length)
	b = append(b, ver, kind)
	b = binary.LittleEndian.AppendUint16(b, status)
	return append(b, body...)
}

// startPiped starts cmd (stderr to the test's) with its stdin and stdout piped to the test.
func startPiped(t testing.TB, cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser) {
	t.Helper()
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return in, out
}
