package shm

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// MaxDoorbells is how many rings one Doorbells.Wait can wait on: futex_waitv takes 128 words, one of which is the
// waiter's own wake word.
const MaxDoorbells = futexWaitvMax - 1

var (
	// ErrNoWaitv is returned by Doorbells.Wait when the kernel has no futex_waitv (Linux before 5.16): the caller
	// falls back to one Reader.Park per ring.
	ErrNoWaitv = errors.New("kvshm/shm: futex_waitv is not available (Linux 5.16 or later is needed)")
	// ErrDoorbellFault is returned by Doorbells.Wait when the kernel could not read a ring's tail word (EFAULT):
	// a ring file was truncated under its mapping. The caller checks its rings (Reader.Truncated).
	ErrDoorbellFault = errors.New("kvshm/shm: a doorbell word is not mapped (ring file truncated?)")
	// ErrTooManyDoorbells is returned by Doorbells.Wait when given more than MaxDoorbells armed rings.
	ErrTooManyDoorbells = errors.New("kvshm/shm: too many rings for one doorbell wait")
)

// Doorbells lets one goroutine sleep until any of a set of rings is published to, or until another goroutine
// calls Wake: one futex_waitv on the tail words of the armed rings (Reader.Arm) plus a private wake word.
// Producers are unchanged: arming a ring is Reader.Park's half of the doorbell protocol, and the producer's
// FUTEX_WAKE on the tail word wakes a futex_waitv as it wakes a FUTEX_WAIT (the same shared futex key).
//
// Wait is owned by one goroutine (which also owns the Readers it waits on); Wake is safe from any goroutine at any
// time. A Doorbells must not be copied (the kernel holds the wake word's address during Wait): use NewDoorbells.
//
// The wake word is an eventcount. Wake increments it (seq-cst) and then, only if the waiter is in Wait, calls
// FUTEX_WAKE. Wait sleeps only while the word still holds the value it had when the previous Wait returned, so a
// Wake that comes after the waiter last looked at its inbox (it does so after each Wait returns) either makes the
// kernel's comparison fail (EAGAIN: Wait returns at once) or finds sleeping set and rings. sleeping is stored
// (seq-cst, a full fence on amd64) before the kernel loads the word, and Wake loads it after its increment: the
// Dekker pair of FORMAT.md's doorbell, with both sides fenced, so no Wake is lost.
type Doorbells struct {
	word     uint32       // the wake word (a private futex). Incremented by Wake; accessed with sync/atomic only.
	sleeping atomic.Bool  // Wait is between its store and its return. Updated atomically.
	seen     uint32       // word's value when Wait last returned. Owned by the waiter.
	vec      []futexWaitv // owned by the waiter
}

// NewDoorbells returns an empty doorbell set.
func NewDoorbells() *Doorbells {
	return &Doorbells{vec: make([]futexWaitv, 0, futexWaitvMax)}
}

var waitvProbe = sync.OnceValue(func() bool {
	// nr_futexes = 0 is EINVAL where the syscall exists, ENOSYS where it does not.
	_, _, errno := unix.Syscall6(sysFutexWaitv, 0, 0, 0, 0, 0, 0)
	return errno != unix.ENOSYS
})

// WaitvSupported reports whether this kernel has futex_waitv (probed once).
func WaitvSupported() bool { return waitvProbe() }

// Wait sleeps until a producer publishes to one of rings (each must be armed: Reader.Arm returned true, and not
// disarmed since), Wake is called (since the previous Wait returned, or during this one), or timeout passes. It
// may also return early (a signal, a spurious wakeup): the caller polls its rings and its inbox after every
// return, whatever the reason. rings that are not armed are skipped. It returns ErrNoWaitv, ErrDoorbellFault or
// ErrTooManyDoorbells without sleeping long; nil otherwise.
func (d *Doorbells) Wait(rings []*Reader, timeout time.Duration) error {
	_, err := d.wait(rings, timeout)
	return err
}

// wait is Wait; timedOut reports that the kernel's wait ended with ETIMEDOUT (tests assert a wake never needs it).
func (d *Doorbells) wait(rings []*Reader, timeout time.Duration) (timedOut bool, err error) {
	vec := d.vec[:1]
	for _, r := range rings {
		if !r.armed || r.m == nil {
			continue
		}
		if len(vec) == futexWaitvMax {
			return false, ErrTooManyDoorbells
		}
		vec = append(vec, futexWaitv{})
		// The value Arm loaded after storing consumer_parked: a tail store since then changes the word (EAGAIN),
		// and a producer storing it later sees consumer_parked and rings (see Reader.Arm).
		waitvEntry(&vec[len(vec)-1], r.futex, r.armedTail, false)
	}
	d.sleeping.Store(true) // seq-cst, before the kernel loads the wake word: pairs with Wake's increment
	waitvEntry(&vec[0], &d.word, d.seen, true)
	errno := futexWaitvTimeout(vec, timeout)
	d.sleeping.Store(false)
	d.seen = atomic.LoadUint32(&d.word) // wakes up to here are consumed: the caller looks at its inbox after Wait returns
	d.vec = vec
	runtime.KeepAlive(d)
	switch errno {
	case unix.ENOSYS:
		return false, ErrNoWaitv
	case unix.EFAULT:
		return false, ErrDoorbellFault
	}
	return errno == unix.ETIMEDOUT, nil
}

// Wake makes the current Wait return at once, or the next one if none is in progress. Safe for concurrent use;
// it makes a system call only while the waiter sleeps.
func (d *Doorbells) Wake() {
	atomic.AddUint32(&d.word, 1) // seq-cst (LOCK XADD), before the sleeping load: pairs with Wait's store
	if d.sleeping.Load() {
		futexWakePrivate(&d.word)
	}
}
