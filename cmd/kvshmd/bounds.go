package main

import (
	"flag"
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/kvshm/kvshm/daemon"
)

// boundsOpts are serve's per-producer bounds (daemon.Bounds) and --max-memory.
type boundsOpts struct {
	steps, hwm, streams, conns     int
	zmqConnsPerAddr                int
	ringBytes, bufBytes, maxMemory string
	gcHeadroom                     string
}

// defaultGCHeadroom is --gc-headroom's default (gcpolicy.go).
const defaultGCHeadroom = 64 << 20

func (o *boundsOpts) register(fs *flag.FlagSet, num func(string, int) int) {
	d := daemon.DefaultBounds()
	fs.IntVar(&o.steps, "max-buffer-steps", num("KVSHMD_MAX_BUFFER_STEPS", d.MaxBufferSteps), "largest publish buffer_steps an ATTACH may ask; beyond it the ATTACH is refused with limit (env KVSHMD_MAX_BUFFER_STEPS)")
	fs.IntVar(&o.hwm, "max-hwm", num("KVSHMD_MAX_HWM", d.MaxHWM), "largest publish hwm an ATTACH may ask; beyond it the ATTACH is refused with limit (env KVSHMD_MAX_HWM)")
	fs.StringVar(&o.ringBytes, "max-ring-bytes", envOr(formatSize(d.MaxRingBytes), "KVSHMD_MAX_RING_BYTES"), "largest ring capacity an ATTACH may bring (bytes, or with KiB/MiB/GiB); beyond it the ATTACH is refused with limit (env KVSHMD_MAX_RING_BYTES)")
	fs.IntVar(&o.streams, "max-streams-per-peer", num("KVSHMD_MAX_STREAMS_PER_PEER", d.MaxStreamsPerPeer), "streams one producer process (uid+pid) may have attached at once; beyond it the ATTACH is refused with limit (env KVSHMD_MAX_STREAMS_PER_PEER)")
	fs.IntVar(&o.conns, "max-conns-per-peer", num("KVSHMD_MAX_CONNS_PER_PEER", d.MaxConnsPerPeer), "socket connections one process (uid+pid) may have open at once, within --max-conns; beyond it the connection gets limit and is closed (env KVSHMD_MAX_CONNS_PER_PEER)")
	fs.StringVar(&o.bufBytes, "zmq-buffer-bytes", envOr(formatSize(uint64(d.ZmqBufferBytes)), "KVSHMD_ZMQ_BUFFER_BYTES"), "each publishing stream's replay buffer holds at most this many payload bytes (and at most buffer_steps batches); the oldest are evicted, and a replay from before them is counted incomplete (env KVSHMD_ZMQ_BUFFER_BYTES)")
	fs.IntVar(&o.zmqConnsPerAddr, "zmq-conns-per-addr", num("KVSHMD_ZMQ_CONNS_PER_ADDR", d.ZmqConnsPerAddr), "connections one remote address (an IPv4 address, an IPv6 /64) may have open on each ZMQ PUB and replay socket, handshakes included: its share of the socket's 1024, so one host's connections leave room for every other host's routers; one more is closed at accept and counted in kvshm_zmq_peers_cut_total{reason=\"addr_conns\"}; ipc:// sockets have none (zmqpub/doc.go) (env KVSHMD_ZMQ_CONNS_PER_ADDR)")
	fs.StringVar(&o.gcHeadroom, "gc-headroom", envOr(formatSize(defaultGCHeadroom), "KVSHMD_GC_HEADROOM"), "garbage the collector lets the heap grow by over its live data (bytes, or with KiB/MiB/GiB): GOGC is set after each collection to about this, within 12..50 (so between 1/8 and 1/2 of the live heap); 0 or a GOGC environment variable: Go's GOGC alone (env KVSHMD_GC_HEADROOM)")
	fs.StringVar(&o.maxMemory, "max-memory", envOr("", "KVSHMD_MAX_MEMORY"), "the Go runtime's soft memory limit (debug.SetMemoryLimit): the GC works harder near it instead of letting the heap double; set it below the daemon's cgroup limit. Empty: GOMEMLIMIT if set, else none (env KVSHMD_MAX_MEMORY)")
}

// gcHeadroomBytes parses --gc-headroom ("0" turns the policy off).
func (o *boundsOpts) gcHeadroomBytes() (uint64, error) {
	if o.gcHeadroom == "0" {
		return 0, nil
	}
	h, err := parseSize(o.gcHeadroom)
	if err != nil {
		return 0, fmt.Errorf("--gc-headroom %q: want a size such as 64MiB, or 0", o.gcHeadroom)
	}
	return h, nil
}

// bounds parses the options; mem is --max-memory in bytes (0: not given).
func (o *boundsOpts) bounds() (b daemon.Bounds, mem int64, err error) {
	ring, err := parseSize(o.ringBytes)
	if err != nil {
		return b, 0, fmt.Errorf("--max-ring-bytes %q: %w", o.ringBytes, err)
	}
	buf, err := parseSize(o.bufBytes)
	if err != nil || buf > math.MaxInt32 {
		return b, 0, fmt.Errorf("--zmq-buffer-bytes %q: want a size up to 2GiB", o.bufBytes)
	}
	if o.maxMemory != "" {
		m, err := parseSize(o.maxMemory)
		if err != nil || m > math.MaxInt64 {
			return b, 0, fmt.Errorf("--max-memory %q: want a size such as 2GiB", o.maxMemory)
		}
		mem = int64(m)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"--max-buffer-steps", o.steps}, {"--max-hwm", o.hwm}, {"--max-streams-per-peer", o.streams},
		{"--max-conns-per-peer", o.conns}, {"--zmq-conns-per-addr", o.zmqConnsPerAddr}} {
		if f.v <= 0 {
			return b, 0, fmt.Errorf("%s %d: want a positive number", f.name, f.v)
		}
	}
	return daemon.Bounds{MaxBufferSteps: o.steps, MaxHWM: o.hwm, MaxRingBytes: ring, MaxStreamsPerPeer: o.streams,
		MaxConnsPerPeer: o.conns, ZmqBufferBytes: int(buf), ZmqConnsPerAddr: o.zmqConnsPerAddr}, mem, nil
}

// applyMemoryLimit sets the runtime's soft memory limit when --max-memory was given (it overrides GOMEMLIMIT, which
// the runtime applies by itself otherwise).
func applyMemoryLimit(mem int64) {
	if mem > 0 {
		debug.SetMemoryLimit(mem)
	}
}

var sizeUnits = []struct {
	suffix string
	mult   uint64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}

// parseSize reads a positive byte count: digits, optionally followed by KiB, MiB, GiB (K, M, G: the same) or B.
func parseSize(s string) (uint64, error) {
	mult := uint64(1)
	for _, u := range sizeUnits {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = rest, u.mult
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || n == 0 || n > math.MaxUint64/mult {
		return 0, fmt.Errorf("want a positive size such as 64MiB")
	}
	return n * mult, nil
}

// formatSize writes n in the largest binary unit that divides it.
func formatSize(n uint64) string {
	for _, u := range sizeUnits[:3] {
		if n >= u.mult && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.suffix)
		}
	}
	return strconv.FormatUint(n, 10)
}
