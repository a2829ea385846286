package vllmwire

import "errors"

// ErrMalformed is returned by Decode when a payload is not a KVEventBatch in the shape FORMAT.md describes; the
// wrapping error names the field and the cause.
var ErrMalformed = errors.New("kvshm/vllmwire: malformed payload")
