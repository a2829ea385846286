package daemon

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvshm/kvshm/shm"
)

// Idle strategy of a drain goroutine (Aeron's BackoffIdleStrategy, with the sleeps done by futex naps, ending in a
// futex doorbell):
//
//	after the last record: 0 ─ spinFor ─ yieldFor ──── warm: Nap 50µs,100µs,…,1ms ──── coldAfter ── parked ──►
//	                       busy poll    Gosched polls  poll after each nap              Reader.Park ≤ parkFor
//
// Go timers cannot sleep below about 1 ms on an idle Linux process (the netpoller waits in whole milliseconds), so
// the warm sleeps are timed futex waits (shm.Reader.Nap) on the drain goroutine's own locked OS thread, whose timer
// slack is lowered to 1 µs (prctl PR_SET_TIMERSLACK; the default 50 µs slack would double a 50 µs sleep). While
// records keep coming a record is reached within about one sleep period (~100 µs at a few thousand records per
// second). A query barrier cuts a nap short (Reader.Wake), so a query never waits out a sleep.
//
// Each wakeup costs ~10-40 µs of CPU on a virtual machine (measured: a C nanosleep(1 ms) loop uses 0.7% of a core
// there, the same loop in Go 2-4%), so sleeping 1 ms forever cannot meet "≤ 1% of a core when idle", and a stream
// that naps for long after each of its records costs a lot on a node of many slowly publishing ranks (with 100 ms,
// 64 streams at 10 events/s took 24-42% of a core: bench/RESULTS.md, scale). After coldAfter without records the
// stream parks: shm.Reader.Park sets the ring's consumer_parked word and sleeps in
// FUTEX_WAIT on the tail word; the producer's next publish sees the flag and rings (FUTEX_WAKE), so the first
// record after an idle period is reached in about one wakeup, and an idle stream costs one wakeup per parkFor. A
// query barrier or a stop interrupts the park with Reader.Wake. The park timeout bounds what a missed doorbell can
// cost: the Python producer cannot fence between its tail store and its load of consumer_parked, so (rarely) its
// wakeup is lost and that record waits for the timeout (FORMAT.md, "Doorbell"); it is also the period of the idle
// stream's housekeeping (heartbeat and ring statistics, the CLOSED-state check, the producer pid check, which
// therefore runs every max(parkFor, PIDCheckInterval)). 250 ms keeps those four well under a second while an idle
// stream wakes 4 times a second (~0.01% of a core). BenchmarkDaemonIdleCPU and BenchmarkDaemonReachLatency print
// the figures.
const (
	spinFor   = 30 * time.Microsecond
	yieldFor  = 60 * time.Microsecond
	minSleep  = 50 * time.Microsecond
	maxSleep  = time.Millisecond
	coldAfter = 20 * time.Millisecond // a stream publishing every 100 ms parks between records (issue 9)
	// A stream kvshmd publishes on ZMQ parks much sooner: the producer's doorbell then wakes the drain for each
	// record after a pause, so publish→subscriber latency is one wakeup (issue 12: p99 ≤ 1 ms at 1,000 batches/s)
	// instead of the rest of a backoff nap (up to maxSleep). The producer pays a FUTEX_WAKE (~1-2 µs) per record
	// that finds the stream parked. Its park is shorter too: parking after nearly every record makes the rare
	// lost doorbell (above) frequent enough to matter, and publishParkFor bounds what one costs a subscriber, for
	// ~100 wakeups a second of an idle publishing stream.
	publishColdAfter = 150 * time.Microsecond
	publishParkFor   = 10 * time.Millisecond
	parkFor          = 250 * time.Millisecond
)

// idler is owned by one drain goroutine, except wake, which any goroutine may call.
type idler struct {
	r        *shm.Reader // the drain goroutine's ring; Wake is safe from any goroutine
	lastWork time.Time
	sleep    time.Duration
	cold     time.Duration // parks after this long without records: coldAfter, or publishColdAfter
	park     time.Duration // for at most this long: parkFor, or publishParkFor
}

// lockThread pins the calling goroutine to its OS thread and lowers the thread's timer slack. The goroutine
// never unlocks: when it exits, the runtime discards the thread with its modified slack.
func (i *idler) lockThread() {
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0) // best effort: a failure only costs latency
}

// worked records that the last poll found records.
func (i *idler) worked(now time.Time) {
	i.lastWork = now
	i.sleep = minSleep
}

// idle waits a little after an empty poll (the caller has released the head): spins, yields, sleeps with
// exponential backoff, and when cold parks on the ring's doorbell for up to parkFor (interrupted by a publish or by
// wake). It reports whether it slept (the caller does its periodic checks only then).
func (i *idler) idle(now time.Time) bool {
	since := now.Sub(i.lastWork)
	switch {
	case since < spinFor:
		return false
	case since < yieldFor:
		runtime.Gosched()
		return false
	case since < i.cold:
		i.r.Nap(i.sleep) // a query barrier's wake cuts it short
		i.sleep = min(2*i.sleep, maxSleep)
		return true
	}
	i.r.Park(i.park) // returns early on a publish, a wake, or (rarely) a signal; the caller polls either way
	return true
}

// wake interrupts a nap or a park (or makes the next one return at once) so a barrier or a stop is seen at once.
// Safe for concurrent use, also after the drain goroutine closed the ring.
func (i *idler) wake() { i.r.Wake() }
