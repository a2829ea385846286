package daemon

import (
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Idle strategy of a drain goroutine (Aeron's BackoffIdleStrategy, with the sleeps done by nanosleep):
//
//	after the last record: 0 ─ spinFor ─ yieldFor ──── warm: nanosleep 50µs,100µs,…,1ms ──── coldAfter ── cold ──►
//	                       busy poll    Gosched polls  poll after each sleep                    wait ≤ coldSleep
//
// Go timers cannot sleep below about 1 ms on an idle Linux process (the netpoller waits in whole milliseconds), so
// the warm sleeps go through nanosleep(2) on the drain goroutine's own locked OS thread, whose timer slack is
// lowered to 1 µs (prctl PR_SET_TIMERSLACK; the default 50 µs slack would double a 50 µs sleep). While records keep
// coming a record is reached within about one sleep period (~100 µs at a few thousand records per second).
//
// Each wakeup costs ~10-40 µs of CPU on a virtual machine (measured: a C nanosleep(1 ms) loop uses 0.7% of a core
// there, the same loop in Go 2-4%, a Go timer wakeup ~100 µs), so sleeping 1 ms forever cannot meet "≤ 1% of a
// core when idle". After coldAfter without records the stream turns cold: it sleeps coldSleep per poll with
// nanosleep (cheaper than a Go timer), and a query barrier or a stop interrupts that sleep by sending SIGURG to
// the drain thread (the Go runtime ignores a SIGURG it did not ask for; the syscall returns EINTR). The first
// record after a cold period is reached within coldSleep, the ones after it at warm speed again.
// BenchmarkDaemonIdleCPU and BenchmarkDaemonReachLatency print the figures.
const (
	spinFor   = 30 * time.Microsecond
	yieldFor  = 60 * time.Microsecond
	minSleep  = 50 * time.Microsecond
	maxSleep  = time.Millisecond
	coldAfter = 100 * time.Millisecond
	coldSleep = 10 * time.Millisecond
)

// idler is owned by one drain goroutine, except wake, which any goroutine may call.
type idler struct {
	lastWork time.Time
	sleep    time.Duration
	tid      atomic.Int32 // the drain goroutine's OS thread. Updated atomically.
	parked   atomic.Bool  // true while in a cold sleep. Updated atomically.
}

// lockThread pins the calling goroutine to its OS thread and lowers the thread's timer slack. The goroutine
// never unlocks: when it exits, the runtime discards the thread with its modified slack.
func (i *idler) lockThread() {
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0) // best effort: a failure only costs latency
	i.tid.Store(int32(unix.Gettid()))
}

// worked records that the last poll found records.
func (i *idler) worked(now time.Time) {
	i.lastWork = now
	i.sleep = minSleep
}

// idle waits a little after an empty poll: spins, yields, sleeps with exponential backoff, and when cold sleeps
// coldSleep (interruptible by wake). It reports whether it slept (the caller does its periodic checks only then).
func (i *idler) idle(now time.Time) bool {
	since := now.Sub(i.lastWork)
	switch {
	case since < spinFor:
		return false
	case since < yieldFor:
		runtime.Gosched()
		return false
	case since < coldAfter:
		nanosleep(i.sleep)
		i.sleep = min(2*i.sleep, maxSleep)
		return true
	}
	i.parked.Store(true) // before the sleep: a wake from now on interrupts it (or arrives just before; ≤ coldSleep)
	nanosleep(coldSleep)
	i.parked.Store(false)
	return true
}

// wake interrupts a cold sleep so a barrier or a stop is seen at once. Safe for concurrent use.
func (i *idler) wake() {
	if i.parked.Load() {
		if tid := i.tid.Load(); tid != 0 {
			_ = unix.Tgkill(os.Getpid(), int(tid), unix.SIGURG)
		}
	}
}

func nanosleep(d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	_ = unix.Nanosleep(&ts, nil) // EINTR just ends the sleep early
}
