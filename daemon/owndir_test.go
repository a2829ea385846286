package daemon

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

const testToken = "0123456789abcdef0123456789abcdef"

// writeToken writes the launcher's cleanup token into dir and returns it.
func writeToken(t *testing.T, dir string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, CleanupTokenFile), []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return testToken
}

// sshLike makes a 0700 directory of the user's with files of its own, as ~/.ssh.
func sshLike(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"id_ed25519", "known_hosts"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("keep me"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func intact(t *testing.T, dir string) bool {
	t.Helper()
	_, err := os.Stat(filepath.Join(dir, "id_ed25519"))
	return err == nil
}

// TestCleanupDirClaim: --cleanup-dir is claimed only for a 0700 directory of the daemon's uid that holds the token
// it was given; anything else is refused (ErrUnsafeCleanupDir) and left as it was. Before, any 0700 directory of the
// user (an operator's ~/.ssh) was deleted at exit.
func TestCleanupDirClaim(t *testing.T) {
	base := t.TempDir()
	cases := []struct {
		name  string
		make  func(dir string) // dir holds id_ed25519 after it, unless it is not a directory
		token string
		ok    bool
	}{
		{"the launcher's directory", func(d string) { writeToken(t, d) }, testToken, true},
		{"a directory of the user's, like ~/.ssh", func(string) {}, testToken, false},
		{"no token given", func(d string) { writeToken(t, d) }, "", false},
		{"another token", func(d string) { writeToken(t, d) }, strings.Repeat("f", 32), false},
		{"a short token", func(d string) { _ = os.WriteFile(filepath.Join(d, CleanupTokenFile), []byte("short"), 0o600) }, "short", false},
		{"token file readable by others", func(d string) {
			writeToken(t, d)
			_ = os.Chmod(filepath.Join(d, CleanupTokenFile), 0o644)
		}, testToken, false},
		{"token file a symlink", func(d string) {
			other := filepath.Join(base, "elsewhere-"+filepath.Base(d))
			_ = os.WriteFile(other, []byte(testToken), 0o600)
			_ = os.Symlink(other, filepath.Join(d, CleanupTokenFile))
		}, testToken, false},
		{"group readable directory", func(d string) { writeToken(t, d); _ = os.Chmod(d, 0o750) }, testToken, false},
		{"sticky directory", func(d string) { writeToken(t, d); _ = os.Chmod(d, 0o700|os.ModeSticky) }, testToken, false},
		{"symlink to the launcher's directory", func(d string) {
			writeToken(t, d)
			_ = os.Rename(d, d+".target")
			_ = os.Symlink(d+".target", d)
		}, testToken, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(base, strconv.Itoa(i))
			sshLike(t, dir)
			c.make(dir)
			claim, err := claimCleanupDir(dir, c.token)
			if !c.ok {
				if !errors.Is(err, ErrUnsafeCleanupDir) || !intact(t, dir) {
					t.Fatalf("claim = %v (want ErrUnsafeCleanupDir), files intact %v", err, intact(t, dir))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := claim.remove(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("after remove: %v", err)
			}
		})
	}
	file := filepath.Join(base, "file")
	_ = os.WriteFile(file, []byte(testToken), 0o700)
	if _, err := claimCleanupDir(file, testToken); !errors.Is(err, ErrUnsafeCleanupDir) {
		t.Errorf("a regular file: %v", err)
	}
}

// TestCleanupDirRecheckedAtExit: a claimed directory replaced meanwhile (same path, another inode, even with the
// token), or whose token file is gone, is not removed at exit.
func TestCleanupDirRecheckedAtExit(t *testing.T) {
	base := t.TempDir()
	for _, c := range []struct {
		name   string
		change func(dir string)
	}{
		{"replaced", func(d string) { _ = os.Rename(d, d+".old"); sshLike(t, d); writeToken(t, d) }},
		{"token removed", func(d string) { _ = os.Remove(filepath.Join(d, CleanupTokenFile)) }},
	} {
		dir := filepath.Join(base, c.name)
		sshLike(t, dir)
		claim, err := claimCleanupDir(dir, writeToken(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		c.change(dir)
		if err := claim.remove(); !errors.Is(err, ErrUnsafeCleanupDir) || !intact(t, dir) {
			t.Errorf("%s: remove = %v (want ErrUnsafeCleanupDir), intact %v", c.name, err, intact(t, dir))
		}
	}
}

// runServe runs `kvshmd serve args...`, which must exit by itself, and returns its exit code and output.
func runServe(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard
	defer cancel()
	out, err := exec.CommandContext(ctx, kvshmdBin, append([]string{"serve"}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("kvshmd serve: %v\n%s", err, out)
	}
	return ee.ExitCode(), string(out)
}

// TestCleanupDirRefusedProcess: `kvshmd serve --cleanup-dir ~/.ssh` (with or without a made-up token) exits 1 at
// once with the reason, deleting nothing; the launcher's directory with its token is removed at SIGTERM.
func TestCleanupDirRefusedProcess(t *testing.T) {
	base := t.TempDir()
	ssh := filepath.Join(base, "ssh")
	sshLike(t, ssh)
	socket := filepath.Join(base, "s", "kvshmd.sock")
	for _, extra := range [][]string{nil, {"--cleanup-token", strings.Repeat("a", 32)}} {
		code, out := runServe(t, append([]string{"--socket", socket, "--state-dir", "", "--cleanup-dir", ssh}, extra...)...)
		if code != 1 || !strings.Contains(out, "refusing to remove the cleanup directory") || !strings.Contains(out, "drop --cleanup-dir") {
			t.Errorf("serve --cleanup-dir %s %v: exit %d, want 1 with the refusal and its hint:\n%s", ssh, extra, code, out)
		}
		if !intact(t, ssh) {
			t.Fatal("the directory's files were deleted")
		}
		if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the refused daemon left its socket: %v", err)
		}
	}
	private := filepath.Join(base, "private")
	sshLike(t, private)
	d := startDaemon(t, socket, "--state-dir", filepath.Join(private, "state"), "--cleanup-dir", private, "--cleanup-token", writeToken(t, private))
	if code := d.terminate(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.log)
	}
	if _, err := os.Lstat(private); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the launcher's directory after exit: %v, want removed\n%s", err, d.log)
	}
}

// TestStateDirLockedProcess: a second kvshmd on a state directory in use exits 1 at once, naming the holder's pid
// and socket, and leaves the first daemon's files (a temporary checkpoint in flight) alone; once the first has
// stopped, it starts. Before, both ran and wrote checkpoints of the same workers.
func TestStateDirLockedProcess(t *testing.T) {
	base := t.TempDir()
	state := filepath.Join(base, "state")
	s1, s2 := filepath.Join(base, "a", "kvshmd.sock"), filepath.Join(base, "b", "kvshmd.sock")
	d1 := startDaemon(t, s1, "--state-dir", state)
	tmp := filepath.Join(state, "w1-1.ckpt.tmp123") // as if d1 were writing it
	if err := os.WriteFile(tmp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := runServe(t, "--socket", s2, "--state-dir", state)
	want := "is locked by another kvshmd (pid " + strconv.Itoa(d1.cmd.Process.Pid) + " socket " + s1 + ")"
	if code != 1 || !strings.Contains(out, want) || !strings.Contains(out, "give this daemon its own --state-dir") {
		t.Fatalf("second daemon on %s: exit %d, want 1 with %q and its hint:\n%s", state, code, want, out)
	}
	if _, err := os.Stat(tmp); err != nil {
		t.Fatalf("the refused daemon removed the first one's temporary file: %v", err)
	}
	if _, err := os.Lstat(s2); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused daemon left its socket: %v", err)
	}
	d1.terminate(t)
	startDaemon(t, s2, "--state-dir", state)
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the temporary file after the next daemon started: %v, want removed", err)
	}
}

// TestMetricsMethods: /metrics and /healthz answer GET and HEAD, and any other method 405 with Allow: GET, HEAD.
// Before, promhttp answered POST, PUT and DELETE on /metrics with 200.
func TestMetricsMethods(t *testing.T) {
	ts := startServer(t, nil)
	h := ts.Handler()
	for _, path := range []string{"/metrics", "/healthz"} {
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(m, path, nil))
			ok := m == http.MethodGet || m == http.MethodHead
			switch {
			case ok && rec.Code != http.StatusOK:
				t.Errorf("%s %s = %d, want 200", m, path, rec.Code)
			case !ok && (rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD"):
				t.Errorf("%s %s = %d, Allow %q; want 405, Allow \"GET, HEAD\"", m, path, rec.Code, rec.Header().Get("Allow"))
			}
		}
	}
}
