package daemon

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// TestSignalDrainsRing: SIGTERM (and SIGINT) with a non-empty ring drain it before the exit, which is 0.
func TestSignalDrainsRing(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			socket := filepath.Join(t.TempDir(), "kvshmd.sock")
			d := startDaemon(t, socket)
			p := newProducer(t, socket, 3, 4, 1<<20)
			// Freeze the daemon so the events stay in the ring, then signal it.
			if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			waitStopped(t, d.cmd.Process.Pid)
			for i := range uint64(200) {
				p.mustPublish(stored(i, 0, nil, []uint64{1000 + i}, tokens(uint32(i), 1, 4)))
			}
			_, st, err := shm.Inspect(p.path)
			if err != nil || st.Head == st.Tail {
				t.Fatalf("ring should hold unread events before the signal: head %d tail %d err %v", st.Head, st.Tail, err)
			}
			_ = d.cmd.Process.Signal(sig)
			_ = d.cmd.Process.Signal(syscall.SIGCONT)
			if code := d.waitExit(t, 30*time.Second); code != 0 {
				t.Fatalf("exit code %d, want 0\n%s", code, d.log)
			}
			_, st, err = shm.Inspect(p.path)
			if err != nil || st.Head != st.Tail {
				t.Fatalf("ring not drained at exit: head %d tail %d err %v\n%s", st.Head, st.Tail, err, d.log)
			}
			if !strings.Contains(d.log.String(), "rings drained") {
				t.Errorf("log lacks the drain message:\n%s", d.log)
			}
		})
	}
}

// waitStopped waits until pid is in state T (stopped): kill(SIGSTOP) returns before the stop takes effect.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		st, err := shm.ReadProcStat(pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == 'T' {
			return
		}
	}
	t.Fatal("process did not stop within 10s")
}

// TestStaleSocket: a socket file left by a SIGKILLed daemon does not stop a new one; a live daemon does; a
// non-socket file at the path is never removed.
func TestStaleSocket(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "kvshmd.sock")
	d1 := startDaemon(t, socket)
	d1.kill()
	if fi, err := os.Lstat(socket); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("SIGKILL should leave the socket file behind: %v", err)
	}
	d2 := startDaemon(t, socket) // fails the test if it cannot answer HEALTH
	d2.waitLog(t, "removed stale socket")

	// A live daemon on the path: the newcomer exits 1 with an actionable message.
	cmd := exec.Command(kvshmdBin, "serve", "--socket", socket)
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !bytes.Contains(out, []byte("already listening")) {
		t.Errorf("second daemon on a live socket: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	if code := d2.terminate(t); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if _, err := os.Lstat(socket); !os.IsNotExist(err) {
		t.Errorf("clean shutdown should unlink the socket: %v", err)
	}

	// A regular file is not a stale socket.
	if err := os.WriteFile(socket, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(kvshmdBin, "serve", "--socket", socket)
	out, _ = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !bytes.Contains(out, []byte("not a socket")) {
		t.Errorf("serve over a regular file: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	if b, _ := os.ReadFile(socket); string(b) != "precious" {
		t.Error("the regular file at the socket path was touched")
	}

	// An unsafe directory (group/other writable) is refused.
	bad := filepath.Join(dir, "shared")
	if err := os.Mkdir(bad, 0o777); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(bad, 0o777)
	cmd = exec.Command(kvshmdBin, "serve", "--socket", filepath.Join(bad, "s.sock"))
	out, _ = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !bytes.Contains(out, []byte("unsafe socket directory")) {
		t.Errorf("serve in a 0777 directory: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
}

// TestKillRestartResumes: without a state directory, a SIGKILLed daemon's successor resumes the ring at the
// persisted head, applies what the producer published meanwhile, and reports that the earlier state is gone
// (resumed, tainted, dump = Error). TestKillRestartDefaultStateDir is the default.
func TestKillRestartResumes(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kvshmd.sock")
	d1 := startDaemon(t, socket, "--state-dir", "")
	p := newProducer(t, socket, 5, 4, 1<<20)
	for i := range uint64(10) {
		p.mustPublish(stored(i, 0, nil, []uint64{500 + i}, tokens(uint32(i*10), 1, 4)))
	}
	checkStats(t, socket, 5, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == 9 })
	_, before, _ := shm.Inspect(p.path)
	d1.kill()
	for i := uint64(10); i < 20; i++ { // the producer keeps publishing while no daemon runs
		p.mustPublish(stored(i, 0, nil, []uint64{500 + i}, tokens(uint32(i*10), 1, 4)))
	}
	d2 := startDaemon(t, socket, "--http", "127.0.0.1:0", "--state-dir", "")
	rep := p.attach()
	if !rep.Resumed || rep.Head != before.Head || rep.Head == 0 || rep.Epoch != p.w.Header().Epoch {
		t.Fatalf("attach after restart = %+v, want resumed at head %d", rep, before.Head)
	}
	st := checkStats(t, socket, 5, func(s sock.StreamStats) bool { return s.LastEventID != nil && *s.LastEventID == 19 })
	if !st.Tainted || *st.FirstEventID != 10 || st.Buffered != 10 {
		t.Errorf("stats after resume = %+v, want tainted with events 10..19", st)
	}
	assertIncompleteDump(t, realGet(t, d2.http), "unknown-0") // unknown history before the first id seen
	d2.waitLog(t, "earlier state is unknown")
}

// checkStats polls STATS of worker until ok accepts it (up to 10 s) and returns it.
func checkStats(t *testing.T, socket string, worker uint64, ok func(sock.StreamStats) bool) sock.StreamStats {
	t.Helper()
	c := dialT(t, socket)
	var last sock.StreamStats
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		r, err := c.Stats(ctxT(t), &worker)
		if err != nil {
			t.Fatal(err)
		}
		last = r.Streams[0]
		if ok(last) {
			return last
		}
	}
	t.Fatalf("stats never reached the expected state: %+v", last)
	return last
}

// TestParentPID: with --parent-pid the daemon drains and exits 0 once that process is gone.
func TestParentPID(t *testing.T) {
	parent := exec.Command("sleep", "60")
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "kvshmd.sock")
	d := startDaemon(t, socket, "--parent-pid", itoa(parent.Process.Pid))
	_ = parent.Process.Kill()
	_ = parent.Wait()
	if code := d.waitExit(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d\n%s", code, d.log)
	}
	if !strings.Contains(d.log.String(), "parent process is gone") {
		t.Errorf("log lacks the parent message:\n%s", d.log)
	}
}

// TestOtherUID: a client of another uid cannot use the daemon: the socket file's mode stops it at connect(), and
// with a permissive --socket-mode the SO_PEERCRED check answers forbidden. Needs root to run a setuid child.
func TestOtherUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child process with another uid (SysProcAttr.Credential)")
	}
	const nobody = 65534
	mk := func() string {
		dir, err := os.MkdirTemp("", "kvshmd-uid-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		_ = os.Chmod(dir, 0o755) // traversable by the other user; not writable
		return dir
	}
	asNobody := func(socket string) (int, string) {
		cmd := exec.Command(kvshmdBin, "health", "--socket", socket, "--timeout", "5s")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		out, err := cmd.CombinedOutput()
		if cmd.ProcessState == nil {
			t.Fatalf("run as uid %d: %v", nobody, err)
		}
		return cmd.ProcessState.ExitCode(), string(out)
	}

	socket := filepath.Join(mk(), "kvshmd.sock")
	startDaemon(t, socket) // default 0600
	if code, out := asNobody(socket); code != 3 || !strings.Contains(out, "not served by this user") {
		t.Errorf("kvshmd health as another uid: exit %d %s, want 3 and its client's refusal of our directory", code, out)
	}
	raw := exec.Command(otherUserBin, "health", socket)
	raw.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if out, err := raw.CombinedOutput(); !strings.Contains(string(out), "permission denied") {
		t.Errorf("other uid on a 0600 socket: %v %s, want permission denied", err, out)
	}

	// kvshmd's own client refuses a directory that is not its user's (TestClientRefusesImpostor), so the other
	// user speaks the protocol by hand here: a HEALTH frame, [u32 length 4][version 1][kind 7][status 0].
	socket = filepath.Join(mk(), "kvshmd.sock")
	d := startDaemon(t, socket, "--socket-mode", "0666")
	raw = exec.Command(otherUserBin, "health", socket)
	raw.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if out, err := raw.CombinedOutput(); !strings.Contains(string(out), "forbidden") {
		t.Errorf("other uid on a 0666 socket: %v %s, want a forbidden refusal", err, out)
	}
	d.waitLog(t, "refusing connection from another user")
	// The daemon still serves its own user.
	c := dialT(t, socket)
	if _, err := c.Health(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// TestClientRefusesImpostor is a defect the soak found: a client must not talk to a socket another user controls. (a)
// The socket directory belongs to another user (who made the per-user temp directory first): Dial refuses before
// connecting. (b) The directory is ours but the listener is another user's process (it called listen(2) on a
// socket we bound and handed over, the only way it can sit in our private directory): SO_PEERCRED names it, and
// Dial refuses before sending a byte. Needs root to run a process as another uid.
func TestClientRefusesImpostor(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child process with another uid (SysProcAttr.Credential)")
	}
	const nobody = 65534
	theirs := t.TempDir()
	if err := os.Chown(theirs, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if _, err := sock.Dial(ctxT(t), filepath.Join(theirs, "kvshmd.sock")); !errors.Is(err, sock.ErrUntrustedServer) {
		t.Fatalf("Dial into another user's directory = %v, want sock.ErrUntrustedServer", err)
	}

	ours := t.TempDir()
	_ = os.Chmod(ours, 0o700)
	path := filepath.Join(ours, "kvshmd.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "bound")
	defer f.Close()
	impostor := exec.Command(otherUserBin, "listen")
	impostor.ExtraFiles = []*os.File{f}
	impostor.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	stdout, err := impostor.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := impostor.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stdout)
	if line, err := br.ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("impostor did not start: %q %v", line, err)
	}
	_, err = sock.Dial(ctxT(t), path)
	if !errors.Is(err, sock.ErrUntrustedServer) || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("Dial to another user's listener = %v, want sock.ErrUntrustedServer naming uid 65534", err)
	}
	rest, _ := io.ReadAll(br)
	_ = impostor.Wait()
	if string(rest) != "received 0\n" {
		t.Fatalf("the impostor got %q, want nothing sent", rest)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
