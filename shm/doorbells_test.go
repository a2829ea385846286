package shm

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvshm/kvshm/internal/testenv"
)

// waitvAsync runs Doorbells.Wait on a new goroutine (which owns the rings until the result arrives).
func waitvAsync(d *Doorbells, rings []*Reader, timeout time.Duration) <-chan parkResult {
	ch := make(chan parkResult, 1)
	go func() {
		timedOut, err := d.wait(rings, timeout)
		if err != nil {
			panic(err)
		}
		ch <- parkResult{woken: !timedOut, timedOut: timedOut}
	}()
	return ch
}

// waitInWaitv waits until a thread of this process sleeps in futex_waitv (/proc/self/task/*/syscall), so the test
// exercises the kernel wait and not only the checks before it. Where that file is unreadable it waits for the
// sleeping flag only (the assertions hold either way: the kernel then returns EAGAIN).
func waitInWaitv(t *testing.T, d *Doorbells) {
	t.Helper()
	for !d.sleeping.Load() {
		time.Sleep(100 * time.Microsecond)
	}
	waitInSyscall(fmt.Sprintf("%d ", sysFutexWaitv))
}

func requireWaitv(t *testing.T) {
	t.Helper()
	if !WaitvSupported() {
		t.Skip(testenv.WaitvMissing())
	}
}

// armAll arms every ring (each must be empty and drained).
func armAll(t *testing.T, rs ...*Reader) []*Reader {
	t.Helper()
	for i, r := range rs {
		if !r.Arm() {
			t.Fatalf("ring %d: Arm = false on an empty ring", i)
		}
	}
	return rs
}

// TestDoorbellsWokenByPublish: a Doorbells waiting on three armed rings is woken by a publish to any one of them
// (the Go Writer's FUTEX_WAKE on the tail word reaches futex_waitv), not by the timeout.
func TestDoorbellsWokenByPublish(t *testing.T) {
	requireWaitv(t)
	for which := range 3 {
		t.Run(fmt.Sprintf("ring=%d", which), func(t *testing.T) {
			var ws []*Writer
			var rs []*Reader
			for range 3 {
				w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
				ws, rs = append(ws, w), append(rs, r)
			}
			d := NewDoorbells()
			res := waitvAsync(d, armAll(t, rs...), parkTimeout)
			waitInWaitv(t, d)
			if err := ws[which].WriteEvent(1, payloadOf(1, 40)); err != nil {
				t.Fatal(err)
			}
			if got := <-res; got.timedOut {
				t.Fatalf("wait after a publish to ring %d = %+v, want woken by its doorbell (not the timeout)", which, got)
			}
			for i, r := range rs {
				if got, want := r.Pending(), i == which; got != want {
					t.Errorf("ring %d: Pending = %v, want %v", i, got, want)
				}
			}
			rs[which].Disarm()
			if p := loadParked(ws[which].m); p != 0 {
				t.Errorf("consumer_parked = %d after Disarm, want 0", p)
			}
			if p := loadParked(ws[(which+1)%3].m); p != 1 {
				t.Errorf("an untouched ring's consumer_parked = %d, want 1 (it stays armed across wakeups)", p)
			}
		})
	}
}

// TestDoorbellsWake: Wake interrupts a Wait (on rings, or on none), and a Wake before the Wait makes it return at
// once: the eventcount loses no wake.
func TestDoorbellsWake(t *testing.T) {
	requireWaitv(t)
	t.Run("during", func(t *testing.T) {
		_, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
		d := NewDoorbells()
		res := waitvAsync(d, armAll(t, r), parkTimeout)
		waitInWaitv(t, d)
		go d.Wake()
		if got := <-res; got.timedOut {
			t.Fatalf("wait interrupted by Wake = %+v, want woken", got)
		}
	})
	t.Run("no rings", func(t *testing.T) {
		d := NewDoorbells()
		res := waitvAsync(d, nil, parkTimeout)
		waitInWaitv(t, d)
		go d.Wake()
		if got := <-res; got.timedOut {
			t.Fatalf("wait interrupted by Wake = %+v, want woken", got)
		}
	})
	t.Run("before", func(t *testing.T) {
		d := NewDoorbells()
		d.Wake()
		if got := <-waitvAsync(d, nil, parkTimeout); got.timedOut {
			t.Fatalf("wait after a Wake = %+v, want an immediate return", got)
		}
		// Consumed: the next wait sleeps until its timeout.
		if got := <-waitvAsync(d, nil, time.Millisecond); !got.timedOut {
			t.Fatalf("second wait after one Wake = %+v, want the timeout (the Wake was consumed)", got)
		}
	})
}

// TestArm covers Arm's outcomes: an empty ring is armed (consumer_parked = 1) and stays so across Arm calls; a
// ring with records is not (and is left disarmed); Disarm clears the flag; a published tail after Arm is Pending.
func TestArm(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	if !r.Arm() || !r.Armed() || loadParked(w.m) != 1 {
		t.Fatalf("Arm on an empty ring: armed %v, consumer_parked %d; want armed, 1", r.Armed(), loadParked(w.m))
	}
	if !r.Arm() {
		t.Fatal("a second Arm on an empty ring = false")
	}
	if err := w.WriteEvent(1, payloadOf(1, 16)); err != nil {
		t.Fatal(err)
	}
	if !r.Pending() {
		t.Fatal("Pending = false after a publish")
	}
	if r.Arm() || r.Armed() || loadParked(w.m) != 0 {
		t.Fatalf("Arm with a record published: armed %v, consumer_parked %d; want false, 0", r.Armed(), loadParked(w.m))
	}
	drain(t, r)
	if r.Pending() {
		t.Fatal("Pending = true after draining")
	}
	r.Arm()
	r.Disarm()
	if r.Armed() || loadParked(w.m) != 0 {
		t.Fatalf("after Disarm: armed %v, consumer_parked %d", r.Armed(), loadParked(w.m))
	}
}

// TestDoorbellsErrors: a kernel without futex_waitv (simulated with a syscall number none has) is ErrNoWaitv, so
// the caller can fall back; more than MaxDoorbells armed rings are refused.
func TestDoorbellsErrors(t *testing.T) {
	requireWaitv(t)
	_, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	armAll(t, r)
	saved := sysFutexWaitv
	sysFutexWaitv = 1 << 20
	err := NewDoorbells().Wait([]*Reader{r}, time.Millisecond)
	sysFutexWaitv = saved
	if !errors.Is(err, ErrNoWaitv) {
		t.Fatalf("Wait without the syscall = %v, want ErrNoWaitv", err)
	}
	many := make([]*Reader, MaxDoorbells+1)
	for i := range many {
		many[i] = r // the same armed ring counts once per entry
	}
	if err := NewDoorbells().Wait(many, time.Millisecond); !errors.Is(err, ErrTooManyDoorbells) {
		t.Fatalf("Wait on %d rings = %v, want ErrTooManyDoorbells", len(many), err)
	}
	if err := NewDoorbells().Wait(many[:MaxDoorbells], time.Millisecond); err != nil {
		t.Fatalf("Wait on MaxDoorbells rings = %v", err)
	}
}

// BenchmarkDoorbellsWait measures one futex_waitv that returns at once (the wake word differs) over n armed
// rings: the kernel's per-word cost of a wait, which a worker pays once per sleep.
//
//	go test -run '^$' -bench DoorbellsWait ./shm/
func BenchmarkDoorbellsWait(b *testing.B) {
	if !WaitvSupported() {
		b.Skip(testenv.WaitvMissing())
	}
	for _, n := range []int{0, 8, 64, 127} {
		b.Run(fmt.Sprintf("rings=%d", n), func(b *testing.B) {
			rs := make([]*Reader, n)
			for i := range rs {
				_, r, _ := newTestRing(b, Options{Capacity: MinCapacity})
				r.Arm()
				rs[i] = r
			}
			d := NewDoorbells()
			b.ReportAllocs()
			for b.Loop() {
				d.Wake()
				if err := d.Wait(rs, time.Second); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDoorbellLevel: a lazy reader (SetDoorbellLevel) stays armed with unread records below its level, stores the
// level relative to the head (so records read but not released still count for the producer, who sees only the
// head), and its producer rings only when a publication reaches the level: a Doorbells.Wait sleeps through the
// publications below it and is woken by the one that reaches it.
func TestDoorbellLevel(t *testing.T) {
	requireWaitv(t)
	const level = 512
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	r.SetDoorbellLevel(level)
	publish := func(seq int) {
		t.Helper()
		if err := w.WriteEvent(uint64(seq), payloadOf(seq, 40)); err != nil { // a 48-byte record
			t.Fatal(err)
		}
	}

	// Held back: one record read, not released (pos - head = 48), one unread.
	publish(0)
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	publish(1)
	if !r.Arm() {
		t.Fatal("Arm with one unread record below the level = false, want armed")
	}
	if got, want := loadParked(w.m), uint32(48+level); got != want {
		t.Fatalf("consumer_parked = %d, want (pos - head) + level = %d", got, want)
	}

	// Below the level the producer does not ring: the wait runs into its timeout.
	d := NewDoorbells()
	res := waitvAsync(d, []*Reader{r}, 200*time.Millisecond)
	waitInWaitv(t, d)
	publish(2)
	if got := <-res; !got.timedOut {
		t.Fatalf("wait after a publication below the level = %+v, want the timeout (no doorbell)", got)
	}

	// The publication that reaches the level rings.
	seq := 3
	for ; w.published-r.pos+48 < level; seq++ {
		publish(seq)
	}
	if !r.Arm() {
		t.Fatal("Arm just below the level = false")
	}
	res = waitvAsync(d, []*Reader{r}, parkTimeout)
	waitInWaitv(t, d)
	publish(seq)
	if got := <-res; got.timedOut {
		t.Fatalf("wait after the publication reaching the level = %+v, want woken by its doorbell", got)
	}
	if r.Arm() || loadParked(w.m) != 0 {
		t.Fatalf("Arm at the level: armed %v, consumer_parked %d; want false, 0 (drain first)", r.Armed(), loadParked(w.m))
	}
}
