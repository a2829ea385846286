package sock

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// DefaultSocketPath is $XDG_RUNTIME_DIR/kvshm/kvshmd.sock, else /tmp/kvshm-<uid>/kvshmd.sock.
func DefaultSocketPath() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "kvshm", "kvshmd.sock")
	}
	return filepath.Join(os.TempDir(), "kvshm-"+strconv.Itoa(os.Getuid()), "kvshmd.sock")
}

// CheckSocketDir checks that dir is a directory owned by this process's user and not writable by group or others.
// Both ends check it: the daemon before it listens, a client before it connects (so that nobody else can have put
// the socket there).
func CheckSocketDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("stat socket directory %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("socket directory %s is not a directory: %w", dir, ErrUnsafeDir)
	}
	if int(st.Uid) != os.Getuid() {
		return fmt.Errorf("socket directory %s is owned by uid %d, not %d: %w", dir, st.Uid, os.Getuid(), ErrUnsafeDir)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("socket directory %s has mode %04o (group/other writable): %w", dir, st.Mode&0o7777, ErrUnsafeDir)
	}
	return nil
}

// PeerCred returns the peer's credentials captured at connect() (SO_PEERCRED).
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if gerr != nil {
		return nil, fmt.Errorf("getsockopt SO_PEERCRED: %w", gerr)
	}
	return cred, nil
}

// checkServerCred checks that the process listening on c runs as this process's user. A client checks it before
// sending anything: another local user who bound the socket path first (say, in a shared temp directory) must
// learn nothing (a ring path, a query) and answer nothing.
func checkServerCred(c *net.UnixConn) error {
	cred, err := PeerCred(c)
	if err != nil {
		return err
	}
	if int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("kvshmd socket served by uid %d (pid %d), not by uid %d: %w", cred.Uid, cred.Pid, os.Getuid(), ErrUntrustedServer)
	}
	return nil
}
