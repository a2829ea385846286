package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kvshm/kvshm/proto/sock"
)

// prepareSocketDir creates dir with mode 0700 when it is missing and checks that it is a directory owned by the
// daemon's user and not writable by group or others (so nobody else can replace the socket file).
func prepareSocketDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create socket directory %s: %w", dir, err)
	}
	return sock.CheckSocketDir(dir)
}

// removeStaleSocket removes path when it is a socket nobody listens on (a killed daemon's leftover). It returns
// ErrAlreadyRunning when a daemon answers and ErrNotSocket when path is something else (never removed).
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat socket %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s: %w", path, ErrNotSocket)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("%s: %w", path, ErrAlreadyRunning)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, os.ErrNotExist) {
		// Something else (EACCES, timeout): do not guess, do not remove.
		return fmt.Errorf("probe existing socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// listenUnix prepares the directory, removes a stale socket, listens and sets the socket file's mode.
func listenUnix(path string, mode os.FileMode) (*net.UnixListener, bool, error) {
	if err := prepareSocketDir(filepath.Dir(path)); err != nil {
		return nil, false, err
	}
	_, statErr := os.Lstat(path)
	hadFile := statErr == nil
	if err := removeStaleSocket(path); err != nil {
		return nil, false, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, false, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, mode); err != nil {
		_ = ln.Close()
		return nil, false, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return ln, hadFile, nil
}
