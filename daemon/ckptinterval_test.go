package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/shm"
)

// Continuous checkpoints (--checkpoint-interval): the ring head is released only right after a checkpoint of
// exactly that head is on disk, so a SIGKILLed daemon's successor restores it and replays the ring.

const ckptRing = 1 << 16 // small ring: the half-ring trigger fires after ~32 KiB of records

// ckptOracle rebuilds p's oracle from events 0..to-1 without a dump cache, as a restored index is (see
// TestCheckpointRestart).
func ckptOracle(p *producer, to uint64) {
	p.newOracle()
	for _, ev := range ckptEvents(0, to) {
		p.applyOracle(ev)
	}
}

// ringPositions reads p's ring head and tail as a daemon left them.
func ringPositions(t *testing.T, p *producer) shm.RingStats {
	t.Helper()
	_, rs, err := shm.Inspect(p.path)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// publishPastHalf publishes events from id on until more than half the ring has been published since head, waits
// until they are applied, and returns the next id.
func publishPastHalf(t *testing.T, p *producer, id, head uint64) uint64 {
	t.Helper()
	for ringPositions(t, p).Tail-head <= ckptRing/2+ckptRing/8 {
		publishAll(p, ckptEvents(id, id+1))
		id++
	}
	lastID(t, p.socket, p, id-1)
	return id
}

// waitHeadMoved waits until the ring head left 0: the first checkpoint's write (asynchronous) completed, failed or
// not, and the head was released to it.
func waitHeadMoved(t *testing.T, p *producer) shm.RingStats {
	t.Helper()
	rs := ringPositions(t, p)
	for deadline := time.Now().Add(20 * time.Second); rs.Head == 0 && time.Now().Before(deadline); rs = ringPositions(t, p) {
		time.Sleep(5 * time.Millisecond)
	}
	return rs
}

// wantUnreleased asserts that records are applied but not released: 0 < head < tail, and head is the checkpoint's.
func wantUnreleased(t *testing.T, p *producer) shm.RingStats {
	t.Helper()
	rs := waitHeadMoved(t, p) // the checkpoint is written asynchronously: the head moves once its write completes
	if rs.Head == 0 || rs.Head >= rs.Tail {
		t.Fatalf("ring head %d tail %d: want applied-but-unreleased records after a checkpoint (0 < head < tail)", rs.Head, rs.Tail)
	}
	return rs
}

// TestCheckpointIntervalCrash: with a long interval, the half-ring trigger writes a checkpoint and releases up to it;
// records applied after it stay unreleased; SIGKILL; the next daemon restores the checkpoint and replays the ring:
// restored, not tainted, every query equals the oracle. The restored checkpoint stays valid, so a second SIGKILL
// right after more (unreleased) records restores it again.
func TestCheckpointIntervalCrash(t *testing.T) {
	dir := t.TempDir()
	socket, state := filepath.Join(dir, "kvshmd.sock"), filepath.Join(dir, "state")
	args := []string{"--state-dir", state, "--checkpoint-interval", "1h", "--http", "127.0.0.1:0"}
	d1 := startDaemon(t, socket, args...)
	p := newProducer(t, socket, 21, 4, ckptRing)
	next := publishPastHalf(t, p, 0, 0)
	waitHeadMoved(t, p)
	wantMetric(t, d1, `kvshm_checkpoint_writes_total{result="ok"} 1`)
	publishAll(p, ckptEvents(next, next+10))
	next += 10
	lastID(t, socket, p, next-1)
	rs := wantUnreleased(t, p)
	if _, err := os.Stat(ckptFile(state, p)); err != nil {
		t.Fatalf("no checkpoint after the half-ring trigger: %v\n%s", err, d1.log)
	}
	d1.kill()
	publishAll(p, ckptEvents(next, next+5)) // while no daemon runs
	next += 5

	for round := 1; round <= 2; round++ {
		d := startDaemon(t, socket, args...)
		rep := p.attach()
		if !rep.Resumed || !rep.Restored || rep.Head != rs.Head {
			t.Fatalf("round %d: attach after SIGKILL = %+v, want resumed and restored at head %d\n%s", round, rep, rs.Head, d.log)
		}
		st := lastID(t, socket, p, next-1)
		if st.Tainted || st.FirstEventID == nil || *st.FirstEventID != 0 {
			t.Fatalf("round %d: stream after the crash: %+v, want untainted with events from 0", round, st)
		}
		assertDumpPrefix(t, socket, `{"TreeDump":`)
		ckptOracle(p, next)
		checkAgainstOracle(t, p, socket, d.http, "after SIGKILL round "+strconv.Itoa(round))
		wantMetric(t, d, `kvshm_checkpoint_restores_total{result="restored"} 1`)
		publishAll(p, ckptEvents(next, next+3))
		next += 3
		lastID(t, socket, p, next-1)
		if got := wantUnreleased(t, p); got.Head != rs.Head {
			t.Fatalf("round %d: head moved to %d without a checkpoint (was %d)", round, got.Head, rs.Head)
		}
		d.kill()
	}
}

// TestCheckpointIntervalPeriodic: the interval trigger checkpoints applied records and releases them (head reaches
// the tail); an idle stream writes no further checkpoints; a graceful stop writes the final one, which the next
// daemon restores.
func TestCheckpointIntervalPeriodic(t *testing.T) {
	dir := t.TempDir()
	socket, state := filepath.Join(dir, "kvshmd.sock"), filepath.Join(dir, "state")
	args := []string{"--state-dir", state, "--checkpoint-interval", "50ms", "--http", "127.0.0.1:0"}
	d1 := startDaemon(t, socket, args...)
	p := newProducer(t, socket, 22, 4, 1<<20)
	publishAll(p, ckptEvents(0, 10))
	lastID(t, socket, p, 9)
	waitReleased := func() shm.RingStats {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if rs := ringPositions(t, p); rs.Head == rs.Tail {
				return rs
			}
		}
		t.Fatalf("the interval trigger never released the ring: %+v\n%s", ringPositions(t, p), d1.log)
		return shm.RingStats{}
	}
	waitReleased()
	okWrites := func() int { t.Helper(); return checkpointWrites(t, d1) }
	n1 := okWrites() // 1, or 2 if the publisher was paused for an interval in the middle of the 10 events
	if n1 < 1 {
		t.Fatalf("ring released with %d checkpoints written", n1)
	}
	time.Sleep(300 * time.Millisecond) // several intervals with nothing applied: no checkpoint
	if n := okWrites(); n != n1 {
		t.Errorf("an idle stream wrote %d checkpoints", n-n1)
	}
	publishAll(p, ckptEvents(10, 15))
	lastID(t, socket, p, 14)
	waitReleased()
	if n := okWrites(); n <= n1 {
		t.Errorf("checkpoints written after more events: %d, want more than %d", n, n1)
	}

	publishAll(p, ckptEvents(15, 18))
	if code := d1.terminate(t); code != 0 {
		t.Fatalf("exit code %d\n%s", code, d1.log)
	}
	rs := ringPositions(t, p)
	d2 := startDaemon(t, socket, args...)
	if rep := p.attach(); !rep.Restored || rep.Head != rs.Head || rs.Head != rs.Tail {
		t.Fatalf("attach after SIGTERM = %+v (ring %+v), want restored at the drained head\n%s", rep, rs, d2.log)
	}
	lastID(t, socket, p, 17)
	ckptOracle(p, 18)
	checkAgainstOracle(t, p, socket, d2.http, "after SIGTERM")
}

// checkpointWrites reads the daemon's count of checkpoints written.
func checkpointWrites(t *testing.T, d *daemonProc) int {
	t.Helper()
	m := metricsText(t, d)
	_, after, found := strings.Cut(m, `kvshm_checkpoint_writes_total{result="ok"} `)
	n, err := strconv.Atoi(strings.Fields(after + " x")[0])
	if !found || err != nil {
		t.Fatalf("no ok checkpoint writes counter:\n%s", grepLines(m, "kvshm_checkpoint"))
	}
	return n
}

// TestCheckpointIntervalWorthIt: an interval checkpoint waits until the records it would cover reach
// stream.CheckpointBytesPerNode per live node: one small event under a large index is left in the ring (it is cheaper to replay
// than the index is to rewrite) interval after interval, and written once enough such events came.
func TestCheckpointIntervalWorthIt(t *testing.T) {
	dir := t.TempDir()
	socket, state := filepath.Join(dir, "kvshmd.sock"), filepath.Join(dir, "state")
	d := startDaemon(t, socket, "--state-dir", state, "--checkpoint-interval", "50ms", "--http", "127.0.0.1:0")
	p := newProducer(t, socket, 23, 4, 1<<20)
	const blocks = 400
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	p.mustPublish(stored(0, 0, nil, hashes, tokens(0, blocks, 4))) // ~10 KB: 25 B per node, worth a checkpoint
	lastID(t, socket, p, 0)
	waitHeld := func(want bool, what string) shm.RingStats {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if rs := ringPositions(t, p); (rs.Head != rs.Tail) == want {
				return rs
			}
		}
		t.Fatalf("%s: ring %+v\n%s", what, ringPositions(t, p), d.log)
		return shm.RingStats{}
	}
	waitHeld(false, "the first checkpoint never released the ring")
	n := checkpointWrites(t, d)

	id := uint64(1)
	p.mustPublish(removed(id, 0, hashes[blocks-1])) // ~100 bytes under ~400 nodes: not worth a checkpoint
	lastID(t, socket, p, id)
	time.Sleep(300 * time.Millisecond) // six intervals
	if rs := ringPositions(t, p); rs.Head == rs.Tail || checkpointWrites(t, d) != n {
		t.Fatalf("one small event under %d nodes was checkpointed (ring %+v, %d writes, were %d)", blocks,
			rs, checkpointWrites(t, d), n)
	}
	for held := uint64(0); held < stream.CheckpointBytesPerNode*blocks; held = ringPositions(t, p).Tail - ringPositions(t, p).Head {
		id++
		p.mustPublish(removed(id, 0, hashes[blocks-int(id)]))
	}
	lastID(t, socket, p, id)
	waitHeld(false, "enough small events were never checkpointed")
	if got := checkpointWrites(t, d); got <= n {
		t.Fatalf("ring released with %d checkpoint writes, want more than %d", got, n)
	}
}

// TestCheckpointIntervalCrashWhileWriting: a crash while a checkpoint is written leaves a temporary file and the
// previous checkpoint, whose head is still the ring's (the head is released only after the rename): the next
// daemon removes the temporary file and restores the previous one. A truncated checkpoint (a damaged disk) is refused
// honestly: unknown history.
func TestCheckpointIntervalCrashWhileWriting(t *testing.T) {
	dir := t.TempDir()
	socket, state := filepath.Join(dir, "kvshmd.sock"), filepath.Join(dir, "state")
	args := []string{"--state-dir", state, "--checkpoint-interval", "1h", "--http", "127.0.0.1:0"}
	d1 := startDaemon(t, socket, args...)
	p := newProducer(t, socket, 23, 4, ckptRing)
	next := publishPastHalf(t, p, 0, 0)
	publishAll(p, ckptEvents(next, next+4))
	next += 4
	lastID(t, socket, p, next-1)
	rs := wantUnreleased(t, p)
	d1.kill()
	path := ckptFile(state, p)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp4242"
	if err := os.WriteFile(tmp, b[:len(b)/2], 0o600); err != nil { // the next checkpoint, half written
		t.Fatal(err)
	}
	d2 := startDaemon(t, socket, args...)
	if rep := p.attach(); !rep.Restored || rep.Head != rs.Head {
		t.Fatalf("attach after a crash mid-write = %+v, want restored at head %d\n%s", rep, rs.Head, d2.log)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
	lastID(t, socket, p, next-1)
	ckptOracle(p, next)
	checkAgainstOracle(t, p, socket, d2.http, "after a crash mid-write")
	d2.kill()

	if err := os.WriteFile(path, b[:len(b)-9], 0o600); err != nil { // truncated in place
		t.Fatal(err)
	}
	d3 := startDaemon(t, socket, args...)
	restartUnknown(t, d3, p, next, state, "corrupt checkpoint", ckptCorrupt)
}

// TestCheckpointIntervalWriteFails: a checkpoint that cannot be written (here: a directory in its place) is
// logged and counted, the head is released anyway (the producer never stalls on it) and the worker's checkpoints
// are deleted, so a crash before the next good checkpoint reports unknown history instead of restoring a stale one.
func TestCheckpointIntervalWriteFails(t *testing.T) {
	dir := t.TempDir()
	socket, state := filepath.Join(dir, "kvshmd.sock"), filepath.Join(dir, "state")
	args := []string{"--state-dir", state, "--checkpoint-interval", "1h", "--http", "127.0.0.1:0"}
	d1 := startDaemon(t, socket, args...)
	p := newProducer(t, socket, 24, 4, ckptRing)
	if err := os.Mkdir(ckptFile(state, p), 0o700); err != nil { // rename onto a directory fails, even for root
		t.Fatal(err)
	}
	next := publishPastHalf(t, p, 0, 0)
	waitHeadMoved(t, p)
	wantMetric(t, d1, `kvshm_checkpoint_writes_total{result="failed"} 1`)
	if rs := ringPositions(t, p); rs.Head == 0 {
		t.Fatalf("head not released after a failed checkpoint: %+v", rs)
	}
	if _, err := os.Stat(ckptFile(state, p)); !os.IsNotExist(err) {
		t.Errorf("the worker's checkpoint path survived a failed write: %v", err)
	}
	d1.waitLog(t, "cannot write checkpoint")
	d1.kill()
	d2 := startDaemon(t, socket, args...)
	restartUnknown(t, d2, p, next, state, "no checkpoint for this worker and ring epoch", ckptMissing)
}

// TestCheckpointIntervalConfig: an interval needs a state directory and must not be negative.
func TestCheckpointIntervalConfig(t *testing.T) {
	state := t.TempDir()
	tests := []struct {
		interval time.Duration
		stateDir string
		ok       bool
	}{
		{0, "", true},
		{time.Second, state, true},
		{time.Second, "", false},
		{-time.Second, state, false},
	}
	for _, tt := range tests {
		_, err := New(Config{SocketPath: filepath.Join(state, "s.sock"), StateDir: tt.stateDir, CheckpointInterval: tt.interval})
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrCheckpointInterval)) {
			t.Errorf("New(interval %v, state dir %q) = %v, want ok=%v or ErrCheckpointInterval", tt.interval, tt.stateDir, err, tt.ok)
		}
	}
}
