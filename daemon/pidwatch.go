package daemon

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/kvshm/kvshm/shm"
	"golang.org/x/sys/unix"
)

// pidWatch follows a producer process for the pid backstop. With a pidfd (pidfd_open, Linux >= 5.3) a check is
// one poll(2) with no wait (the pidfd is readable once the process has terminated), where processAlive reads
// /proc/<pid>/stat: 64 attached streams checked every second cost the idle daemon ~20% of its CPU that way
// (perf, BenchmarkDaemonIdleCPU streams=64). The pidfd pins the process that was checked when it was opened, so a
// recycled pid cannot pass for it afterwards. Without one (an older kernel, another pid namespace, a race with the
// producer's exit) every check falls back to processAlive. Owned by the attachment's drain goroutine.
type pidWatch struct {
	fd    int // the pidfd, or -1
	pid   int
	start uint64
}

// openPIDWatch opens a pidfd for pid if the process is alive and started at start (0: unknown).
func openPIDWatch(pid int, start uint64) pidWatch {
	w := pidWatch{fd: -1, pid: pid, start: start}
	if pid <= 0 {
		return w
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return w
	}
	// Checked after opening: the pidfd now refers to the process whose start time matched, not to a later one.
	if !processAlive(pid, start) {
		_ = unix.Close(fd)
		return w
	}
	w.fd = fd
	return w
}

// Alive reports whether the watched process is still running.
func (w *pidWatch) Alive() bool {
	if w.fd < 0 {
		return processAlive(w.pid, w.start)
	}
	fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if err != nil {
		return processAlive(w.pid, w.start)
	}
	return n == 0
}

// Close releases the pidfd; Alive falls back to processAlive after it.
func (w *pidWatch) Close() {
	if w.fd >= 0 {
		_ = unix.Close(w.fd)
		w.fd = -1
	}
}

// waitExit blocks until the process pid (started at start, 0: unknown) has exited (true) or ctx ends (false),
// without polling: a pidfd becomes readable when its process exits, and the Go netpoller waits for that like for
// a socket, so the --parent-pid watch of a private daemon costs nothing until its engine is gone (it read
// /proc/<pid>/stat five times a second: ~10% of an idle private daemon's CPU). ok is false without a pidfd (an
// older kernel, another pid namespace): the caller polls processAlive instead.
func waitExit(ctx context.Context, pid int, start uint64) (exited, ok bool) {
	if pid <= 0 {
		return false, false
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return false, false
	}
	f := os.NewFile(uintptr(fd), "pidfd") // non-blocking: registered with the netpoller
	defer f.Close()
	// Checked after opening: the pidfd now refers to the process whose start time matched, not to a later one.
	if !processAlive(pid, start) {
		return true, true
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return false, false
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now()) })
	defer stop()
	err = rc.Read(func(fd uintptr) bool {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		return err == nil && n > 0 // readable: exited (EINTR: not yet; the netpoller waits on)
	})
	if err != nil {
		return false, ctx.Err() != nil // the deadline: ctx ended; anything else: fall back to polling
	}
	return true, true
}

// processAlive reports whether pid exists, is not a zombie (a killed engine stays one until its parent reaps it)
// and, when startTime is nonzero, still has that start time (field 22 of /proc/<pid>/stat), so a recycled pid is
// not mistaken for the original process.
func processAlive(pid int, startTime uint64) bool {
	if pid <= 0 {
		return false
	}
	if err := unix.Kill(pid, 0); err != nil && !errors.Is(err, unix.EPERM) {
		return false
	}
	st, err := shm.ReadProcStat(pid)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	if st.State == 'Z' || st.State == 'X' {
		return false
	}
	return startTime == 0 || st.StartTime == startTime
}
