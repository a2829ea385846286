package daemon

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Directories kvshmd owns: the --cleanup-dir it deletes at exit and the --state-dir it writes alone.
//
// A cleanup directory is deleted only when kvshmd can tell it was made for it: the launcher (the Python
// PrivateDaemon) creates the directory 0700, writes a random token into CleanupTokenFile inside it (0600), and
// passes the same token (--cleanup-token). Listen checks the claim before binding anything and refuses to start
// without it (ErrUnsafeCleanupDir: no token given, no token file, a token file that is not a plain 0600 file of the
// daemon's uid, or another token), so `kvshmd serve --cleanup-dir ~/.ssh` exits at once and deletes nothing; at
// exit the claim is checked again (the same directory, by device and inode, and the token file still matching)
// before the directory is removed, else nothing is removed and the refusal is logged. The token, not the daemon
// creating the directory itself, because the launcher needs the directory before the daemon runs: it holds the
// daemon's log, which is the daemon's stdout and stderr.
//
// A state directory is locked (flock of StateLockFile, held until Serve returns, after the final checkpoints) so
// that a second daemon on it refuses to start (Listen: ErrStateDirLocked, naming the holder's pid and socket)
// instead of both writing checkpoints of the same workers. The lock is taken after the socket is bound (a second
// daemon on the same socket gets ErrAlreadyRunning first) and before the leftover temporary files are removed (they
// may be the first daemon's writes in flight). The kernel drops it with the process, so a SIGKILLed daemon leaves
// nothing to clean.

// CleanupTokenFile is the file inside a --cleanup-dir that holds the --cleanup-token.
const CleanupTokenFile = "kvshmd.cleanup-token"

// StateLockFile is the lock file inside a --state-dir: it holds the locking daemon's pid and socket.
const StateLockFile = "kvshmd.lock"

// minCleanupToken is the shortest token accepted (the launcher's: 32 hex digits).
const minCleanupToken = 16

// ErrStateDirLocked is returned by Listen when another process holds the state directory's lock.
var ErrStateDirLocked = errors.New("kvshm/daemon: the state directory is in use by another kvshmd")

// ErrUnsafeCleanupDir is returned by Listen, and logged at exit, when the cleanup directory is not one the daemon
// may remove.
var ErrUnsafeCleanupDir = errors.New("kvshm/daemon: refusing to remove the cleanup directory")

// cleanupClaim is a cleanup directory whose token matched at Listen.
type cleanupClaim struct {
	dir, token string
	dev, ino   uint64
}

// claimCleanupDir checks that dir may be removed at exit: a directory (not a symlink) owned by the daemon's uid
// with mode exactly 0700, holding CleanupTokenFile whose content is token.
func claimCleanupDir(dir, token string) (*cleanupClaim, error) {
	if len(token) < minCleanupToken {
		return nil, fmt.Errorf("cleanup directory %s: a --cleanup-token of at least %d characters, also written to %s "+
			"inside it, is needed: %w", dir, minCleanupToken, CleanupTokenFile, ErrUnsafeCleanupDir)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("cleanup directory %s: %v: %w", dir, err, ErrUnsafeCleanupDir)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return nil, fmt.Errorf("cleanup directory %s is not a directory: %w", dir, ErrUnsafeCleanupDir)
	case int(st.Uid) != os.Getuid():
		return nil, fmt.Errorf("cleanup directory %s is owned by uid %d, not %d: %w", dir, st.Uid, os.Getuid(), ErrUnsafeCleanupDir)
	case st.Mode&0o7777 != 0o700:
		return nil, fmt.Errorf("cleanup directory %s has mode %04o, not 0700: %w", dir, st.Mode&0o7777, ErrUnsafeCleanupDir)
	}
	if err := checkToken(filepath.Join(dir, CleanupTokenFile), token); err != nil {
		return nil, fmt.Errorf("cleanup directory %s was not made for this daemon (%v): %w", dir, err, ErrUnsafeCleanupDir)
	}
	return &cleanupClaim{dir: dir, token: token, dev: st.Dev, ino: st.Ino}, nil
}

// checkToken reads path (a regular file, not a symlink, of the daemon's uid, no group/other permission, at most
// 256 bytes) and compares its content, one trailing newline ignored, with token.
func checkToken(path, token string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %v", filepath.Base(path), err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %v", filepath.Base(path), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Getuid() || st.Mode&0o077 != 0 {
		return fmt.Errorf("%s is not a private regular file of uid %d", filepath.Base(path), os.Getuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, 257))
	if err != nil || len(b) > 256 {
		return fmt.Errorf("%s: unreadable or longer than 256 bytes", filepath.Base(path))
	}
	if subtle.ConstantTimeCompare([]byte(strings.TrimSuffix(string(b), "\n")), []byte(token)) != 1 {
		return fmt.Errorf("%s holds another token", filepath.Base(path))
	}
	return nil
}

// remove removes the claimed directory recursively if it is still the one claimed and still holds the token.
func (c *cleanupClaim) remove() error {
	var st unix.Stat_t
	if err := unix.Lstat(c.dir, &st); err != nil {
		return fmt.Errorf("cleanup directory %s: %w", c.dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Dev != c.dev || st.Ino != c.ino {
		return fmt.Errorf("cleanup directory %s was replaced since the start: %w", c.dir, ErrUnsafeCleanupDir)
	}
	if err := checkToken(filepath.Join(c.dir, CleanupTokenFile), c.token); err != nil {
		return fmt.Errorf("cleanup directory %s: %v: %w", c.dir, err, ErrUnsafeCleanupDir)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("remove cleanup directory %s: %w", c.dir, err)
	}
	return nil
}

// lockStateDir takes the state directory's lock (see above) and writes the holder into the lock file.
func lockStateDir(dir, socket string) (*os.File, error) {
	path := filepath.Join(dir, StateLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, 4096))
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("state directory %s is locked by another kvshmd (%s): %w", dir,
				strings.TrimSpace(string(holder)), ErrStateDirLocked)
		}
		return nil, fmt.Errorf("lock state directory %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte("pid "+strconv.Itoa(os.Getpid())+" socket "+socket+"\n"), 0)
	}
	return f, nil
}
