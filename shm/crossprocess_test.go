package shm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvshm/kvshm/internal/testenv"
)

// Cross-process tests: the test binary re-executes itself as a Go writer process (TestHelperRingWriterProcess with
// KVSHM_SHM_CHILD set) and reads the ring in the parent. Payloads carry their seq, a u64 whose two halves must be
// equal (a torn or misplaced 8-byte value shows up as unequal halves) and a CRC-32 of everything before it.

const (
	childModeEnv  = "KVSHM_SHM_CHILD"       // "stream": write COUNT records and close; "forever": until killed;
	childPathEnv  = "KVSHM_SHM_CHILD_PATH"  // "stage": write COUNT records, stage one more, print STAGED, sleep
	childCountEnv = "KVSHM_SHM_CHILD_COUNT" //
	childSeedEnv  = "KVSHM_SHM_CHILD_SEED"  //

	stressCapacity = 256 << 10
	stressMinSize  = 20
)

// stressPool supplies payload filler bytes (fixed, so both processes agree without sharing state).
var stressPool = func() []byte {
	p := make([]byte, 8192)
	r := rand.New(rand.NewPCG(7, 7))
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}()

func splitmix64(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// stressPayload builds record seq's payload in buf: mostly small (20..319 bytes), one in eight up to 4 KiB.
func stressPayload(buf []byte, seq uint64) []byte {
	h := splitmix64(seq)
	n := stressMinSize + int(h>>40)%300
	if h&7 == 0 {
		n = stressMinSize + int(h>>40)%4000
	}
	p := buf[:n]
	binary.LittleEndian.PutUint64(p[0:], seq)
	half := uint64(uint32(h))
	binary.LittleEndian.PutUint64(p[8:], half<<32|half)
	copy(p[16:n-4], stressPool[seq%1024:])
	binary.LittleEndian.PutUint32(p[n-4:], crc32.ChecksumIEEE(p[:n-4]))
	return p
}

// checkStressPayload verifies a payload read from the ring is complete and is record want.
func checkStressPayload(p []byte, want uint64) error {
	if len(p) < stressMinSize {
		return fmt.Errorf("payload of %d bytes, shorter than %d", len(p), stressMinSize)
	}
	if got, sum := binary.LittleEndian.Uint32(p[len(p)-4:]), crc32.ChecksumIEEE(p[:len(p)-4]); got != sum {
		return fmt.Errorf("checksum %#x, computed %#x (seq field %d, %d bytes)", got, sum, binary.LittleEndian.Uint64(p), len(p))
	}
	if seq := binary.LittleEndian.Uint64(p); seq != want {
		return fmt.Errorf("seq %d, want %d (not contiguous)", seq, want)
	}
	v := binary.LittleEndian.Uint64(p[8:])
	if v>>32 != v&0xFFFFFFFF {
		return fmt.Errorf("torn value %#x in seq %d", v, want)
	}
	if h := splitmix64(want); uint32(v) != uint32(h) {
		return fmt.Errorf("seq %d: value %#x, want halves %#x", want, v, uint32(h))
	}
	return nil
}

// TestHelperRingWriterProcess is the writer process of the cross-process tests; it does nothing in a normal run.
func TestHelperRingWriterProcess(t *testing.T) {
	mode := os.Getenv(childModeEnv)
	if mode == "" {
		t.Skip("helper: runs only as the child process of the cross-process tests")
	}
	os.Exit(runChildWriter(mode))
}

func runChildWriter(mode string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "child writer: "+format+"\n", args...)
		return 2
	}
	count, err1 := strconv.ParseUint(os.Getenv(childCountEnv), 10, 64)
	seed, err2 := strconv.ParseUint(os.Getenv(childSeedEnv), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return fail("bad environment: %v", err)
	}
	w, err := Create(os.Getenv(childPathEnv), Options{Capacity: stressCapacity})
	if err != nil {
		return fail("%v", err)
	}
	fmt.Println("READY")
	rng := rand.New(rand.NewPCG(seed, 2))
	buf := make([]byte, 4100)
	forever := mode == "forever"
	for seq := uint64(0); forever || seq < count; {
		batch := 1 + rng.IntN(16) // several records per tail store
		for j := 0; j < batch && (forever || seq < count); j++ {
			p := stressPayload(buf, seq)
			for spins := 0; !w.Append(TypeEvent, p); spins++ {
				w.Publish()
				backoff(spins)
			}
			seq++
		}
		w.Publish()
	}
	if mode == "stage" {
		// One more record written into the data area but never published: it must stay invisible.
		for spins := 0; !w.Append(TypeEvent, stressPayload(buf, count)); spins++ {
			backoff(spins)
		}
		fmt.Println("STAGED")
		time.Sleep(time.Hour) // killed by the parent
	}
	if err := w.Close(); err != nil {
		return fail("%v", err)
	}
	return 0
}

func backoff(spins int) {
	if spins < 64 {
		runtime.Gosched()
	} else {
		time.Sleep(20 * time.Microsecond)
	}
}

type childWriter struct {
	cmd    *exec.Cmd
	lines  chan string
	exited chan error // receives cmd.Wait's result once
	stderr *testenv.SyncBuffer
}

func startChildWriter(t *testing.T, mode, path string, count uint64) *childWriter {
	t.Helper()
	seed := rand.Uint64()
	t.Logf("child %s: seed %d", mode, seed)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRingWriterProcess$")
	cmd.Env = append(os.Environ(), childModeEnv+"="+mode, childPathEnv+"="+path,
		childCountEnv+"="+strconv.FormatUint(count, 10), childSeedEnv+"="+strconv.FormatUint(seed, 10))
	c := &childWriter{cmd: cmd, lines: make(chan string, 4), exited: make(chan error, 1), stderr: new(testenv.SyncBuffer)}
	cmd.Stderr = c.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.exited
	})
	return c
}

// expect waits for the child to print line. The timeout only guards against a hang.
func (c *childWriter) expect(t *testing.T, line string) {
	t.Helper()
	select {
	case got, ok := <-c.lines:
		if !ok || got != line {
			t.Fatalf("child printed %q (open %v), want %q; stderr:\n%s", got, ok, line, c.stderr)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("child did not print %q in 60 s; stderr:\n%s", line, c.stderr)
	}
}

// reader drains records from r checking each against the stress payload of the next seq.
type stressReader struct {
	r    *Reader
	next uint64
}

// readUntil reads until next reaches n (or, when n is 0, until the ring is empty). done is polled while the ring
// is empty; a non-nil error from it ends the test.
func (s *stressReader) readUntil(t *testing.T, n uint64, child *childWriter) {
	t.Helper()
	lastProgress := time.Now()
	for spins := 0; n == 0 || s.next < n; {
		rec, err := s.r.Next()
		if err == nil {
			if rec.Type != TypeEvent {
				t.Fatalf("record at %d has type %d, want EVENT (no losses in this test)", rec.Pos, rec.Type)
			}
			if err := checkStressPayload(rec.Payload, s.next); err != nil {
				t.Fatalf("record at %d: %v", rec.Pos, err)
			}
			s.next++
			if s.next%64 == 0 {
				s.r.Release()
			}
			spins, lastProgress = 0, time.Now()
			continue
		}
		if !errors.Is(err, ErrEmpty) {
			t.Fatalf("after %d records: %v", s.next, err)
		}
		s.r.Release()
		if n == 0 {
			return
		}
		select {
		case err := <-child.exited:
			child.exited <- err
			if s.r.tail == loadTail(s.r.m) { // nothing more will come
				t.Fatalf("child exited (%v) after %d of %d records; stderr:\n%s", err, s.next, n, child.stderr)
			}
		default:
		}
		if time.Since(lastProgress) > 60*time.Second { // hang guard, not a performance threshold
			t.Fatalf("no record for 60 s after %d records", s.next)
		}
		backoff(spins)
		spins++
	}
	s.r.Release()
}

// TestCrossProcessStress streams a million records (KVSHM_STRESS_RECORDS overrides; `make test` runs 3M) of random
// sizes from a Go writer process through many wraparounds and checks every record: contiguous seqs, checksums, no
// torn values, nothing dropped.
func TestCrossProcessStress(t *testing.T) {
	count := uint64(1 << 20)
	if testing.Short() {
		count = 100_000
	}
	if s := os.Getenv("KVSHM_STRESS_RECORDS"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n == 0 {
			t.Fatalf("KVSHM_STRESS_RECORDS=%q: want a positive count", s)
		}
		count = n
	}
	path := filepath.Join(t.TempDir(), "stress.ring")
	child := startChildWriter(t, "stream", path, count)
	child.expect(t, "READY")
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s := &stressReader{r: r}
	s.readUntil(t, count, child)
	if err := <-child.exited; err != nil {
		t.Fatalf("child: %v; stderr:\n%s", err, child.stderr)
	}
	child.exited <- nil
	if _, err := r.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Next after %d records = %v, want ErrEmpty", count, err)
	}
	st := r.Stats()
	if st.State != StateClosed || st.DroppedEvents != 0 || st.Head != st.Tail {
		t.Fatalf("final stats %+v: want CLOSED, no drops, head == tail", st)
	}
	if laps := st.Tail / stressCapacity; laps < 20 {
		t.Fatalf("only %d wraparounds", laps)
	}
	t.Logf("%d records, %d bytes, %d wraparounds", count, st.Tail, st.Tail/stressCapacity)
}

// TestCrossProcessKill kills the writer with SIGKILL mid-stream: every published record is read intact and in
// order, and the reader ends on ErrEmpty, not on a partial record.
func TestCrossProcessKill(t *testing.T) {
	atLeast := uint64(200_000)
	if testing.Short() {
		atLeast = 20_000
	}
	path := filepath.Join(t.TempDir(), "kill.ring")
	child := startChildWriter(t, "forever", path, 0)
	child.expect(t, "READY")
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s := &stressReader{r: r}
	s.readUntil(t, atLeast, child)
	if err := child.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-child.exited; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child exit = %v, want killed", err)
	}
	child.exited <- nil
	s.readUntil(t, 0, child) // everything published before the kill
	st := r.Stats()
	if st.State != StateReady || st.Head != st.Tail || s.next < atLeast {
		t.Fatalf("after kill: %+v, %d records read", st, s.next)
	}
	if _, err := r.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Next after the last published record = %v, want ErrEmpty", err)
	}
	t.Logf("read %d records, %d after the kill signal", s.next, s.next-atLeast)
}

// TestCrossProcessStagedRecordInvisible kills a writer that has written a record into the data area without
// publishing it: the bytes are there, the reader never returns them, not even after reopening the ring.
func TestCrossProcessStagedRecordInvisible(t *testing.T) {
	const count = 1000
	path := filepath.Join(t.TempDir(), "stage.ring")
	child := startChildWriter(t, "stage", path, count)
	child.expect(t, "READY")
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &stressReader{r: r}
	s.readUntil(t, count, child)
	child.expect(t, "STAGED")
	child.cmd.Process.Signal(syscall.SIGKILL)
	<-child.exited
	child.exited <- nil
	r.Close()

	// A new consumer (as after a daemon restart) sees the same: everything published, nothing staged.
	r, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("reopened ring: Next = %v, want ErrEmpty", err)
	}
	if s.next != count {
		t.Fatalf("read %d records, want the %d published", s.next, count)
	}
	// The staged record's header is in the data area just past the tail (after padding, if it wrapped).
	var buf [4100]byte
	wantLen := uint32(RecordHeaderSize + len(stressPayload(buf[:], count)))
	tail := r.Stats().Tail
	idx := tail & (stressCapacity - 1)
	if le32(r.data[idx+4:]) == TypePadding {
		idx = 0
	}
	if got := le32(r.data[idx:]); got != wantLen || le32(r.data[idx+4:]) != TypeEvent {
		t.Fatalf("no staged record past the tail: length %d type %d, want %d EVENT", got, le32(r.data[idx+4:]), wantLen)
	}
	if _, err := r.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Next = %v, want ErrEmpty: the staged record must stay invisible", err)
	}
}
