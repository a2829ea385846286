package daemon

import (
	"sync/atomic"

	"github.com/kvshm/kvshm/daemon/internal/ratelog"
	"github.com/kvshm/kvshm/daemon/internal/stream"
)

// entry is the daemon's entry for one stream: the engine's Stream (package stream owns its state and lifecycle)
// and what the front end keeps beside it.
type entry struct {
	*stream.Stream
	key streamKey // immutable

	// incompleteLog rate-limits the warn line about incomplete answers. Safe for concurrent use.
	incompleteLog ratelog.Log
	asked         atomic.Int64 // s.mono when a consumer last asked for the stream (reap.go). Updated atomically.
	replaysSeen   uint64       // the publisher's replay requests the reaper last saw; protected by the server's reapMu
}
