package sock

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers match them with errors.Is; messages are stable (they keep the "kvshm/daemon:" prefix
// they had before the protocol moved out of package daemon).
var (
	// ErrFrameTooLarge is returned when a frame's length field exceeds the configured maximum.
	ErrFrameTooLarge = errors.New("kvshm/daemon: frame too large")
	// ErrFrameTooShort is returned when a frame's length field is smaller than the 4 header bytes it must count.
	ErrFrameTooShort = errors.New("kvshm/daemon: frame length shorter than its header")
	// ErrUnsupportedVersion is returned when a frame carries a protocol version other than Version.
	ErrUnsupportedVersion = errors.New("kvshm/daemon: unsupported protocol version")
	// ErrUnsafeDir is returned when the socket directory is not owned by this process's user or is writable by
	// others (CheckSocketDir; the daemon before it listens, Dial before it connects).
	ErrUnsafeDir = errors.New("kvshm/daemon: unsafe socket directory")
	// ErrUntrustedServer is returned by Dial when the socket is served by another user, or lies in a directory
	// that is not the client user's own and private (CheckSocketDir).
	ErrUntrustedServer = errors.New("kvshm/daemon: socket not served by this user")
	// ErrRemote is wrapped by every *RemoteError: the daemon answered with an error reply.
	ErrRemote = errors.New("kvshm/daemon: error reply")
)

// Error codes carried in error replies ({"error":..., "code":...}). Wire format: never rename.
const (
	CodeBadRequest         = "bad_request"
	CodeUnsupportedVersion = "unsupported_version"
	CodeUnknownKind        = "unknown_kind"
	CodeTooLarge           = "too_large"
	CodeNotFound           = "not_found"
	CodeConflict           = "conflict"
	CodeForbidden          = "forbidden"
	CodeBusy               = "busy"
	CodeInternal           = "internal"
	// CodeLimit refuses a request beyond one of the daemon's per-producer bounds (replay buffer, ring size, HWM,
	// streams or connections per peer); the message names the bound and the kvshmd flag that raises it.
	CodeLimit = "limit"
)

// RemoteError is an error reply received from the daemon. It wraps ErrRemote.
type RemoteError struct {
	Kind    Kind   // kind of the request that failed
	Code    string // one of the Code* constants
	Message string // human-readable, from the daemon
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("kvshm/daemon: %s: %s (%s)", e.Kind, e.Message, e.Code)
}

// Unwrap returns ErrRemote.
func (e *RemoteError) Unwrap() error { return ErrRemote }
