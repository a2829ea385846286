package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/internal/testenv"
)

// parkTimeout is long enough that a Park which has to run into its timeout fails the test's assertion on
// timedOut, instead of the test depending on how fast a wakeup is.
const parkTimeout = 5 * time.Second

type parkResult struct{ woken, timedOut bool }

// parkAsync parks r on a new goroutine (which owns r until the result arrives). Early returns with nothing to do
// (a signal, a spurious futex wakeup) park again, so the result is a wake, new records, or the timeout.
func parkAsync(r *Reader, timeout time.Duration) <-chan parkResult {
	ch := make(chan parkResult, 1)
	go func() {
		for {
			woken, timedOut := r.park(timeout)
			if woken || timedOut {
				ch <- parkResult{woken, timedOut}
				return
			}
		}
	}()
	return ch
}

// waitParked waits until a thread of this process sleeps in FUTEX_WAIT on the ring's tail word (read from
// /proc/self/task/*/syscall), so the test exercises the kernel wait and not only the check before it. Where that
// file is unavailable it waits for consumer_parked = 1 only (Park then returns through EAGAIN or the wake: the
// assertions hold either way). m is a mapping of the ring other than the parked Reader's.
func waitParked(t *testing.T, m []byte, futexAddr *uint32) {
	t.Helper()
	for loadParked(m) == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	// futex(2) by the kernel's numbering (under qemu-user the host's), addr, FUTEX_WAIT
	waitInSyscall(fmt.Sprintf("%s %#x 0x0 ", testenv.KernelSyscalls().Futex, uintptrOf(futexAddr)))
}

// waitInSyscall waits until a thread of this process is blocked in the system call /proc/self/task/*/syscall shows
// with the prefix want (its number and first arguments); it returns at once where that file is unavailable.
func waitInSyscall(want string) {
	for {
		tasks, err := filepath.Glob("/proc/self/task/*/syscall")
		if err != nil || len(tasks) == 0 {
			return
		}
		readable := false
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			readable = true
			if strings.HasPrefix(string(b), want) {
				return
			}
		}
		if !readable {
			return
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestParkWokenByPublish(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	drain(t, r)
	res := parkAsync(r, parkTimeout)
	waitParked(t, w.m, r.futex)
	if err := w.WriteEvent(1, payloadOf(1, 40)); err != nil {
		t.Fatalf("WriteEvent: %v", err)
	}
	got := <-res
	if !got.woken || got.timedOut {
		t.Fatalf("park after a publish to a parked reader = %+v, want woken by the doorbell (not the timeout)", got)
	}
	if p := loadParked(w.m); p != 0 {
		t.Errorf("consumer_parked = %d after Park returned, want 0", p)
	}
	if recs := drain(t, r); len(recs) != 1 || recs[0].Type != TypeEvent {
		t.Errorf("after the wake: %d records, want the one event", len(recs))
	}
}

func TestWakeInterruptsPark(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	res := parkAsync(r, parkTimeout)
	waitParked(t, w.m, r.futex)
	go r.Wake()
	if got := <-res; !got.woken || got.timedOut {
		t.Fatalf("park interrupted by Wake = %+v, want woken (not the timeout)", got)
	}
	if st := r.Stats(); st.Tail != 0 {
		t.Errorf("Wake changed the ring: tail %d", st.Tail)
	}
}

// TestParkReturnsAtOnce covers the cases where Park must not sleep: records already published (before or after
// the last Next), unread records, and a Wake that came before the Park.
func TestParkReturnsAtOnce(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(w *Writer, r *Reader)
	}{
		{"published after the last Next", func(w *Writer, r *Reader) {
			if err := w.WriteEvent(1, payloadOf(1, 16)); err != nil {
				t.Fatal(err)
			}
		}},
		{"unread records", func(w *Writer, r *Reader) {
			for i := range 2 {
				if err := w.WriteEvent(uint64(i), payloadOf(i, 16)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := r.Next(); err != nil {
				t.Fatal(err)
			}
		}},
		{"Wake before Park", func(w *Writer, r *Reader) { r.Wake() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
			drain(t, r)
			c.setup(w, r)
			woken, timedOut := r.park(parkTimeout)
			if !woken || timedOut {
				t.Fatalf("park = (woken %v, timedOut %v), want (true, false) without sleeping", woken, timedOut)
			}
			if p := loadParked(w.m); p != 0 {
				t.Errorf("consumer_parked = %d after Park, want 0", p)
			}
		})
	}
}

func TestParkTimeout(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	r.Wake()
	if !r.Park(parkTimeout) {
		t.Fatal("Park after Wake = false, want true")
	}
	// The Wake was consumed: the next Park sleeps until its timeout (or returns early, spuriously: still false).
	if r.Park(10 * time.Millisecond) {
		t.Error("Park with nothing published and no Wake = true, want false")
	}
	if p := loadParked(w.m); p != 0 {
		t.Errorf("consumer_parked = %d after a timeout, want 0", p)
	}
}

// TestParkCorruptTail: an invalid tail word is not "new records": Park sleeps instead of returning at once, so a
// drain loop cannot spin on a broken ring.
func TestParkCorruptTail(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	storeTail(w.m, 12) // not a multiple of 8
	if _, timedOut := r.park(10 * time.Millisecond); !timedOut {
		// A spurious early return is possible; a second try must time out.
		if woken, timedOut := r.park(10 * time.Millisecond); woken || !timedOut {
			t.Fatalf("park on a corrupt tail = (woken %v, timedOut %v), want a timeout", woken, timedOut)
		}
	}
}

func TestParkWakeAfterClose(t *testing.T) {
	w, r, path := newTestRing(t, Options{Capacity: MinCapacity})
	storeParked(w.m, 1) // a consumer that died parked
	r2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if p := loadParked(w.m); p != 0 {
		t.Errorf("consumer_parked = %d after Open, want 0 (reset)", p)
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	r2.Wake() // must neither fault nor block
	if r2.Park(parkTimeout) {
		t.Error("Park after Close = true, want false")
	}
	_ = r
}

// TestNapWoken: a Wake during a Nap ends it (never by the timeout), a Wake before it makes it return at once, and a
// Nap sets no consumer_parked (a producer publishing meanwhile makes no system call).
func TestNapWoken(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	r.Wake()
	if woken, timedOut := r.nap(parkTimeout); !woken || timedOut {
		t.Fatalf("nap after a Wake = (woken %v, timedOut %v), want (true, false) at once", woken, timedOut)
	}
	done := make(chan [2]bool)
	go func() {
		woken, timedOut := r.nap(parkTimeout)
		done <- [2]bool{woken, timedOut}
	}()
	for !r.napping.Load() {
		runtime.Gosched()
	}
	if p := loadParked(w.m); p != 0 {
		t.Errorf("consumer_parked = %d during a nap, want 0", p)
	}
	r.Wake()
	if got := <-done; !got[0] || got[1] {
		t.Fatalf("nap woken by Wake = (woken %v, timedOut %v), want (true, false)", got[0], got[1])
	}
	if woken, timedOut := r.nap(time.Millisecond); woken || !timedOut {
		t.Fatalf("nap without a Wake = (woken %v, timedOut %v), want (false, true)", woken, timedOut)
	}
}
