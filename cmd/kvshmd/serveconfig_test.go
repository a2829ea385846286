package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvshm/kvshm/daemon"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/sock"
)

// serveConfigFor parses args with the environment env and converts the options as serve does; err is every error
// of both steps.
func serveConfigFor(args []string, env map[string]string) (serveConfig, error) {
	o, err := parseServeFlags(args, func(k string) string { return env[k] }, func(*flag.FlagSet) {}, io.Discard)
	if o == nil {
		return serveConfig{}, err
	}
	c, cerr := o.config()
	return c, errors.Join(err, cerr)
}

// flatten lists the errors a tree of errors.Join holds, in order.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// TestServeConfig: every flag's valid forms reach the configuration (and nothing else changes), its invalid forms
// are reported, each as its own error naming the flag and what it wants, all of them at once; an environment
// variable is the flag's value unless the command line gives the flag, parsed as the flag's value is.
func TestServeConfig(t *testing.T) {
	def, b := daemon.DefaultConfig(), daemon.DefaultBounds()
	// The defaults, stated here rather than taken from a parse: a flag whose default went astray fails the first row.
	want0 := serveConfig{
		daemon: daemon.Config{
			SocketPath: def.SocketPath, SocketMode: 0o600, MaxRequestBytes: def.MaxRequestBytes, MaxConns: def.MaxConns,
			HTTPMaxConns: def.HTTPMaxConns, IdleTimeout: def.IdleTimeout, FrameTimeout: def.FrameTimeout,
			WriteTimeout: def.WriteTimeout, QueryTimeout: def.QueryTimeout, PIDCheckInterval: def.PIDCheckInterval,
			ParentPoll: def.ParentPoll, CheckpointInterval: defaultCkptInterval, OnLoss: index.LossBestEffort,
			DumpShape: index.DumpChains, ZMQHeartbeat: def.ZMQHeartbeat, ZMQSnapshotBuilds: daemon.DefaultSnapshotBuilds,
			ZMQReplayFill: def.ZMQReplayFill, DeadRetention: def.DeadRetention, MaxDeadStreams: def.MaxDeadStreams,
			Bounds: b,
		},
		defaultStateDir: true, logLevel: slog.LevelInfo, gcHeadroom: defaultGCHeadroom,
	}
	maxResp := strconv.Itoa(sock.MaxResponse)
	tests := []struct {
		args []string
		env  map[string]string
		want func(c *serveConfig) // the change from want0; nil: none
		bad  []string             // the errors, in order, after "kvshmd serve: "; none: valid
	}{
		{args: nil},
		{env: map[string]string{"KVSHMD_LOG_LEVEL": "", "KVSHMD_MAX_CONNS": ""}}, // empty: unset

		// --socket, --socket-mode, --http
		{args: []string{"--socket", "/x/k.sock"}, want: func(c *serveConfig) { c.daemon.SocketPath = "/x/k.sock" }},
		{env: map[string]string{"KVSHMD_SOCKET": "/e/k.sock"}, want: func(c *serveConfig) { c.daemon.SocketPath = "/e/k.sock" }},
		{args: []string{"--socket-mode", "0660"}, want: func(c *serveConfig) { c.daemon.SocketMode = 0o660 }},
		{args: []string{"--socket-mode", "640"}, want: func(c *serveConfig) { c.daemon.SocketMode = 0o640 }},
		{env: map[string]string{"KVSHMD_SOCKET_MODE": "0666"}, want: func(c *serveConfig) { c.daemon.SocketMode = 0o666 }},
		{args: []string{"--socket-mode", "999"}, bad: []string{`bad flag: --socket-mode "999": want an octal mode such as 0600`}},
		{args: []string{"--socket-mode", "0"}, bad: []string{`bad flag: --socket-mode "0": want an octal mode such as 0600`}},
		{args: []string{"--socket-mode", "1000"}, bad: []string{`bad flag: --socket-mode "1000": want an octal mode such as 0600`}},
		{env: map[string]string{"KVSHMD_SOCKET_MODE": "rw"}, bad: []string{`bad flag: --socket-mode "rw": want an octal mode such as 0600`}},
		{args: []string{"--http", "127.0.0.1:9400"}, want: func(c *serveConfig) { c.daemon.HTTPAddr = "127.0.0.1:9400" }},
		{env: map[string]string{"KVSHMD_HTTP": "[::1]:0"}, want: func(c *serveConfig) { c.daemon.HTTPAddr = "[::1]:0" }},

		// --state-dir, --checkpoint-interval
		{args: []string{"--state-dir", "/s"}, want: func(c *serveConfig) {
			c.daemon.StateDir, c.defaultStateDir, c.daemon.CheckpointInterval = "/s", false, 0
		}},
		{args: []string{"--state-dir", ""}, want: func(c *serveConfig) { c.defaultStateDir, c.daemon.CheckpointInterval = false, 0 }},
		{env: map[string]string{"KVSHMD_STATE_DIR": "/e"}, want: func(c *serveConfig) {
			c.daemon.StateDir, c.defaultStateDir, c.daemon.CheckpointInterval = "/e", false, 0
		}},
		{args: []string{"--checkpoint-interval", "3s"}, want: func(c *serveConfig) { c.daemon.CheckpointInterval = 3 * time.Second }},
		{args: []string{"--checkpoint-interval", "0"}, want: func(c *serveConfig) { c.daemon.CheckpointInterval = 0 }},
		{env: map[string]string{"KVSHMD_CHECKPOINT_INTERVAL": "0"}, want: func(c *serveConfig) { c.daemon.CheckpointInterval = 0 }},
		{args: []string{"--state-dir", "/s", "--checkpoint-interval", "2s"}, want: func(c *serveConfig) {
			c.daemon.StateDir, c.defaultStateDir, c.daemon.CheckpointInterval = "/s", false, 2*time.Second
		}},
		{args: []string{"--state-dir", "", "--checkpoint-interval", "1s"},
			bad: []string{"bad flag: --checkpoint-interval 1s: want 0 (off) or a positive duration together with --state-dir"}},
		{args: []string{"--state-dir", "/s", "--checkpoint-interval", "-1s"},
			bad: []string{"bad flag: --checkpoint-interval -1s: want 0 (off) or a positive duration together with --state-dir"}},
		{env: map[string]string{"KVSHMD_CHECKPOINT_INTERVAL": "often"},
			bad: []string{`bad environment variable: KVSHMD_CHECKPOINT_INTERVAL="often": want a duration such as 10s`}},

		// ZMQ: --zmq-heartbeat, --zmq-snapshots, --zmq-snapshot-builds, --zmq-snapshot-chunk, --zmq-replay-fill, --zmq-seq-base
		{args: []string{"--zmq-heartbeat", "0"}, want: func(c *serveConfig) { c.daemon.ZMQHeartbeat = 0 }},
		{args: []string{"--zmq-heartbeat", "250ms"}, want: func(c *serveConfig) { c.daemon.ZMQHeartbeat = 250 * time.Millisecond }},
		{env: map[string]string{"KVSHMD_ZMQ_HEARTBEAT": "5s"}, want: func(c *serveConfig) { c.daemon.ZMQHeartbeat = 5 * time.Second }},
		{args: []string{"--zmq-heartbeat", "-1s"}, bad: []string{"bad flag: --zmq-heartbeat -1s: want 0 (off) or a positive duration"}},
		{args: []string{"--zmq-snapshots=false"}, want: func(c *serveConfig) { c.daemon.ZMQNoSnapshots = true }},
		{args: []string{"--zmq-snapshots"}},
		{env: map[string]string{"KVSHMD_ZMQ_SNAPSHOTS": "false"}, want: func(c *serveConfig) { c.daemon.ZMQNoSnapshots = true }},
		// A boolean variable is a bool (strconv.ParseBool): "0" and "FALSE" turn snapshots off, as the flag's own
		// values do (they used to leave them on: only "false" did).
		{env: map[string]string{"KVSHMD_ZMQ_SNAPSHOTS": "0"}, want: func(c *serveConfig) { c.daemon.ZMQNoSnapshots = true }},
		{env: map[string]string{"KVSHMD_ZMQ_SNAPSHOTS": "FALSE"}, want: func(c *serveConfig) { c.daemon.ZMQNoSnapshots = true }},
		{env: map[string]string{"KVSHMD_ZMQ_SNAPSHOTS": "1"}},
		{env: map[string]string{"KVSHMD_ZMQ_SNAPSHOTS": "true"}},
		{env: map[string]string{"KVSHMD_ZMQ_SNAPSHOTS": "no"},
			bad: []string{`bad environment variable: KVSHMD_ZMQ_SNAPSHOTS="no": want true or false`}},
		{args: []string{"--zmq-snapshot-builds", "4"}, want: func(c *serveConfig) { c.daemon.ZMQSnapshotBuilds = 4 }},
		{env: map[string]string{"KVSHMD_ZMQ_SNAPSHOT_BUILDS": "8"}, want: func(c *serveConfig) { c.daemon.ZMQSnapshotBuilds = 8 }},
		{args: []string{"--zmq-snapshot-chunk", "65536"}, want: func(c *serveConfig) { c.daemon.ZMQSnapshotChunk = 65536 }},
		{env: map[string]string{"KVSHMD_ZMQ_SNAPSHOT_CHUNK": "4096"}, want: func(c *serveConfig) { c.daemon.ZMQSnapshotChunk = 4096 }},
		{args: []string{"--zmq-replay-fill", "0"}, want: func(c *serveConfig) { c.daemon.ZMQReplayFill = 0 }},
		{args: []string{"--zmq-replay-fill", "100"}, want: func(c *serveConfig) { c.daemon.ZMQReplayFill = 100 }},
		{env: map[string]string{"KVSHMD_ZMQ_REPLAY_FILL": "7"}, want: func(c *serveConfig) { c.daemon.ZMQReplayFill = 7 }},
		{args: []string{"--zmq-replay-fill", "-1"}, bad: []string{"bad flag: --zmq-replay-fill -1: want 0 (off) or a positive count"}},
		{env: map[string]string{"KVSHMD_ZMQ_REPLAY_FILL": "lots"},
			bad: []string{`bad environment variable: KVSHMD_ZMQ_REPLAY_FILL="lots": want an integer`}},
		{args: []string{"--zmq-seq-base", "zero"}, want: func(c *serveConfig) { c.daemon.ZMQSeqZero = true }},
		{args: []string{"--zmq-seq-base", "clock"}},
		{env: map[string]string{"KVSHMD_ZMQ_SEQ_BASE": "zero"}, want: func(c *serveConfig) { c.daemon.ZMQSeqZero = true }},
		{args: []string{"--zmq-seq-base", "epoch"}, bad: []string{`bad flag: --zmq-seq-base "epoch": want clock or zero`}},

		// --cleanup-dir, --cleanup-token (checked by the daemon's Listen), --dead-stream-retention, --max-dead-streams
		{args: []string{"--cleanup-dir", "/c", "--cleanup-token", "0123456789abcdef"}, want: func(c *serveConfig) {
			c.daemon.CleanupDir, c.daemon.CleanupToken = "/c", "0123456789abcdef"
		}},
		{env: map[string]string{"KVSHMD_CLEANUP_DIR": "/c", "KVSHMD_CLEANUP_TOKEN": "t"}, want: func(c *serveConfig) {
			c.daemon.CleanupDir, c.daemon.CleanupToken = "/c", "t"
		}},
		{args: []string{"--dead-stream-retention", "1h"}, want: func(c *serveConfig) { c.daemon.DeadRetention = time.Hour }},
		{env: map[string]string{"KVSHMD_DEAD_STREAM_RETENTION": "30s"}, want: func(c *serveConfig) { c.daemon.DeadRetention = 30 * time.Second }},
		{args: []string{"--dead-stream-retention", "0s"},
			bad: []string{"bad flag: --dead-stream-retention 0s, --max-dead-streams 256: want a positive duration and count"}},
		{args: []string{"--max-dead-streams", "9"}, want: func(c *serveConfig) { c.daemon.MaxDeadStreams = 9 }},
		{env: map[string]string{"KVSHMD_MAX_DEAD_STREAMS": "3"}, want: func(c *serveConfig) { c.daemon.MaxDeadStreams = 3 }},
		{args: []string{"--max-dead-streams", "0"},
			bad: []string{"bad flag: --dead-stream-retention 10m0s, --max-dead-streams 0: want a positive duration and count"}},

		// --on-loss, --dump-shape, --rank-ports
		{args: []string{"--on-loss", "error"}, want: func(c *serveConfig) { c.daemon.OnLoss = index.LossError }},
		{env: map[string]string{"KVSHMD_ON_LOSS": "error"}, want: func(c *serveConfig) { c.daemon.OnLoss = index.LossError }},
		{args: []string{"--on-loss", "best-effort"}},
		{args: []string{"--on-loss", "ignore"}, bad: []string{`bad flag: --on-loss "ignore": want best-effort or error`}},
		{args: []string{"--dump-shape", "blocks"}, want: func(c *serveConfig) { c.daemon.DumpShape = index.DumpBlocks }},
		{env: map[string]string{"KVSHMD_DUMP_SHAPE": "blocks"}, want: func(c *serveConfig) { c.daemon.DumpShape = index.DumpBlocks }},
		{args: []string{"--dump-shape", "tree"}, bad: []string{`bad flag: --dump-shape "tree": want chains or blocks`}},
		{args: []string{"--http", "127.0.0.1:0", "--rank-ports", "9500"}, want: func(c *serveConfig) {
			c.daemon.HTTPAddr, c.daemon.RankPortsBase = "127.0.0.1:0", 9500
		}},
		{args: []string{"--http", "h:1", "--rank-ports", "65535"}, env: map[string]string{"KVSHMD_RANK_PORTS": "x"},
			want: func(c *serveConfig) { c.daemon.HTTPAddr, c.daemon.RankPortsBase = "h:1", 65535 }},
		{args: []string{"--rank-ports", "9500"},
			bad: []string{"bad flag: --rank-ports 9500: want a base port in 1..65535 together with --http (its host is used)"}},
		{args: []string{"--http", "127.0.0.1:0", "--rank-ports", "70000"},
			bad: []string{"bad flag: --rank-ports 70000: want a base port in 1..65535 together with --http (its host is used)"}},
		{args: []string{"--http", "127.0.0.1:0", "--rank-ports", "-1"},
			bad: []string{"bad flag: --rank-ports -1: want a base port in 1..65535 together with --http (its host is used)"}},

		// --parent-pid, --parent-poll
		{args: []string{"--parent-pid", "123", "--parent-poll", "50ms"}, want: func(c *serveConfig) {
			c.daemon.ParentPID, c.daemon.ParentPoll = 123, 50*time.Millisecond
		}},
		{env: map[string]string{"KVSHMD_PARENT_PID": "77", "KVSHMD_PARENT_POLL": "1s"}, want: func(c *serveConfig) {
			c.daemon.ParentPID, c.daemon.ParentPoll = 77, time.Second
		}},
		{env: map[string]string{"KVSHMD_PARENT_PID": "me"}, bad: []string{`bad environment variable: KVSHMD_PARENT_PID="me": want an integer`}},

		// The socket's bounds and deadlines
		{args: []string{"--max-request-bytes", "64"}, want: func(c *serveConfig) { c.daemon.MaxRequestBytes = 64 }},
		{args: []string{"--max-request-bytes", maxResp}, want: func(c *serveConfig) { c.daemon.MaxRequestBytes = sock.MaxResponse }},
		{env: map[string]string{"KVSHMD_MAX_REQUEST_BYTES": "65536"}, want: func(c *serveConfig) { c.daemon.MaxRequestBytes = 65536 }},
		{args: []string{"--max-request-bytes", "1"}, bad: []string{"bad flag: --max-request-bytes 1: want 64.." + maxResp}},
		{args: []string{"--max-request-bytes", strconv.Itoa(sock.MaxResponse + 1)},
			bad: []string{fmt.Sprintf("bad flag: --max-request-bytes %d: want 64..%s", sock.MaxResponse+1, maxResp)}},
		{env: map[string]string{"KVSHMD_MAX_REQUEST_BYTES": "-1"},
			bad: []string{`bad environment variable: KVSHMD_MAX_REQUEST_BYTES="-1": want a non-negative integer`}},
		{args: []string{"--max-conns", "5", "--http-max-conns", "6"}, want: func(c *serveConfig) {
			c.daemon.MaxConns, c.daemon.HTTPMaxConns = 5, 6
		}},
		{env: map[string]string{"KVSHMD_MAX_CONNS": "7", "KVSHMD_HTTP_MAX_CONNS": "8"}, want: func(c *serveConfig) {
			c.daemon.MaxConns, c.daemon.HTTPMaxConns = 7, 8
		}},
		{args: []string{"--idle-timeout", "1s", "--frame-timeout", "2s", "--write-timeout", "3s", "--query-timeout", "4s",
			"--pid-check-interval", "5s"}, want: func(c *serveConfig) {
			c.daemon.IdleTimeout, c.daemon.FrameTimeout, c.daemon.WriteTimeout = time.Second, 2*time.Second, 3*time.Second
			c.daemon.QueryTimeout, c.daemon.PIDCheckInterval = 4*time.Second, 5*time.Second
		}},
		{env: map[string]string{"KVSHMD_IDLE_TIMEOUT": "1m", "KVSHMD_FRAME_TIMEOUT": "1s", "KVSHMD_WRITE_TIMEOUT": "2s",
			"KVSHMD_QUERY_TIMEOUT": "3s", "KVSHMD_PID_CHECK_INTERVAL": "100ms"}, want: func(c *serveConfig) {
			c.daemon.IdleTimeout, c.daemon.FrameTimeout, c.daemon.WriteTimeout = time.Minute, time.Second, 2*time.Second
			c.daemon.QueryTimeout, c.daemon.PIDCheckInterval = 3*time.Second, 100*time.Millisecond
		}},
		{env: map[string]string{"KVSHMD_IDLE_TIMEOUT": "forever"},
			bad: []string{`bad environment variable: KVSHMD_IDLE_TIMEOUT="forever": want a duration such as 10s`}},

		// Per-producer bounds (daemon.Bounds), sizes with a unit
		{args: []string{"--max-buffer-steps", "10", "--max-hwm", "20", "--max-streams-per-peer", "3",
			"--max-conns-per-peer", "4", "--max-ring-bytes", "1GiB", "--zmq-buffer-bytes", "8MiB", "--zmq-conns-per-addr", "5"},
			want: func(c *serveConfig) {
				c.daemon.Bounds = daemon.Bounds{MaxBufferSteps: 10, MaxHWM: 20, MaxStreamsPerPeer: 3, MaxConnsPerPeer: 4,
					MaxRingBytes: 1 << 30, ZmqBufferBytes: 8 << 20, ZmqConnsPerAddr: 5}
			}},
		{env: map[string]string{"KVSHMD_MAX_BUFFER_STEPS": "11", "KVSHMD_MAX_HWM": "21", "KVSHMD_MAX_STREAMS_PER_PEER": "2",
			"KVSHMD_MAX_CONNS_PER_PEER": "9", "KVSHMD_MAX_RING_BYTES": "512K", "KVSHMD_ZMQ_BUFFER_BYTES": "1000",
			"KVSHMD_ZMQ_CONNS_PER_ADDR": "1"},
			want: func(c *serveConfig) {
				c.daemon.Bounds = daemon.Bounds{MaxBufferSteps: 11, MaxHWM: 21, MaxStreamsPerPeer: 2, MaxConnsPerPeer: 9,
					MaxRingBytes: 512 << 10, ZmqBufferBytes: 1000, ZmqConnsPerAddr: 1}
			}},
		{args: []string{"--max-ring-bytes", "x"}, bad: []string{`bad flag: --max-ring-bytes "x": want a positive size such as 64MiB`}},
		{args: []string{"--zmq-buffer-bytes", "3GiB"}, bad: []string{`bad flag: --zmq-buffer-bytes "3GiB": want a size up to 2GiB`}},
		{args: []string{"--max-buffer-steps", "0"}, bad: []string{"bad flag: --max-buffer-steps 0: want a positive number"}},
		{args: []string{"--max-hwm", "-5"}, bad: []string{"bad flag: --max-hwm -5: want a positive number"}},
		{args: []string{"--max-streams-per-peer", "0"}, bad: []string{"bad flag: --max-streams-per-peer 0: want a positive number"}},
		{args: []string{"--max-conns-per-peer", "-1"}, bad: []string{"bad flag: --max-conns-per-peer -1: want a positive number"}},
		{args: []string{"--zmq-conns-per-addr", "0"}, bad: []string{"bad flag: --zmq-conns-per-addr 0: want a positive number"}},

		// The process: --max-memory, --gc-headroom, --log-level, --log-format
		{args: []string{"--max-memory", "2GiB"}, want: func(c *serveConfig) { c.memoryLimit = 2 << 30 }},
		{env: map[string]string{"KVSHMD_MAX_MEMORY": "512MiB"}, want: func(c *serveConfig) { c.memoryLimit = 512 << 20 }},
		{args: []string{"--max-memory", "lots"}, bad: []string{`bad flag: --max-memory "lots": want a size such as 2GiB`}},
		{args: []string{"--gc-headroom", "0"}, want: func(c *serveConfig) { c.gcHeadroom = 0 }},
		{args: []string{"--gc-headroom", "128MiB"}, want: func(c *serveConfig) { c.gcHeadroom = 128 << 20 }},
		{env: map[string]string{"KVSHMD_GC_HEADROOM": "0"}, want: func(c *serveConfig) { c.gcHeadroom = 0 }},
		{args: []string{"--gc-headroom", "big"}, bad: []string{`bad flag: --gc-headroom "big": want a size such as 64MiB, or 0`}},
		{args: []string{"--log-level", "debug"}, want: func(c *serveConfig) { c.logLevel = slog.LevelDebug }},
		{env: map[string]string{"KVSHMD_LOG_LEVEL": "warn"}, want: func(c *serveConfig) { c.logLevel = slog.LevelWarn }},
		{args: []string{"--log-level", "loud"}, bad: []string{`bad flag: --log-level "loud": want debug, info, warn or error`}},
		{args: []string{"--log-format", "json"}, want: func(c *serveConfig) { c.logJSON = true }},
		{env: map[string]string{"KVSHMD_LOG_FORMAT": "json"}, want: func(c *serveConfig) { c.logJSON = true }},
		{args: []string{"--log-format", "xml"}, bad: []string{`bad flag: --log-format "xml": want text or json`}},

		// The flag wins over its variable, which is then not even parsed.
		{args: []string{"--max-conns", "5"}, env: map[string]string{"KVSHMD_MAX_CONNS": "7"},
			want: func(c *serveConfig) { c.daemon.MaxConns = 5 }},
		{args: []string{"--idle-timeout", "1s"}, env: map[string]string{"KVSHMD_IDLE_TIMEOUT": "forever"},
			want: func(c *serveConfig) { c.daemon.IdleTimeout = time.Second }},
		{args: []string{"--zmq-snapshots"}, env: map[string]string{"KVSHMD_ZMQ_SNAPSHOTS": "false"}},

		// Everything wrong is reported at once: the variables first, then the flags in check order.
		{args: []string{"--socket-mode", "999", "--log-level", "loud", "--max-hwm", "0"},
			env: map[string]string{"KVSHMD_IDLE_TIMEOUT": "forever", "KVSHMD_ZMQ_SNAPSHOTS": "maybe"},
			bad: []string{
				`bad environment variable: KVSHMD_IDLE_TIMEOUT="forever": want a duration such as 10s`,
				`bad environment variable: KVSHMD_ZMQ_SNAPSHOTS="maybe": want true or false`,
				`bad flag: --socket-mode "999": want an octal mode such as 0600`,
				`bad flag: --log-level "loud": want debug, info, warn or error`,
				"bad flag: --max-hwm 0: want a positive number",
			}},
		{args: []string{"extra"}, bad: []string{`bad flag: unexpected argument "extra"`}},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%q env %v", tt.args, tt.env)
		got, err := serveConfigFor(tt.args, tt.env)
		errs := flatten(err)
		var msgs []string
		for _, e := range errs {
			msg := strings.TrimPrefix(e.Error(), "kvshmd serve: ")
			msgs = append(msgs, msg)
			sentinel := errBadFlag
			if strings.HasPrefix(msg, "bad environment variable: ") {
				sentinel = errBadEnv
			}
			if !errors.Is(e, sentinel) {
				t.Errorf("%s: %q does not wrap %q", name, e, sentinel)
			}
		}
		if !reflect.DeepEqual(msgs, tt.bad) {
			t.Errorf("%s: errors\n  %q\nwant\n  %q", name, msgs, tt.bad)
			continue
		}
		if len(tt.bad) > 0 {
			continue
		}
		want := want0
		if tt.want != nil {
			tt.want(&want)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: config\n  %+v\nwant\n  %+v", name, got, want)
		}
	}
}

// TestServeFlagsEnv: every flag has its environment variable, KVSHMD_ and its name in capitals, and its help ends by
// naming it (`kvshmd serve -h` is where an operator finds both).
func TestServeFlagsEnv(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	envs := new(serveOptions).register(fs)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		want := "KVSHMD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if envs[f.Name] != want || !strings.HasSuffix(f.Usage, " (env "+want+")") {
			t.Errorf("--%s: environment variable %q, help %q; want %s, named at the help's end", f.Name, envs[f.Name], f.Usage, want)
		}
	})
	if n != len(envs) {
		t.Errorf("%d flags, %d environment variables", n, len(envs))
	}
}
