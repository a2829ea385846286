package daemon

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers match them with errors.Is; messages are stable.
var (
	// ErrFrameTooLarge is returned when a frame's length field exceeds the configured maximum.
	ErrFrameTooLarge = errors.New("kvshm/daemon: frame too large")
	// ErrFrameTooShort is returned when a frame's length field is smaller than the 4 header bytes it must count.
	ErrFrameTooShort = errors.New("kvshm/daemon: frame length shorter than its header")
	// ErrUnsupportedVersion is returned when a frame carries a protocol version other than Version.
	ErrUnsupportedVersion = errors.New("kvshm/daemon: unsupported protocol version")
	// ErrAlreadyRunning is returned by Listen when another daemon answers on the socket path.
	ErrAlreadyRunning = errors.New("kvshm/daemon: another kvshmd is already listening on the socket")
	// ErrUnsafeDir is returned when the socket directory is not owned by the daemon's user or is writable by others.
	ErrUnsafeDir = errors.New("kvshm/daemon: unsafe socket directory")
	// ErrUnsafeStateDir is returned by Listen when the --state-dir directory is not owned by the daemon's user or
	// grants any permission to group or others (it must be 0700).
	ErrUnsafeStateDir = errors.New("kvshm/daemon: unsafe state directory")
	// ErrCheckpointInterval is returned by New for a negative CheckpointInterval or a positive one without StateDir.
	ErrCheckpointInterval = errors.New("kvshm/daemon: checkpoint interval needs a state directory and must not be negative")
	// ErrUntrustedServer is returned by Dial when the socket is served by another user, or lies in a directory
	// that is not the client user's own and private (checkSocketDir).
	ErrUntrustedServer = errors.New("kvshm/daemon: socket not served by this user")
	// ErrRankPorts is returned by New for a RankPortsBase outside 1..65535 or without an HTTP address.
	ErrRankPorts = errors.New("kvshm/daemon: rank ports need an HTTP address and a base port in 1..65535")
	// ErrNotSocket is returned when the socket path exists and is not a Unix socket (it is never removed).
	ErrNotSocket = errors.New("kvshm/daemon: socket path exists and is not a socket")
	// ErrRemote is wrapped by every *RemoteError: the daemon answered with an error reply.
	ErrRemote = errors.New("kvshm/daemon: error reply")
	// ErrServerClosed is returned by Serve after Shutdown.
	ErrServerClosed = errors.New("kvshm/daemon: server closed")
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

// replyError is an error produced while serving a request: the code and message go into the error reply.
type replyError struct {
	code string
	msg  string
}

func (e *replyError) Error() string { return e.code + ": " + e.msg }

func errorf(code, format string, args ...any) *replyError {
	return &replyError{code: code, msg: fmt.Sprintf(format, args...)}
}
