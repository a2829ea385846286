package shm

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The doorbell's futex calls (futex(2)). golang.org/x/sys/unix has SYS_FUTEX but neither a wrapper nor the
// operation constants; these are the values of <linux/futex.h>. FUTEX_PRIVATE_FLAG (128) must NOT be set: the
// futex word lives in a MAP_SHARED mapping and the waiter and the waker are different processes, which only the
// shared (inode, offset) futex key matches.
const (
	futexWait    = 0   // FUTEX_WAIT: sleep if *addr == val, until FUTEX_WAKE, a signal or the relative timeout
	futexWake    = 1   // FUTEX_WAKE: wake up to val waiters on addr
	futexPrivate = 128 // FUTEX_PRIVATE_FLAG: a word of this process only (Reader.Nap's, in Go memory)
)

// futexWaitTimeout sleeps while *addr == val, at most d. Every outcome is a normal return: 0 (woken by
// FUTEX_WAKE, or spuriously), EAGAIN (*addr != val already), EINTR (a signal), ETIMEDOUT. The caller re-checks
// the state it waits for. It returns the errno (0 when woken). The syscall goes through Syscall6 (not RawSyscall)
// so the runtime can hand the P off while the thread sleeps.
func futexWaitTimeout(addr *uint32, val uint32, d time.Duration) unix.Errno {
	ts := unix.NsecToTimespec(int64(max(d, time.Microsecond)))
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
	return errno
}

// futexWakeAll wakes every waiter on addr and returns how many were woken (0 on error: EFAULT for an address
// that is no longer mapped cannot happen for callers that hold the mapping).
func futexWakeAll(addr *uint32) int {
	n, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(1<<31-1), 0, 0, 0)
	if errno != 0 {
		return 0
	}
	return int(n)
}

// futexWaitPrivate is futexWaitTimeout on a word of this process (Go heap memory does not move, so its address is
// a stable futex key).
func futexWaitPrivate(addr *uint32, val uint32, d time.Duration) unix.Errno {
	ts := unix.NsecToTimespec(int64(max(d, time.Microsecond)))
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait|futexPrivate, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
	return errno
}

// futexWakePrivate wakes every waiter on a word of this process and returns how many were woken.
func futexWakePrivate(addr *uint32) int {
	n, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake|futexPrivate, uintptr(1<<31-1), 0, 0, 0)
	if errno != 0 {
		return 0
	}
	return int(n)
}

// futex_waitv(2) (Linux >= 5.16): one wait on up to 128 futex words. Its number is the same on every
// architecture (a syscall added after the table unification). sysFutexWaitv is a variable so a test can point it
// at a number no kernel has, to exercise the ENOSYS fallback.
var sysFutexWaitv uintptr = 449

const (
	futexWaitvMax = 128  // FUTEX_WAITV_MAX
	futex2SizeU32 = 0x02 // FUTEX2_SIZE_U32: the words are 32 bits
	futex2Private = 128  // FUTEX2_PRIVATE: a word of this process (the same value as FUTEX_PRIVATE_FLAG)
)

// futexWaitv is struct futex_waitv of <linux/futex.h>: the expected value, the word's address and flags. Its
// layout is the kernel's ABI: 24 bytes, no implicit padding.
type futexWaitv struct {
	val      uint64
	uaddr    uint64
	flags    uint32
	reserved uint32
}

// waitvEntry fills e with the word at addr expected to hold val. private: a word of this process (Go memory);
// otherwise a word of a MAP_SHARED ring, matched by the shared key the producer's FUTEX_WAKE uses (never the
// private flag there, as for futexWaitTimeout). The caller keeps the word's memory alive until the wait returns.
func waitvEntry(e *futexWaitv, addr *uint32, val uint32, private bool) {
	e.val, e.uaddr, e.flags = uint64(val), uint64(uintptr(unsafe.Pointer(addr))), futex2SizeU32
	if private {
		e.flags |= futex2Private
	}
}

// futexWaitvTimeout sleeps while every word of vec holds its val, at most d (futex_waitv takes an absolute
// CLOCK_MONOTONIC deadline). It returns the errno: 0 (woken: the syscall returns the woken entry's index),
// EAGAIN (a word differed already), EINTR, ETIMEDOUT, EFAULT (a word is not mapped: a ring file truncated under
// its mapping), ENOSYS (a kernel before 5.16).
func futexWaitvTimeout(vec []futexWaitv, d time.Duration) unix.Errno {
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		return err.(unix.Errno)
	}
	deadline := unix.NsecToTimespec(unix.TimespecToNsec(now) + int64(max(d, time.Microsecond)))
	_, _, errno := unix.Syscall6(sysFutexWaitv, uintptr(unsafe.Pointer(unsafe.SliceData(vec))), uintptr(len(vec)), 0,
		uintptr(unsafe.Pointer(&deadline)), uintptr(unix.CLOCK_MONOTONIC), 0)
	return errno
}
