package testenv

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
)

// Syscall numbers by the kernel's CPU (its name in /proc/sys/kernel/arch), for tests that read which system call a
// thread is blocked in from /proc/self/task/*/syscall. That file shows the kernel's numbering, which under a
// user-mode emulator (qemu-user running an arm64 test binary on an x86-64 kernel) is the host's, not GOARCH's.
type Syscalls struct {
	Futex      string // futex(2)
	FutexWaitv string // futex_waitv(2)
}

var syscallsByKernelArch = map[string]Syscalls{
	"x86_64":  {Futex: "202", FutexWaitv: "449"},
	"aarch64": {Futex: "98", FutexWaitv: "449"},
}

var kernelArchByGOARCH = map[string]string{"amd64": "x86_64", "arm64": "aarch64"}

// kernelArch is the kernel's CPU: /proc/sys/kernel/arch (Linux >= 6.1; a user-mode emulator does not rewrite it,
// unlike uname), else the CPU this binary was built for.
func kernelArch() string {
	if b, err := os.ReadFile("/proc/sys/kernel/arch"); err == nil {
		return strings.TrimSpace(string(b))
	}
	return kernelArchByGOARCH[runtime.GOARCH]
}

// KernelSyscalls returns the numbers /proc/self/task/*/syscall shows for the futex calls (zero values on a CPU
// kvshm does not know).
func KernelSyscalls() Syscalls { return syscallsByKernelArch[kernelArch()] }

// Emulated reports whether this binary runs on a kernel of another CPU, i.e. under a user-mode emulator
// (`make test-arm64` runs the arm64 test binaries with qemu-user on x86-64).
func Emulated() bool {
	want, known := kernelArchByGOARCH[runtime.GOARCH]
	return known && kernelArch() != want
}

// SkipIfEmulated skips the test under a user-mode emulator, saying which of the emulator's artifacts (not kvshm's
// behaviour) the test would otherwise observe.
func SkipIfEmulated(t testing.TB, artifact string) {
	t.Helper()
	if Emulated() {
		t.Skipf("emulation artifact (%s on a %s kernel): %s", runtime.GOARCH, kernelArch(), artifact)
	}
}

// SIGBUSAddress is the artifact that keeps the memory-fault tests from running emulated.
const SIGBUSAddress = "qemu-user delivers the SIGBUS of a truncated mapping with address 0, which the Go runtime " +
	"reports as a nil dereference, not as a memory fault with the faulting address"

// WaitvMissing says why a test of futex_waitv cannot run (call it when the kernel refused the call): qemu-user does
// not emulate it, or the kernel predates it.
func WaitvMissing() string {
	if Emulated() {
		return fmt.Sprintf("emulation artifact (%s on a %s kernel): qemu-user does not emulate futex_waitv "+
			"(ENOSYS); the daemon's per-ring fallback runs instead and is tested as such", runtime.GOARCH, kernelArch())
	}
	return "futex_waitv needs Linux 5.16 or later"
}
