package daemon

import (
	"time"

	"github.com/kvshm/kvshm/zmqpub"
)

// TEMPORARY: the zmqpub API of the "zmqpub" branch (PublishReset, PublishHeartbeat, Flush), stood in for by
// Publish until that branch is merged; then these become direct method calls.

type publisher = *zmqpub.Publisher

func publishReset(p publisher, seq uint64, payload []byte) bool { return p.Publish(seq, payload) }

func publishHeartbeat(p publisher, seq uint64, payload []byte) bool { return p.Publish(seq, payload) }

func flushPublisher(p publisher, d time.Duration) { _ = d }
