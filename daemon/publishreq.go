package daemon

import (
	"github.com/kvshm/kvshm/daemon/internal/stream"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// An ATTACH's publish object: its validation, the publisher configuration and layout it asks for (package stream
// publishes), and the daemon's replay defaults.

// DefaultSnapshotBuilds is Config.ZMQSnapshotBuilds' default: snapshot builds running at once, daemon-wide.
const DefaultSnapshotBuilds = 2

// DefaultReplayFill is Config.ZMQReplayFill in DefaultConfig: at ~40 bytes each, a reply's fillers cost at most
// ~2.6 MB, about what a 100 k-block snapshot does (docs/replay-snapshots.md, "Contiguous replies").
const DefaultReplayFill = 1 << 16

// publishConfig turns an ATTACH publish object into a publisher config.
func publishConfig(p *sock.Publish) zmqpub.Config {
	c := zmqpub.Config{Endpoint: p.Endpoint, Topic: p.Topic, HWM: p.HWM, BufferSteps: p.BufferSteps}
	if p.ReplayEndpoint != nil {
		c.ReplayEndpoint = *p.ReplayEndpoint
	}
	return c
}

// publishWire is the vLLM release layout an ATTACH's publish object asks for (sock.Publish.Wire; none or "": the
// default); an unknown name is a bad_request naming the known ones.
func publishWire(p *sock.Publish) (vllmwire.Wire, error) {
	if p == nil {
		return vllmwire.Wire033, nil
	}
	w, err := vllmwire.ParseWire(p.Wire)
	if err != nil {
		return w, errorf(sock.CodeBadRequest, "publish: %v", err)
	}
	return w, nil
}

// wireOf is publishWire for a request openRing has validated.
func wireOf(p *sock.Publish) vllmwire.Wire {
	w, _ := publishWire(p)
	return w
}

// streamPublish is what an ATTACH's publish object asks of the stream (nil: no publisher), with the daemon's
// bounds applied. The request was validated by openRing.
func (s *Server) streamPublish(p *sock.Publish) *stream.Publish {
	if p == nil {
		return nil
	}
	return &stream.Publish{Config: s.cfg.Bounds.zmqConfig(p), Wire: wireOf(p)}
}
