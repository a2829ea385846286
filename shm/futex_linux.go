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
