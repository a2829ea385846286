package drain

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvshm/kvshm/shm"
)

// Stream is one ring a worker drains. Every method runs on the stream's worker goroutine, one at a time, from Add
// until Final or Fault has returned.
type Stream interface {
	// Ring is the stream's Reader: the worker arms its doorbell, disarms it before Pass and Final, and waits on it.
	Ring() *shm.Reader
	// Ready reports cheaply (a few header loads, no system call) whether a Pass has work: records published, or
	// something else only a pass handles (kvshmd: a loss the ring header reports and the index has not marked).
	Ready() bool
	// Pass drains up to one batch of records and serves what Wake asked for; it returns the records consumed.
	Pass(now time.Time) int
	// Housekeep runs the stream's periodic work due at now and returns when it is next due (zero: never). The
	// interval from now to it also bounds a lost doorbell (see doc.go). An error ends the stream as a fault:
	// Fault(err) is called and the stream dropped.
	Housekeep(now time.Time) (next time.Time, err error)
	// Final is called once after Handle.Stop: the last drain, and the stream's own teardown (closing the ring).
	Final()
	// Fault is called once when a call into the stream hit a memory fault (cause: the recovered value) or Housekeep
	// failed (cause: its error): the ring must not be touched again.
	Fault(cause any)
}

// Tuning of the idle strategy (doc.go, "Park first, poll only when it is cheaper").
const (
	// hotGap: a stream whose bursts come closer than this is polled instead of parked: about what one wakeup
	// costs on a 2-vCPU virtual machine, the producer's FUTEX_WAKE of a sleeping worker (~10 µs of the engine's
	// time, 0.24 µs when nobody sleeps) plus the worker's own wakeup and the Go runtime's around it (~100 µs of
	// daemon CPU per event at 64 streams × 10 events/s, BenchmarkDaemonProcCPU). At 40 µs a kvshm LocalIndexer
	// applying a 32-block Stored every ~100 µs paid the FUTEX_WAKE each time: apply_stored's median 36 → 80 µs
	// (bench/zmq_bench.py inline, side b).
	hotGap = 150 * time.Microsecond
	// spinMin, spinMax bound how long after its last burst a hot stream keeps the worker polling (twice its gap).
	spinMin = 20 * time.Microsecond
	spinMax = 300 * time.Microsecond
	// maxWait caps a sleep without any deadline (a worker with no stream).
	maxWait = time.Minute
	// faultNap is how long a worker sleeps after a futex_waitv EFAULT that no ring explains, so it cannot spin.
	faultNap = time.Millisecond
)

// Config configures a Scheduler. The zero value is the default.
type Config struct {
	// RingsPerWorker caps the streams of one worker (0: DefaultRingsPerWorker; at most shm.MaxDoorbells). Each
	// sleep re-queues every armed ring in the kernel (~0.27 µs each, BenchmarkDoorbellsWait), so smaller sets make
	// a wakeup cheaper and bigger ones batch more streams per wakeup.
	RingsPerWorker int
	// NoWaitv forces the fallback (one worker per stream on Reader.Park), as on a kernel without futex_waitv.
	NoWaitv bool
}

// DefaultRingsPerWorker is Config.RingsPerWorker's default.
const DefaultRingsPerWorker = 16

// Scheduler assigns streams to workers. Safe for concurrent use.
type Scheduler struct {
	perWorker int
	fallback  bool

	mu      sync.Mutex // protects workers and closed
	workers []*worker
	closed  bool
	wg      sync.WaitGroup
}

// New returns a Scheduler; workers start with the first streams.
func New(cfg Config) *Scheduler {
	n := cfg.RingsPerWorker
	if n <= 0 {
		n = DefaultRingsPerWorker
	}
	return &Scheduler{perWorker: min(n, shm.MaxDoorbells), fallback: cfg.NoWaitv || !shm.WaitvSupported()}
}

// Fallback reports whether the scheduler runs one worker per stream (no futex_waitv, or Config.NoWaitv).
func (s *Scheduler) Fallback() bool { return s.fallback }

// ErrClosed is returned by Add after Close.
var ErrClosed = errors.New("kvshm/drain: scheduler closed")

// Add hands st to a worker (the least loaded one with room; a new one when all are full, and always in the
// fallback) and returns its handle. From here on st is owned by that worker.
func (s *Scheduler) Add(st Stream) (*Handle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	var w *worker
	if !s.fallback {
		for _, c := range s.workers {
			if c.load < s.perWorker && (w == nil || c.load < w.load) {
				w = c
			}
		}
	}
	if w == nil {
		w = &worker{s: s}
		if s.fallback {
			w.solo = st.Ring()
		} else {
			w.db = shm.NewDoorbells()
		}
		s.workers = append(s.workers, w)
	}
	w.load++
	e := &entry{st: st, r: st.Ring()}
	h := &Handle{w: w, e: e}
	w.inMu.Lock()
	w.inbox = append(w.inbox, e)
	w.inMu.Unlock()
	if w.load == 1 && !w.started {
		// Started after its first stream is in the inbox: a fallback worker exits when it has none.
		w.started = true
		s.wg.Add(1)
		go w.run()
	} else {
		w.wake()
	}
	return h, nil
}

// Close stops every stream still attached (Final) and waits for the workers to exit. Add fails after it.
func (s *Scheduler) Close() {
	s.mu.Lock()
	s.closed = true
	ws := slices.Clone(s.workers) // exiting workers remove themselves from s.workers
	s.mu.Unlock()
	for _, w := range ws {
		w.closing.Store(true)
		w.wake()
	}
	s.wg.Wait()
}

// Handle is a stream's control from other goroutines. Safe for concurrent use.
type Handle struct {
	w *worker
	e *entry
}

// Wake asks the worker for a pass of the stream soon (a query barrier): it wakes the worker if it sleeps.
func (h *Handle) Wake() {
	h.e.attn.Store(true) // before the wake: the worker loads it after its wait returns
	h.w.wake()
}

// Stop asks the worker to call the stream's Final and drop it. Idempotent.
func (h *Handle) Stop() {
	h.e.stop.Store(true)
	h.w.wake()
}

// entry is a stream in its worker.
type entry struct {
	st Stream
	r  *shm.Reader

	attn atomic.Bool // Wake was called since the last pass. Updated atomically.
	stop atomic.Bool // Stop was called. Updated atomically.

	// Owned by the worker.
	next     time.Time     // housekeeping deadline (zero: none)
	period   time.Duration // next - the time Housekeep last ran: a quarter of it is the coalescing slack
	lastRec  time.Time     // the last pass that found records
	gap      time.Duration // EWMA of the time between passes that found records; valid when gapKnown
	gapKnown bool
}

// worker drains a set of streams on one goroutine.
type worker struct {
	s       *Scheduler
	db      *shm.Doorbells // nil in the fallback
	solo    *shm.Reader    // the fallback worker's one ring
	load    int            // streams assigned (Add) and not yet dropped; protected by s.mu
	started bool           // run was started; protected by s.mu

	inMu    sync.Mutex // protects inbox
	inbox   []*entry
	closing atomic.Bool // Scheduler.Close. Updated atomically.

	// Owned by the worker goroutine.
	entries []*entry
	armed   []*shm.Reader
}

func (w *worker) wake() {
	if w.db != nil {
		w.db.Wake()
	} else {
		w.solo.Wake() // safe after the ring is closed
	}
}

func (w *worker) run() {
	defer w.s.wg.Done()
	// A ring file cut short by another process makes any access to its mapping a SIGBUS, which would kill the
	// daemon. On this goroutine it is a panic instead, which step hands to the stream's Fault.
	debug.SetPanicOnFault(true)
	for {
		w.takeInbox()
		if w.closing.Load() {
			for _, e := range w.entries {
				e.stop.Store(true)
			}
		}
		now := time.Now()
		found := w.poll(now)
		w.housekeep(now)
		if len(w.entries) == 0 && (w.solo != nil || w.closing.Load()) {
			w.inMu.Lock()
			empty := len(w.inbox) == 0
			w.inMu.Unlock()
			if empty {
				w.exit()
				return // a fallback worker serves one stream; a closing one has stopped all of its own
			}
		}
		if found {
			continue // poll again at once: the next empty poll arms
		}
		if w.hot(time.Now()) {
			runtime.Gosched()
			continue
		}
		if !w.armAll() {
			continue // records arrived while arming
		}
		w.wait(w.timeout(time.Now()))
	}
}

// exit forgets the worker (its goroutine returns).
func (w *worker) exit() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	for i, x := range w.s.workers {
		if x == w {
			w.s.workers = append(w.s.workers[:i], w.s.workers[i+1:]...)
			break
		}
	}
}

// takeInbox moves new streams into the worker's set; each gets its first Housekeep at once.
func (w *worker) takeInbox() {
	w.inMu.Lock()
	in := w.inbox
	w.inbox = nil
	w.inMu.Unlock()
	for _, e := range in {
		e.next = time.Now()
		w.entries = append(w.entries, e)
	}
}

// step runs fn for every entry from w.entries[i] on, containing memory faults per stream: a fault in fn(e) hands
// the recovered value to e's Fault, drops e, and step goes on with the next entry. fn may drop the entry it is
// given (drop), so step walks the entries by identity.
func (w *worker) step(fn func(e *entry)) {
	for i := 0; i < len(w.entries); {
		e := w.entries[i]
		if w.stepOne(e, fn) && i < len(w.entries) && w.entries[i] == e {
			i++
		}
	}
}

// stepOne runs fn(e); it reports false when e faulted (it is dropped then).
func (w *worker) stepOne(e *entry, fn func(e *entry)) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			if !isMemoryFault(r) {
				panic(r)
			}
			w.fault(e, r)
			ok = false
		}
	}()
	fn(e)
	return true
}

// fault hands cause to e's Fault (itself contained: a second fault there is dropped) and forgets e.
func (w *worker) fault(e *entry, cause any) {
	w.drop(e)
	func() {
		defer func() {
			if r := recover(); r != nil && !isMemoryFault(r) {
				panic(r)
			}
		}()
		e.st.Fault(cause)
	}()
}

// drop removes e from the worker.
func (w *worker) drop(e *entry) {
	for i, x := range w.entries {
		if x == e {
			last := len(w.entries) - 1
			w.entries[i] = w.entries[last]
			w.entries[last] = nil
			w.entries = w.entries[:last]
			break
		}
	}
	w.s.mu.Lock()
	w.load--
	w.s.mu.Unlock()
}

// poll runs a pass of every stream that has work or asked for one, and the Final of every stopped stream. It
// reports whether any pass found records.
func (w *worker) poll(now time.Time) (found bool) {
	w.step(func(e *entry) {
		if e.stop.Load() {
			e.r.Disarm()
			e.st.Final()
			w.drop(e)
			return
		}
		attn := e.attn.Load() && e.attn.Swap(false)
		if !attn && !e.st.Ready() {
			return
		}
		e.r.Disarm() // the worker is awake for this ring: its producer need not ring
		if n := e.st.Pass(now); n > 0 {
			found = true
			switch g := now.Sub(e.lastRec); {
			case e.lastRec.IsZero():
			case !e.gapKnown:
				e.gap, e.gapKnown = g, true
			default:
				e.gap = (3*e.gap + g) / 4
			}
			e.lastRec = now
		}
	})
	return found
}

// housekeep runs the Housekeep of every stream whose deadline is due, or within a quarter of its period (so the
// deadlines of idle streams coalesce into one wakeup). A linear walk: every wakeup already visits every entry in
// poll, and a worker holds at most shm.MaxDoorbells of them.
func (w *worker) housekeep(now time.Time) {
	w.step(func(e *entry) {
		if e.next.IsZero() || e.next.Sub(now) > e.period/4 {
			return
		}
		next, err := e.st.Housekeep(now)
		if err != nil {
			w.fault(e, err)
			return
		}
		e.next, e.period = next, next.Sub(now)
	})
}

// hot reports whether some stream's bursts come faster than a wakeup and its last one is recent: then polling
// again is cheaper than sleeping.
func (w *worker) hot(now time.Time) bool {
	for _, e := range w.entries {
		if e.gapKnown && e.gap < hotGap && now.Sub(e.lastRec) < min(max(2*e.gap, spinMin), spinMax) {
			return true
		}
	}
	return false
}

// armAll arms every ring (the flag, then the tail reload; an armed ring only re-checks its tail, so a corrupt
// tail word cannot make the wait return at once forever). It reports false when some ring has records.
func (w *worker) armAll() bool {
	ok := true
	w.step(func(e *entry) {
		if !e.r.Arm() {
			ok = false
		}
	})
	return ok
}

// timeout is how long the worker may sleep: until the earliest housekeeping deadline.
func (w *worker) timeout(now time.Time) time.Duration {
	d := maxWait
	for _, e := range w.entries {
		if !e.next.IsZero() {
			d = min(d, max(e.next.Sub(now), 0))
		}
	}
	return d
}

// wait sleeps until a doorbell, a Wake or the timeout.
func (w *worker) wait(timeout time.Duration) {
	if w.db == nil { // the fallback: the one ring's Park (armed) or Nap; Park touches the mapping
		if len(w.entries) == 0 {
			w.solo.Nap(timeout)
			return
		}
		w.step(func(e *entry) {
			if e.r.Armed() {
				e.r.Park(timeout)
			} else {
				e.r.Nap(timeout)
			}
		})
		return
	}
	w.armed = w.armed[:0]
	for _, e := range w.entries {
		w.armed = append(w.armed, e.r)
	}
	err := w.db.Wait(w.armed, timeout)
	switch {
	case errors.Is(err, shm.ErrDoorbellFault):
		// An armed ring's header page is gone: find the truncated ones (they fault on their next access anyway,
		// but an idle ring is touched only here).
		cut := false
		for _, e := range append([]*entry(nil), w.entries...) {
			if t, size := e.r.Truncated(); t {
				cut = true
				w.fault(e, truncated{size})
			}
		}
		if !cut {
			time.Sleep(faultNap)
		}
	case err != nil: // ErrNoWaitv after the probe said otherwise, ErrTooManyDoorbells: never expected
		time.Sleep(faultNap)
	}
}

// truncated is the cause Fault gets when a futex_waitv EFAULT is explained by a ring file shorter than its mapping.
type truncated struct{ size int64 }

func (t truncated) Error() string {
	return fmt.Sprintf("the ring file was truncated to %d bytes", t.size)
}

// isMemoryFault reports whether a recovered panic is a memory fault (SetPanicOnFault): the runtime's error for it
// carries the faulting address.
func isMemoryFault(r any) bool {
	_, ok := r.(interface{ Addr() uintptr })
	return ok
}
