package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"

	"github.com/kvshm/kvshm/daemon"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/sock"
)

var (
	// errBadFlag is returned when a flag's value (or the command line) is not one serve can run with; the message
	// names the flag, its value and what it wants.
	errBadFlag = errors.New("kvshmd serve: bad flag")
	// errBadEnv is returned when a flag's environment variable does not parse as the flag's value.
	errBadEnv = errors.New("kvshmd serve: bad environment variable")
)

// serveConfig is what serve runs with: the daemon's Config and the process settings around it.
type serveConfig struct {
	// daemon is the daemon's configuration, without Logger and Version (serve sets them); StateDir is empty when
	// defaultStateDir is set.
	daemon          daemon.Config
	defaultStateDir bool       // --state-dir was left at its default: serve resolves it (resolveStateDir)
	logLevel        slog.Level // --log-level
	logJSON         bool       // --log-format json
	memoryLimit     int64      // --max-memory in bytes; 0: not given
	gcHeadroom      uint64     // --gc-headroom in bytes; 0: the policy is off
}

// config checks the options and converts them into serve's configuration, touching nothing outside them. err joins
// one error per bad flag, each wrapping errBadFlag.
func (o *serveOptions) config() (serveConfig, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{errBadFlag}, args...)...))
	}
	var c serveConfig
	mode, err := strconv.ParseUint(o.socketMode, 8, 32)
	if err != nil || mode == 0 || mode > 0o777 {
		bad("--socket-mode %q: want an octal mode such as 0600", o.socketMode)
	}
	if o.maxRequestBytes < 64 || o.maxRequestBytes > sock.MaxResponse {
		bad("--max-request-bytes %d: want 64..%d", o.maxRequestBytes, sock.MaxResponse)
	}
	if err := c.logLevel.UnmarshalText([]byte(o.logLevel)); err != nil {
		bad("--log-level %q: want debug, info, warn or error", o.logLevel)
	}
	switch o.logFormat {
	case "text":
	case "json":
		c.logJSON = true
	default:
		bad("--log-format %q: want text or json", o.logFormat)
	}
	if o.zmqHeartbeat < 0 {
		bad("--zmq-heartbeat %v: want 0 (off) or a positive duration", o.zmqHeartbeat)
	}
	if o.deadRetention <= 0 || o.maxDeadStreams <= 0 {
		bad("--dead-stream-retention %v, --max-dead-streams %d: want a positive duration and count", o.deadRetention, o.maxDeadStreams)
	}
	if o.zmqSeqBase != "clock" && o.zmqSeqBase != "zero" {
		bad("--zmq-seq-base %q: want clock or zero", o.zmqSeqBase)
	}
	if o.zmqReplayFill < 0 {
		bad("--zmq-replay-fill %d: want 0 (off) or a positive count", o.zmqReplayFill)
	}
	onLoss, ok := byName(o.onLoss, index.LossBestEffort, index.LossError)
	if !ok {
		bad("--on-loss %q: want best-effort or error", o.onLoss)
	}
	shape, ok := byName(o.dumpShape, index.DumpChains, index.DumpBlocks)
	if !ok {
		bad("--dump-shape %q: want chains or blocks", o.dumpShape)
	}
	if o.rankPorts != 0 && (o.rankPorts < 1 || o.rankPorts > 65535 || o.http == "") {
		bad("--rank-ports %d: want a base port in 1..65535 together with --http (its host is used)", o.rankPorts)
	}
	bounds := daemon.Bounds{MaxBufferSteps: o.maxBufferSteps, MaxHWM: o.maxHWM, MaxStreamsPerPeer: o.maxStreamsPerPeer,
		MaxConnsPerPeer: o.maxConnsPerPeer, ZmqConnsPerAddr: o.zmqConnsPerAddr}
	if bounds.MaxRingBytes, err = parseSize(o.maxRingBytes); err != nil {
		bad("--max-ring-bytes %q: %v", o.maxRingBytes, err)
	}
	if buf, err := parseSize(o.zmqBufferBytes); err != nil || buf > math.MaxInt32 {
		bad("--zmq-buffer-bytes %q: want a size up to 2GiB", o.zmqBufferBytes)
	} else {
		bounds.ZmqBufferBytes = int(buf)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"--max-buffer-steps", o.maxBufferSteps}, {"--max-hwm", o.maxHWM}, {"--max-streams-per-peer", o.maxStreamsPerPeer},
		{"--max-conns-per-peer", o.maxConnsPerPeer}, {"--zmq-conns-per-addr", o.zmqConnsPerAddr}} {
		if f.v <= 0 {
			bad("%s %d: want a positive number", f.name, f.v)
		}
	}
	if o.maxMemory != "" {
		if m, err := parseSize(o.maxMemory); err != nil || m > math.MaxInt64 {
			bad("--max-memory %q: want a size such as 2GiB", o.maxMemory)
		} else {
			c.memoryLimit = int64(m)
		}
	}
	if o.gcHeadroom != "0" {
		if c.gcHeadroom, err = parseSize(o.gcHeadroom); err != nil {
			bad("--gc-headroom %q: want a size such as 64MiB, or 0", o.gcHeadroom)
		}
	}
	stateDir, every := o.stateDir, o.checkpointInterval
	if stateDir == defaultStateDir {
		c.defaultStateDir, stateDir = true, ""
		if !o.given["checkpoint-interval"] {
			every = defaultCkptInterval
		}
	}
	if every < 0 || (every > 0 && o.stateDir == "") {
		bad("--checkpoint-interval %v: want 0 (off) or a positive duration together with --state-dir", every)
	}
	if len(errs) > 0 {
		return serveConfig{}, errors.Join(errs...)
	}
	c.daemon = daemon.Config{
		SocketPath: o.socket, SocketMode: os.FileMode(mode), HTTPAddr: o.http, ParentPID: o.parentPID,
		MaxRequestBytes: uint32(o.maxRequestBytes), MaxConns: o.maxConns, HTTPMaxConns: o.httpMaxConns,
		IdleTimeout: o.idle, FrameTimeout: o.frame, WriteTimeout: o.write, QueryTimeout: o.query,
		PIDCheckInterval: o.pidCheck, ParentPoll: o.parentPoll,
		StateDir: stateDir, CheckpointInterval: every, OnLoss: onLoss, DumpShape: shape, RankPortsBase: o.rankPorts,
		ZMQHeartbeat: o.zmqHeartbeat, ZMQNoSnapshots: !o.zmqSnapshots, ZMQSnapshotBuilds: o.zmqSnapshotBuilds,
		ZMQSnapshotChunk: o.zmqSnapshotChunk, ZMQReplayFill: o.zmqReplayFill, ZMQSeqZero: o.zmqSeqBase == "zero",
		CleanupDir: o.cleanupDir, CleanupToken: o.cleanupToken, DeadRetention: o.deadRetention,
		MaxDeadStreams: o.maxDeadStreams, Bounds: bounds,
	}
	return c, nil
}

// byName returns the value among vals whose String() is name (a flag naming an enum value).
func byName[T fmt.Stringer](name string, vals ...T) (T, bool) {
	for _, v := range vals {
		if v.String() == name {
			return v, true
		}
	}
	var zero T
	return zero, false
}
