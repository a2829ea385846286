package zmqpub

import "errors"

var (
	// ErrEndpoint is returned by New when an endpoint is refused before any socket is made: empty, inproc://
	// (kvshmd is another process: nobody could reach it), or not of the form transport://address.
	ErrEndpoint = errors.New("kvshm/zmqpub: bad endpoint")
	// ErrBind is returned by New when binding an endpoint (or, for a connect endpoint, starting its connection)
	// fails; the wrapped error carries the OS errno where there is one.
	ErrBind = errors.New("kvshm/zmqpub: bind failed")
	// ErrConfig is returned by New for a config whose numbers are out of range (a negative hwm, buffer_steps,
	// buffer bytes, stall timeout, subscriber backlog or connections per address).
	ErrConfig = errors.New("kvshm/zmqpub: bad config")
)
