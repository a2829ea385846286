package daemon

import (
	"fmt"
	"sync"

	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/zmqpub"
)

// Bounds are what one producer may ask of a shared daemon (one producer's config must not take the node's
// daemon down, or crowd out the others). A peer is a uid+pid (SO_PEERCRED). An ATTACH beyond a bound is refused
// with sock.CodeLimit and a message naming the bound and the kvshmd flag that raises it; a connection beyond
// MaxConnsPerPeer gets a limit frame (kind 0) at accept and is closed. The defaults pass vLLM's defaults by far
// (buffer_steps 10000, hwm 100000, a 64 MiB ring) and LocalIndexer's (one ATTACH connection, a few query
// connections per process).
type Bounds struct {
	MaxBufferSteps    int    // --max-buffer-steps: an ATTACH's publish.buffer_steps
	MaxHWM            int    // --max-hwm: an ATTACH's publish.hwm (messages queued per subscriber)
	MaxRingBytes      uint64 // --max-ring-bytes: the ring's capacity (the daemon maps the whole ring)
	MaxStreamsPerPeer int    // --max-streams-per-peer: streams a peer has attached at once
	MaxConnsPerPeer   int    // --max-conns-per-peer: socket connections a peer has open at once
	// ZmqBufferBytes caps each publishing stream's replay buffer in payload bytes (--zmq-buffer-bytes): applied, not
	// asked for (the oldest batches are evicted; a reply from before them is counted incomplete).
	ZmqBufferBytes int
	// ZmqConnsPerAddr bounds each publishing stream's ZMQ sockets' connections from one remote address
	// (--zmq-conns-per-addr; zmqpub.Config.ConnsPerAddr): applied, not asked for.
	ZmqConnsPerAddr int
}

// DefaultBounds returns the bounds every zero field of Config.Bounds stands for.
func DefaultBounds() Bounds {
	return Bounds{
		MaxBufferSteps:    1_000_000,
		MaxHWM:            1_000_000,
		MaxRingBytes:      4 << 30,
		MaxStreamsPerPeer: 64,
		MaxConnsPerPeer:   256,
		ZmqBufferBytes:    zmqpub.DefaultBufferBytes,
		ZmqConnsPerAddr:   zmqpub.DefaultConnsPerAddr,
	}
}

func (b *Bounds) fill() {
	d := DefaultBounds()
	for _, f := range []struct {
		v   *int
		def int
	}{{&b.MaxBufferSteps, d.MaxBufferSteps}, {&b.MaxHWM, d.MaxHWM},
		{&b.MaxStreamsPerPeer, d.MaxStreamsPerPeer}, {&b.MaxConnsPerPeer, d.MaxConnsPerPeer},
		{&b.ZmqBufferBytes, d.ZmqBufferBytes}, {&b.ZmqConnsPerAddr, d.ZmqConnsPerAddr}} {
		if *f.v <= 0 {
			*f.v = f.def
		}
	}
	if b.MaxRingBytes == 0 {
		b.MaxRingBytes = d.MaxRingBytes
	}
}

// limitf is a CodeLimit error reply.
func limitf(format string, args ...any) error { return errorf(sock.CodeLimit, format, args...) }

// checkAttach refuses an ATTACH whose ring or publish config is beyond the bounds (ringCap: the ring header's
// capacity).
func (b Bounds) checkAttach(req sock.AttachRequest, ringCap uint64) error {
	if ringCap > b.MaxRingBytes {
		return limitf("ring capacity %d bytes is beyond this daemon's bound of %d (kvshmd serve --max-ring-bytes or "+
			"KVSHMD_MAX_RING_BYTES raises it; the producer sets it with KVSHM_RING_BYTES)", ringCap, b.MaxRingBytes)
	}
	if p := req.Publish; p != nil {
		if p.BufferSteps > b.MaxBufferSteps {
			return limitf("publish buffer_steps %d is beyond this daemon's bound of %d (kvshmd serve --max-buffer-steps "+
				"or KVSHMD_MAX_BUFFER_STEPS raises it; the replay buffer also holds at most %d bytes, --zmq-buffer-bytes)",
				p.BufferSteps, b.MaxBufferSteps, b.ZmqBufferBytes)
		}
		if p.HWM > b.MaxHWM {
			return limitf("publish hwm %d is beyond this daemon's bound of %d (kvshmd serve --max-hwm or KVSHMD_MAX_HWM "+
				"raises it)", p.HWM, b.MaxHWM)
		}
	}
	return nil
}

// zmqConfig is publishConfig with the daemon's replay buffer byte cap and connections per address.
func (b Bounds) zmqConfig(p *sock.Publish) zmqpub.Config {
	c := publishConfig(p)
	c.BufferBytes = b.ZmqBufferBytes
	c.ConnsPerAddr = b.ZmqConnsPerAddr
	return c
}

// peerKey is a peer: the uid and pid SO_PEERCRED names.
type peerKey struct {
	uid uint32
	pid int32
}

// peerConns counts each peer's open socket connections.
type peerConns struct {
	mu sync.Mutex
	n  map[peerKey]int
}

// add counts a connection of k; false (nothing counted) when k has max already.
func (p *peerConns) add(k peerKey, max int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[k] >= max {
		return false
	}
	if p.n == nil {
		p.n = map[peerKey]int{}
	}
	p.n[k]++
	return true
}

func (p *peerConns) remove(k peerKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[k]--; p.n[k] <= 0 {
		delete(p.n, k)
	}
}

// admitPeer counts cc's connection against its peer's bound; false: refused (a limit frame sent, closed).
func (s *Server) admitPeer(cc *conn) bool {
	if s.peers.add(peerKey{cc.uid, cc.pid}, s.cfg.Bounds.MaxConnsPerPeer) {
		return true
	}
	s.m.rejected.WithLabelValues("limit").Inc()
	s.log.Warn("refusing connection: the peer has too many open", "peer_pid", cc.pid, "max", s.cfg.Bounds.MaxConnsPerPeer)
	s.refuse(cc.c, sock.CodeLimit, fmt.Sprintf("peer pid %d already has %d connections open, this daemon's bound "+
		"(kvshmd serve --max-conns-per-peer or KVSHMD_MAX_CONNS_PER_PEER raises it)", cc.pid, s.cfg.Bounds.MaxConnsPerPeer))
	return false
}

// peerStreamsLocked refuses an ATTACH from a peer that has MaxStreamsPerPeer streams attached already (live
// attachments whose ATTACH connection is the peer's). s.mu is held.
func (s *Server) peerStreamsLocked(cc *conn) error {
	n := 0
	for _, st := range s.streams {
		_, a := st.Current()
		if a == nil {
			continue
		}
		l, _ := a.Lease().(*conn)
		if l == nil || l.uid != cc.uid || l.pid != cc.pid {
			continue
		}
		select {
		case <-a.Done(): // ended
		default:
			n++
		}
	}
	if n >= s.cfg.Bounds.MaxStreamsPerPeer {
		return limitf("peer pid %d already has %d streams attached, this daemon's bound (kvshmd serve "+
			"--max-streams-per-peer or KVSHMD_MAX_STREAMS_PER_PEER raises it)", cc.pid, n)
	}
	return nil
}
