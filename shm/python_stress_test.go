package shm_test

// Cross-process tests with a real Python producer (pybind/src/kvshm/_ring.py, driven by
// pybind/tests/tools/ring_stress_producer.py) and the Go Reader plus fbs.Decode, as kvshmd reads rings.
//
//	go test ./shm -run Python                                  # 300k events (~4 s); -short: 30k
//	KVSHM_STRESS_EVENTS=1000000 go test ./shm -run PythonProducerStress   # the million-event run
//
// The Python interpreter is $KVSHM_PYTHON, else the repository's .venv/bin/python (`make venv`). A missing
// interpreter skips the tests, except in CI and `make test`, where it fails them (internal/testenv).

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
)

const (
	producerScript = "../pybind/tests/tools/ring_stress_producer.py"
	eventVectors   = "../testdata/events"
	stressBlock    = 4 // tokens per block in the producer's events
)

func pythonInterpreter(t *testing.T) string {
	t.Helper()
	p := os.Getenv("KVSHM_PYTHON")
	if p == "" {
		abs, err := filepath.Abs("../.venv/bin/python")
		if err != nil {
			t.Fatal(err)
		}
		p = abs
	}
	_, err := os.Stat(p)
	testenv.Require(t, err, "an interpreter with kvshm's dev dependencies", "run `make venv` or set KVSHM_PYTHON")
	return p
}

// producer is a running ring_stress_producer.py.
type producer struct {
	cmd    *exec.Cmd
	path   string
	pid    int
	native bool // the producer publishes through kvshm._ringsync (else the x86-64 pure-Python fallback)
	stdout *bufio.Reader
	stderr bytes.Buffer
	done   chan struct{} // closed when the process has exited
	err    error         // exit status, valid after done
}

func startProducer(t *testing.T, args ...string) *producer {
	t.Helper()
	p := &producer{done: make(chan struct{})}
	p.cmd = exec.Command(pythonInterpreter(t), append([]string{producerScript, "--dir", t.TempDir()}, args...)...)
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start Python producer: %v", err)
	}
	p.stdout = bufio.NewReader(out)
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	type hello struct {
		Path   string `json:"path"`
		PID    int    `json:"pid"`
		Native bool   `json:"native"`
	}
	lines := make(chan string, 1)
	go func() {
		line, _ := p.stdout.ReadString('\n')
		lines <- line
		io.Copy(io.Discard, p.stdout) // the final line is checked through the exit status
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	select {
	case line := <-lines:
		var h hello
		if err := json.Unmarshal([]byte(line), &h); err != nil || h.Path == "" {
			<-p.done
			t.Fatalf("Python producer did not announce its ring (%q): %v\nstderr:\n%s", line, err, p.stderr.String())
		}
		p.path, p.pid, p.native = h.Path, h.PID, h.Native
	case <-time.After(60 * time.Second):
		t.Fatalf("Python producer did not start within 60 s\nstderr:\n%s", p.stderr.String())
	}
	return p
}

func (p *producer) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stressCheck verifies the producer's derived stream (see the producer's docstring) record by record.
type stressCheck struct {
	next    uint64 // next expected event seq
	losses  uint64 // sum of LOSS record counts
	records int
	view    fbs.EventView
}

func (c *stressCheck) record(rec shm.Record) error {
	c.records++
	switch rec.Type {
	case shm.TypeLoss:
		first, last, count, ok := rec.Loss()
		if !ok || first != c.next || last != c.next || count == 0 {
			return fmt.Errorf("LOSS record at %d = {%d, %d, %d}, want {%d, %d, >0} (retries of the next seq)",
				rec.Pos, first, last, count, c.next, c.next)
		}
		c.losses += count
		return nil
	case shm.TypeEvent:
	default:
		return fmt.Errorf("record type %#x at %d", rec.Type, rec.Pos)
	}
	v := &c.view
	if err := fbs.Decode(rec.Payload, v); err != nil {
		return fmt.Errorf("event at %d (seq %d expected): %w", rec.Pos, c.next, err)
	}
	seq := c.next
	if v.Seq != seq {
		return fmt.Errorf("event at %d has seq %d, want %d (seqs must be contiguous)", rec.Pos, v.Seq, seq)
	}
	c.next++
	if v.DpRank != uint32(seq%3) {
		return fmt.Errorf("seq %d: dp_rank %d, want %d", seq, v.DpRank, seq%3)
	}
	nb := int(uint32((seq&0xFFFF)*2654435761) >> 26)
	h0 := seq << 16
	if seq&1 == 1 {
		h0 |= 1 << 63
	}
	kind := fbs.KindStored
	switch {
	case seq%97 == 0:
		kind, nb = fbs.KindCleared, 0
	case seq%7 == 0:
		kind = fbs.KindRemoved
	}
	if v.Kind != kind {
		return fmt.Errorf("seq %d: kind %v, want %v", seq, v.Kind, kind)
	}
	if v.NumBlocks() != nb {
		return fmt.Errorf("seq %d: %d block hashes, want %d", seq, v.NumBlocks(), nb)
	}
	for i := 0; i < nb; i++ {
		if h := v.BlockHash(i); h != h0+uint64(i) {
			return fmt.Errorf("seq %d: block hash %d = %#x, want %#x", seq, i, h, h0+uint64(i))
		}
	}
	if kind != fbs.KindStored {
		return nil
	}
	if !v.HasParent || uint32(v.ParentHash>>32) != uint32(v.ParentHash) || uint32(v.ParentHash) != uint32(seq) {
		return fmt.Errorf("seq %d: parent %v/%#x, want halves equal to %#x (torn 8-byte value?)",
			seq, v.HasParent, v.ParentHash, uint32(seq))
	}
	if v.NumTokens() != nb*stressBlock {
		return fmt.Errorf("seq %d: %d tokens, want %d", seq, v.NumTokens(), nb*stressBlock)
	}
	t0 := uint32(seq % 1000003)
	for j := 0; j < v.NumTokens(); j++ {
		if tok := v.TokenID(j); tok != t0+uint32(j) {
			return fmt.Errorf("seq %d: token %d = %d, want %d", seq, j, tok, t0+uint32(j))
		}
	}
	wantLora := ""
	if seq%5 == 0 {
		wantLora = "lora-0"
	}
	if string(v.LoraName) != wantLora || v.IsEagle {
		return fmt.Errorf("seq %d: lora %q eagle %v, want %q false", seq, v.LoraName, v.IsEagle, wantLora)
	}
	return nil
}

// drain reads records until stop() says so and the ring is empty, releasing every 64 records and backing off
// (50 µs doubling to 200 µs) when empty.
func drain(t *testing.T, r *shm.Reader, c *stressCheck, stop func() bool) {
	t.Helper()
	backoff := 50 * time.Microsecond
	final := false // stop() said true before the last Next: the tail cannot move any more
	for n := 0; ; {
		rec, err := r.Next()
		if errors.Is(err, shm.ErrEmpty) {
			r.Release()
			if final {
				return
			}
			if final = stop(); final {
				continue // one more pass: the producer may have stored the tail after our last load
			}
			time.Sleep(backoff)
			backoff = min(2*backoff, 200*time.Microsecond)
			continue
		}
		if err != nil {
			t.Fatalf("Next after %d records: %v", c.records, err)
		}
		backoff = 50 * time.Microsecond
		if err := c.record(rec); err != nil {
			t.Fatal(err)
		}
		if n++; n%64 == 0 {
			r.Release()
		}
	}
}

func stressEvents(t *testing.T) int {
	if s := os.Getenv("KVSHM_STRESS_EVENTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("KVSHM_STRESS_EVENTS=%q: %v", s, err)
		}
		return n
	}
	if testing.Short() {
		return 30_000
	}
	return 300_000
}

// TestPythonProducerStress: a real Python producer publishes events of random sizes through a 64 KiB ring (many
// thousands of wraparounds, the producer often finds it full) while this process drains it with the Reader:
// contiguous seqs, every byte of every event as derived from its seq, no torn values, every full-ring retry
// reported by a LOSS record and counted in the header.
func TestPythonProducerStress(t *testing.T) {
	n := stressEvents(t)
	p := startProducer(t, "--events", strconv.Itoa(n), "--capacity", strconv.Itoa(64<<10))
	r, err := shm.Open(p.path)
	if err != nil {
		t.Fatalf("open the Python-written ring: %v", err)
	}
	defer r.Close()
	start := time.Now()
	c := &stressCheck{next: 1}
	drain(t, r, c, p.exited)
	if p.err != nil {
		t.Fatalf("Python producer failed: %v\nstderr:\n%s", p.err, p.stderr.String())
	}
	if got := c.next - 1; got != uint64(n) {
		t.Fatalf("read %d events, the producer published %d", got, n)
	}
	st := r.Stats()
	if st.State != shm.StateClosed || st.DroppedEvents != c.losses || st.LossPending || st.ReadPos != st.Tail {
		t.Fatalf("final stats %+v: want state CLOSED, dropped_events == %d (sum of LOSS counts), no pending loss, "+
			"everything read", st, c.losses)
	}
	if wraps := st.Tail / st.Capacity; wraps < 10 {
		t.Fatalf("only %d wraparounds: the test does not exercise the wrap", wraps)
	}
	t.Logf("%d events (%d records, %d MiB, %d wraps, %d full-ring retries) in %v",
		n, c.records, st.Tail>>20, st.Tail/st.Capacity, c.losses, time.Since(start).Round(time.Millisecond))
}

// TestPythonProducerKilled: SIGKILL the Python producer mid-stream; the reader still gets every published record,
// whole, and nothing after the last tail store.
func TestPythonProducerKilled(t *testing.T) {
	readBeforeKill := 30_000
	if testing.Short() {
		readBeforeKill = 5_000
	}
	p := startProducer(t, "--events", "1000000000", "--capacity", strconv.Itoa(64<<10))
	r, err := shm.Open(p.path)
	if err != nil {
		t.Fatalf("open the Python-written ring: %v", err)
	}
	defer r.Close()
	c := &stressCheck{next: 1}
	killed := false
	drain(t, r, c, func() bool {
		if !killed && c.next > uint64(readBeforeKill) {
			if err := p.cmd.Process.Kill(); err != nil { // SIGKILL, at an arbitrary point of a publish
				t.Fatal(err)
			}
			<-p.done
			killed = true
		}
		return killed
	})
	if p.exited() && p.err == nil {
		t.Fatalf("the producer finished before it was killed")
	}
	st := r.Stats()
	if st.State != shm.StateReady {
		t.Fatalf("state %v after SIGKILL, want READY (the producer never closed)", st.State)
	}
	if st.ReadPos != st.Tail {
		t.Fatalf("read up to %d, tail is %d", st.ReadPos, st.Tail)
	}
	if _, err := r.Next(); !errors.Is(err, shm.ErrEmpty) {
		t.Fatalf("Next after the last published record: %v, want ErrEmpty", err)
	}
	t.Logf("killed after %d events; read %d events, all whole", readBeforeKill, c.next-1)
}

// TestPythonRingVectors: a ring written by the Python writer with every shared event vector is read by the Go
// Reader byte for byte; the header says who wrote it; a damaged header is refused.
func TestPythonRingVectors(t *testing.T) {
	p := startProducer(t, "--vectors", eventVectors, "--worker-id", "123")
	<-p.done
	if p.err != nil {
		t.Fatalf("Python producer failed: %v\nstderr:\n%s", p.err, p.stderr.String())
	}
	names, err := filepath.Glob(filepath.Join(eventVectors, "*.json"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no event vectors in %s: %v", eventVectors, err)
	}
	sort.Strings(names)
	r, err := shm.Open(p.path)
	if err != nil {
		t.Fatalf("open the Python-written ring: %v", err)
	}
	defer r.Close()
	h := r.Header()
	if h.State != shm.StateClosed || h.WorkerID != 123 || h.KVBlockSize != stressBlock || h.MaxBufferSize != 1000 ||
		h.ProducerPID != uint32(p.pid) || h.Epoch == 0 || h.ProducerStartTime == 0 || h.Capacity != 64<<10 ||
		h.MaxRecord != 8<<10 {
		t.Fatalf("header %+v", h)
	}
	fi, err := os.Stat(p.path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ring file mode: %v %v, want 0600", fi.Mode(), err)
	}
	var v fbs.EventView
	for _, name := range names {
		want, err := os.ReadFile(strings.TrimSuffix(name, ".json") + ".bin")
		if err != nil {
			t.Fatal(err)
		}
		rec, err := r.Next()
		if err != nil {
			t.Fatalf("%s: Next: %v", filepath.Base(name), err)
		}
		if rec.Type != shm.TypeEvent || !bytes.Equal(rec.Payload, want) {
			t.Fatalf("%s: record type %d payload\n%x\nwant\n%x", filepath.Base(name), rec.Type, rec.Payload, want)
		}
		if err := fbs.Decode(rec.Payload, &v); err != nil {
			t.Fatalf("%s: %v", filepath.Base(name), err)
		}
	}
	if _, err := r.Next(); !errors.Is(err, shm.ErrEmpty) {
		t.Fatalf("after the vectors: %v, want ErrEmpty", err)
	}

	image, err := os.ReadFile(p.path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(b []byte) []byte
		want error
	}{
		{"magic", func(b []byte) []byte { b[3] = 'x'; return b }, shm.ErrMagic},
		{"version", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[8:], 2); return b }, shm.ErrVersion},
		{"capacity", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16:], 128<<10); return b }, shm.ErrHeader},
		{"truncated", func(b []byte) []byte { return b[:len(b)-4096] }, shm.ErrHeader},
	} {
		path := filepath.Join(t.TempDir(), c.name+".ring")
		if err := os.WriteFile(path, c.edit(bytes.Clone(image)), 0o600); err != nil {
			t.Fatal(err)
		}
		if r, err := shm.Open(path); !errors.Is(err, c.want) {
			if err == nil {
				r.Close()
			}
			t.Errorf("%s: Open = %v, want %v", c.name, err, c.want)
		}
	}
}
