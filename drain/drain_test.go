package drain

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/shm"
)

// liveness bounds how long a test waits for something that must happen; it times nothing (a failure is a hang).
const liveness = 30 * time.Second

// fakeStream drains a real ring and reports what the worker did with it.
type fakeStream struct {
	t     testing.TB
	w     *shm.Writer
	r     *shm.Reader
	path  string
	every time.Duration // Housekeep's period; 0: none

	owner    atomic.Int64 // goroutine-ish check: calls must not overlap
	records  atomic.Int64
	passes   atomic.Int64
	houses   atomic.Int64
	finals   atomic.Int64
	faults   atomic.Int64
	cause    atomic.Value
	passAttn chan struct{} // receives after each pass that found no record (buffered, lossy)
	done     chan struct{} // closed by Final or Fault
	doneOnce sync.Once
	// reachedAt: when the last record was consumed; deadline: the last deadline Housekeep returned.
	reachedAt, deadline atomic.Value
}

func newFake(t testing.TB, every time.Duration) *fakeStream {
	t.Helper()
	path := filepath.Join(t.TempDir(), "r.ring")
	w, err := shm.Create(path, shm.Options{Capacity: shm.MinCapacity, WorkerID: 1, KVBlockSize: 4, MaxBufferSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	r, err := shm.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeStream{t: t, w: w, r: r, path: path, every: every, passAttn: make(chan struct{}, 1), done: make(chan struct{})}
	t.Cleanup(func() { w.Close() })
	return f
}

func (f *fakeStream) enter() {
	if f.owner.Add(1) != 1 {
		f.t.Error("two calls into one stream overlapped")
	}
}
func (f *fakeStream) leave() { f.owner.Add(-1) }

func (f *fakeStream) Ring() *shm.Reader { return f.r }
func (f *fakeStream) Ready() bool       { return f.r.Pending() }

func (f *fakeStream) Pass(time.Time) int {
	f.enter()
	defer f.leave()
	if f.finals.Load() > 0 {
		f.t.Error("Pass after Final")
	}
	f.passes.Add(1)
	n := 0
	for {
		_, err := f.r.Next()
		if err != nil {
			break
		}
		n++
	}
	f.r.Release()
	if n > 0 {
		f.records.Add(int64(n))
		f.reachedAt.Store(time.Now())
	} else {
		select {
		case f.passAttn <- struct{}{}:
		default:
		}
	}
	return n
}

func (f *fakeStream) Housekeep(now time.Time) (time.Time, error) {
	f.enter()
	defer f.leave()
	f.houses.Add(1)
	if f.every == 0 {
		return time.Time{}, nil
	}
	f.deadline.Store(now.Add(f.every))
	return now.Add(f.every), nil
}

func (f *fakeStream) Final() {
	f.enter()
	defer f.leave()
	if f.finals.Add(1) != 1 {
		f.t.Error("Final called twice")
	}
	for {
		if _, err := f.r.Next(); err != nil {
			break
		}
		f.records.Add(1)
	}
	f.r.Release()
	_ = f.r.Close()
	f.doneOnce.Do(func() { close(f.done) })
}

func (f *fakeStream) Fault(cause any) {
	f.faults.Add(1)
	f.cause.Store(fmt.Sprint(cause))
	_ = f.r.Close()
	f.doneOnce.Do(func() { close(f.done) })
}

func (f *fakeStream) publish(n int) {
	for range n {
		if !f.w.Append(shm.TypeEvent, make([]byte, 16)) {
			f.t.Fatal("ring full")
		}
		f.w.Publish()
	}
}

// waitFor polls cond until it holds (a liveness bound, not a timing assertion).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(liveness)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

var modes = []struct {
	name string
	cfg  Config
}{
	{"waitv", Config{RingsPerWorker: 4}},
	{"fallback", Config{NoWaitv: true}},
}

func forModes(t *testing.T, fn func(t *testing.T, cfg Config)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			if !m.cfg.NoWaitv && !shm.WaitvSupported() {
				t.Skip(testenv.WaitvMissing())
			}
			fn(t, m.cfg)
		})
	}
}

// TestDrainsEveryRing: streams spread over several workers (4 rings each) all get their records, whichever ring is
// published to, while the workers sleep between publishes; Stop calls Final exactly once.
func TestDrainsEveryRing(t *testing.T) {
	forModes(t, func(t *testing.T, cfg Config) {
		s := New(cfg)
		var fs []*fakeStream
		var hs []*Handle
		for range 10 {
			f := newFake(t, 0)
			h, err := s.Add(f)
			if err != nil {
				t.Fatal(err)
			}
			fs, hs = append(fs, f), append(hs, h)
		}
		want := make([]int64, len(fs))
		for round := range 50 {
			i := (round * 7) % len(fs)
			fs[i].publish(1 + round%3)
			want[i] += int64(1 + round%3)
			waitFor(t, fmt.Sprintf("ring %d reached", i), func() bool { return fs[i].records.Load() == want[i] })
		}
		for i, h := range hs {
			h.Stop()
			<-fs[i].done
		}
		s.Close()
		for i, f := range fs {
			if f.finals.Load() != 1 || f.faults.Load() != 0 || f.records.Load() != want[i] {
				t.Errorf("ring %d: finals %d faults %d records %d (want 1, 0, %d)", i, f.finals.Load(), f.faults.Load(),
					f.records.Load(), want[i])
			}
		}
	})
}

// TestWakeRunsPass: with no records and no deadline, only Handle.Wake can make the worker run a pass (a query
// barrier); it does, asleep or not.
func TestWakeRunsPass(t *testing.T) {
	forModes(t, func(t *testing.T, cfg Config) {
		s := New(cfg)
		defer s.Close()
		f := newFake(t, 0)
		h, err := s.Add(f)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			before := f.passes.Load()
			h.Wake()
			waitFor(t, fmt.Sprintf("pass after Wake %d", i), func() bool { return f.passes.Load() > before })
			if i%2 == 0 {
				waitAsleep(t) // every other Wake finds the worker asleep in the kernel
			}
		}
		h.Stop()
		<-f.done
	})
}

// TestStopFinalDrains: records published before Stop are consumed by Final (not lost), which runs once.
func TestStopFinalDrains(t *testing.T) {
	forModes(t, func(t *testing.T, cfg Config) {
		s := New(cfg)
		f := newFake(t, 0)
		h, _ := s.Add(f)
		f.publish(3)
		h.Stop()
		h.Stop()
		<-f.done
		s.Close()
		if f.records.Load() != 3 || f.finals.Load() != 1 {
			t.Fatalf("records %d finals %d, want 3, 1", f.records.Load(), f.finals.Load())
		}
	})
}

// TestCloseStopsRemaining: Scheduler.Close finishes streams still attached (Final) and Add fails after it.
func TestCloseStopsRemaining(t *testing.T) {
	forModes(t, func(t *testing.T, cfg Config) {
		s := New(cfg)
		f := newFake(t, 0)
		if _, err := s.Add(f); err != nil {
			t.Fatal(err)
		}
		s.Close()
		<-f.done
		if _, err := s.Add(newFake(t, 0)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Add after Close = %v, want ErrClosed", err)
		}
	})
}

// TestFaultContained: a ring truncated to nothing under its worker faults on the worker's next access (SIGBUS,
// made a panic by SetPanicOnFault); only that stream gets Fault, the others sharing its worker go on.
func TestFaultContained(t *testing.T) {
	testenv.SkipIfEmulated(t, testenv.SIGBUSAddress)
	forModes(t, func(t *testing.T, cfg Config) {
		s := New(cfg)
		defer s.Close()
		// A deadline: in the fallback a worker parked on the truncated ring's own futex cannot be rung there
		// (FUTEX_WAKE on an unmapped page fails) and returns at its timeout.
		victim, other := newFake(t, 50*time.Millisecond), newFake(t, 0)
		hv, _ := s.Add(victim)
		_, _ = s.Add(other)
		victim.publish(1)
		waitFor(t, "victim's record", func() bool { return victim.records.Load() == 1 })
		fi, err := os.Stat(victim.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(victim.path, 0); err != nil {
			t.Fatal(err)
		}
		// The test's own Writer would fault at Close: give its mapping a file again before cleanup.
		t.Cleanup(func() { _ = os.Truncate(victim.path, fi.Size()) })
		hv.Wake() // the worker touches the ring (Ready: the tail word) at once
		<-victim.done
		if victim.faults.Load() != 1 || victim.finals.Load() != 0 {
			t.Fatalf("victim: faults %d finals %d, want 1, 0", victim.faults.Load(), victim.finals.Load())
		}
		for i := range 5 {
			other.publish(1)
			waitFor(t, fmt.Sprintf("other's record %d after the fault", i), func() bool { return other.records.Load() == int64(i+1) })
		}
	})
}

// TestLostDoorbellBounded: a doorbell lost exactly when the ring was armed (the Python producer cannot fence: its
// load of consumer_parked can see 0; here consumer_parked is cleared behind the worker's back, so the Go producer
// does not ring) delays the record only until the stream's next housekeeping deadline: the record is reached by
// the wakeup of a later Housekeep, with no doorbell and no Wake.
func TestLostDoorbellBounded(t *testing.T) {
	forModes(t, func(t *testing.T, cfg Config) {
		s := New(cfg)
		defer s.Close()
		f := newFake(t, 20*time.Millisecond)
		h, _ := s.Add(f)
		defer func() { h.Stop(); <-f.done }()
		file, err := os.OpenFile(f.path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer file.Close()
		const offParked = 0x208 // shm/FORMAT.md
		var word [4]byte
		// A round is conclusive when the record is reached at or after the deadline the worker slept until: before
		// it only a doorbell (lost here) or a spurious wakeup (a signal) can wake the worker, so an early reach is
		// retried, and 3 conclusive rounds are required. Without the deadline the record is never reached.
		// The first Housekeep may come after the ring is armed (a new stream's first pass): its deadline first.
		waitFor(t, "the first housekeeping", func() bool { return f.deadline.Load() != nil })
		conclusive := 0
		for i := 0; conclusive < 3; i++ {
			if i == 50 {
				t.Fatalf("only %d of 50 rounds reached the record at the deadline: the lost doorbell rings", conclusive)
			}
			waitFor(t, "ring armed", func() bool {
				_, _ = file.ReadAt(word[:], offParked)
				return binary.LittleEndian.Uint32(word[:]) == 1
			})
			waitAsleep(t)                                                       // the worker's last look at the ring (and Park's own store of the flag) is done
			if _, err := file.WriteAt(make([]byte, 4), offParked); err != nil { // the doorbell is lost
				t.Fatal(err)
			}
			deadline := f.deadline.Load().(time.Time) // the worker sleeps until it (or a doorbell, or a Wake)
			f.publish(1)
			waitFor(t, fmt.Sprintf("record %d with its doorbell lost", i), func() bool { return f.records.Load() == int64(i+1) })
			if at := f.reachedAt.Load().(time.Time); !at.Before(deadline) {
				conclusive++
			}
		}
	})
}

// TestHotPolicy is the idle strategy's table: poll instead of sleeping only while a stream's bursts come faster
// than a wakeup and its last burst is recent.
func TestHotPolicy(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name  string
		known bool
		gap   time.Duration
		since time.Duration
		hot   bool
	}{
		{"no gap measured", false, 0, 0, false},
		{"back-to-back, just now", true, 2 * time.Microsecond, time.Microsecond, true},
		{"back-to-back, stopped", true, 2 * time.Microsecond, spinMin + time.Microsecond, false},
		{"gap just below a wakeup, within twice it", true, hotGap - time.Microsecond, hotGap, true},
		{"gap of a wakeup", true, hotGap, 0, false},
		{"1 ms gap (1,000 batches/s)", true, time.Millisecond, 0, false},
	} {
		w := &worker{entries: []*entry{{gapKnown: c.known, gap: c.gap, lastRec: now.Add(-c.since)}}}
		if got := w.hot(now); got != c.hot {
			t.Errorf("%s: hot = %v, want %v", c.name, got, c.hot)
		}
	}
}

// waitAsleep waits until a thread of this process sleeps in futex_waitv or in a shared FUTEX_WAIT (futex(2) with op
// 0: only Reader.Park uses one; the runtime's own futexes are private), read from /proc/self/task/*/syscall, whose
// numbers are the kernel's CPU's (testenv.KernelSyscalls). Skips the test where that file is unreadable.
func waitAsleep(t *testing.T) {
	t.Helper()
	nr := testenv.KernelSyscalls()
	waitFor(t, "worker asleep in the kernel", func() bool {
		tasks, _ := filepath.Glob("/proc/self/task/*/syscall")
		readable := false
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			readable = true
			fs := strings.Fields(string(b))
			if len(fs) >= 3 && (fs[0] == nr.FutexWaitv || fs[0] == nr.Futex && fs[2] == "0x0") {
				return true
			}
		}
		if !readable {
			t.Skip("/proc/self/task/*/syscall is not readable")
		}
		return false
	})
}
