package vllmwire

import "errors"

// ErrMalformed is returned by Decode when a payload is not a KVEventBatch in the shape FORMAT.md describes; the
// wrapping error names the field and the cause.
var ErrMalformed = errors.New("kvshm/vllmwire: malformed payload")

// ErrUnknownWire is returned by ParseWire for a release name it does not know.
var ErrUnknownWire = errors.New("kvshm/vllmwire: unknown wire (vLLM release)")
