package daemon

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers match them with errors.Is; messages are stable.
var (
	// ErrAlreadyRunning is returned by Listen when another daemon answers on the socket path.
	ErrAlreadyRunning = errors.New("kvshm/daemon: another kvshmd is already listening on the socket")
	// ErrUnsafeStateDir is returned by Listen when the --state-dir directory is not owned by the daemon's user or
	// grants any permission to group or others (it must be 0700).
	ErrUnsafeStateDir = errors.New("kvshm/daemon: unsafe state directory")
	// ErrCheckpointInterval is returned by New for a negative CheckpointInterval or a positive one without StateDir.
	ErrCheckpointInterval = errors.New("kvshm/daemon: checkpoint interval needs a state directory and must not be negative")
	// ErrRankPorts is returned by New for a RankPortsBase outside 1..65535 or without an HTTP address.
	ErrRankPorts = errors.New("kvshm/daemon: rank ports need an HTTP address and a base port in 1..65535")
	// ErrNotSocket is returned when the socket path exists and is not a Unix socket (it is never removed).
	ErrNotSocket = errors.New("kvshm/daemon: socket path exists and is not a socket")
	// ErrServerClosed is returned by Serve after Shutdown.
	ErrServerClosed = errors.New("kvshm/daemon: server closed")
)

// replyError is an error produced while serving a request: the code and message go into the error reply.
type replyError struct {
	code string
	msg  string
}

func (e *replyError) Error() string { return e.code + ": " + e.msg }

func errorf(code, format string, args ...any) *replyError {
	return &replyError{code: code, msg: fmt.Sprintf(format, args...)}
}
