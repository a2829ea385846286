package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/daemon"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// TestUsage: every command-line mistake exits 2 with a message naming the problem; help exits 0.
func TestUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.sock")
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"help"}, exitOK, "kvshmd serve"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"serve", "--help"}, exitOK, "KVSHMD_SOCKET"},
		{[]string{"serve", "--socket-mode", "999"}, exitUsage, "--socket-mode"},
		{[]string{"serve", "--log-level", "loud"}, exitUsage, "--log-level"},
		{[]string{"serve", "--log-format", "xml"}, exitUsage, "--log-format"},
		{[]string{"serve", "--max-request-bytes", "1"}, exitUsage, "--max-request-bytes"},
		{[]string{"serve", "extra"}, exitUsage, "unexpected argument"},
		{[]string{"serve", "--state-dir", "", "--checkpoint-interval", "1s"}, exitUsage, "--checkpoint-interval 1s: want 0 (off) or a positive duration together with --state-dir"},
		{[]string{"serve", "--state-dir", missing, "--checkpoint-interval", "-1s"}, exitUsage, "--checkpoint-interval -1s"},
		{[]string{"serve", "--help"}, exitOK, "KVSHMD_CHECKPOINT_INTERVAL"},
		{[]string{"serve", "--zmq-heartbeat", "-1s"}, exitUsage, "--zmq-heartbeat -1s"},
		{[]string{"serve", "--dead-stream-retention", "0s"}, exitUsage, "--dead-stream-retention 0s"},
		{[]string{"serve", "--max-dead-streams", "0"}, exitUsage, "--max-dead-streams 0: want a positive duration and count"},
		{[]string{"serve", "--zmq-seq-base", "epoch"}, exitUsage, "--zmq-seq-base \"epoch\": want clock or zero"},
		{[]string{"serve", "--zmq-replay-fill", "-1"}, exitUsage, "--zmq-replay-fill -1"},
		{[]string{"serve", "--help"}, exitOK, "KVSHMD_ZMQ_HEARTBEAT"},
		{[]string{"serve", "--help"}, exitOK, "KVSHMD_CLEANUP_DIR"},
		{[]string{"events", "--start", "-1"}, exitUsage, "unsigned"},
		{[]string{"events", "--dp-rank", "4294967296"}, exitUsage, "unsigned 32-bit"},
		{[]string{"serve", "--on-loss", "ignore"}, exitUsage, "--on-loss \"ignore\": want best-effort or error"},
		{[]string{"serve", "--dump-shape", "tree"}, exitUsage, "--dump-shape \"tree\": want chains or blocks"},
		{[]string{"serve", "--rank-ports", "9500"}, exitUsage, "--rank-ports 9500: want a base port in 1..65535 together with --http"},
		{[]string{"serve", "--http", "127.0.0.1:0", "--rank-ports", "70000"}, exitUsage, "--rank-ports 70000"},
		{[]string{"serve", "--help"}, exitOK, "KVSHMD_RANK_PORTS"},
		{[]string{"match", "--socket", missing}, exitUsage, "--tokens is required"},
		{[]string{"match", "--socket", missing, "--tokens", "1,x"}, exitUsage, "not a u32"},
		{[]string{"health", "--socket", missing}, exitUnreachable, "is `kvshmd serve` running?"},
		{[]string{"inspect"}, exitUsage, "usage: kvshmd inspect"},
		{[]string{"inspect", missing}, exitFailure, "inspect ring"},
		{[]string{"version"}, exitOK, ""},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		code := run(tt.args, &out, &errb)
		if code != tt.code || !strings.Contains(out.String()+errb.String(), tt.want) {
			t.Errorf("kvshmd %v: exit %d, output %q; want exit %d mentioning %q", tt.args, code, out.String()+errb.String(), tt.code, tt.want)
		}
	}
}

func TestServeEnvErrors(t *testing.T) {
	t.Setenv("KVSHMD_IDLE_TIMEOUT", "forever")
	var out, errb bytes.Buffer
	if code := run([]string{"serve"}, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "KVSHMD_IDLE_TIMEOUT") {
		t.Fatalf("bad env: exit %d %q", code, errb.String())
	}
}

// TestForgetCommand: `kvshmd forget` needs --worker, refuses an attached producer's worker (exit 1, conflict),
// drops a detached one (exit 0) and then reports it unknown (exit 1, not_found).
func TestForgetCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"forget", "--socket", filepath.Join(t.TempDir(), "none.sock")}, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "--worker is required") {
		t.Fatalf("forget without --worker: exit %d %q", code, errb.String())
	}
	dir := t.TempDir()
	socket := filepath.Join(dir, "s", "kvshmd.sock")
	serveDaemon(t, socket)
	ring := filepath.Join(dir, "w3.ring")
	w, err := shm.Create(ring, shm.Options{Capacity: 1 << 16, WorkerID: 3, KVBlockSize: 4, MaxBufferSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	qctx, qcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer qcancel()
	prod, err := sock.Dial(qctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if _, err := prod.Attach(qctx, sock.AttachRequest{RingPath: ring, WorkerID: 3, KVBlockSize: 4}); err != nil {
		t.Fatal(err)
	}
	forget := func(want int, wantText string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := run([]string{"forget", "--socket", socket, "--worker", "3"}, &out, &errb)
		if code != want || !strings.Contains(out.String()+errb.String(), wantText) {
			t.Fatalf("kvshmd forget --worker 3: exit %d, output %q; want exit %d mentioning %q", code, out.String()+errb.String(), want, wantText)
		}
	}
	forget(exitFailure, "code conflict")
	if err := prod.Detach(qctx, 3); err != nil {
		t.Fatal(err)
	}
	forget(exitOK, "{}")
	forget(exitFailure, "code not_found")
}

// TestDpRankCommands: with two per-rank producers of one worker, stats/events/dump/forget select a stream with
// --dp-rank; without it the worker is ambiguous (exit 1, conflict, a hint naming --dp-rank).
func TestDpRankCommands(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "s", "kvshmd.sock")
	serveDaemon(t, socket)
	qctx, qcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer qcancel()
	var prods []*sock.Client
	for r := range uint32(2) {
		ring := filepath.Join(dir, fmt.Sprintf("w3-r%d.ring", r))
		w, err := shm.Create(ring, shm.Options{Capacity: 1 << 16, WorkerID: 3, KVBlockSize: 4, MaxBufferSize: 16})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		prod, err := sock.Dial(qctx, socket)
		if err != nil {
			t.Fatal(err)
		}
		defer prod.Close()
		if _, err := prod.Attach(qctx, sock.AttachRequest{RingPath: ring, WorkerID: 3, KVBlockSize: 4, DpRank: &r}); err != nil {
			t.Fatal(err)
		}
		prods = append(prods, prod)
		for seq := range uint64(r + 1) { // rank 0: event 0; rank 1: events 0, 1 (its own seq space)
			ev := fbs.EventSpec{Seq: seq, DpRank: r, Kind: fbs.KindCleared}
			if err := w.WriteEvent(seq, fbs.Build(flatbuffers.NewBuilder(64), &ev)); err != nil {
				t.Fatal(err)
			}
		}
	}
	cli := func(want int, wantText string, args ...string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := run(append(args, "--socket", socket), &out, &errb)
		if code != want || !strings.Contains(out.String()+errb.String(), wantText) {
			t.Fatalf("kvshmd %v: exit %d, output %q; want exit %d mentioning %q", args, code, out.String()+errb.String(), want, wantText)
		}
	}
	cli(exitOK, `"dp_rank": 1`, "stats", "--worker", "3", "--dp-rank", "1")
	cli(exitOK, `"last_event_id":1}}`, "events", "--dp-rank", "1", "--start", "0")
	cli(exitOK, `"last_event_id":0,"reset_scope":"all"}}`, "dump", "--worker", "3", "--dp-rank", "0")
	cli(exitFailure, "--dp-rank for a per-rank stream", "dump", "--worker", "3")
	if err := prods[1].DetachStream(qctx, sock.WorkerRequest{WorkerID: u64(3), DpRank: u32(1)}); err != nil {
		t.Fatal(err)
	}
	cli(exitOK, "{}", "forget", "--worker", "3", "--dp-rank", "1")
	cli(exitOK, `"last_event_id":0,"reset_scope":"all"}}`, "dump", "--worker", "3") // the only stream left
}

func u64(v uint64) *uint64 { return &v }

func u32(v uint32) *uint32 { return &v }

// serveDaemon runs an in-process daemon on socket until the test ends.
func serveDaemon(t *testing.T, socket string) {
	t.Helper()
	srv, err := daemon.New(daemon.Config{SocketPath: socket, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// TestStateDefaults: the default --state-dir is on tmpfs for the default socket ($XDG_RUNTIME_DIR/kvshm/state),
// beside any other socket, with --checkpoint-interval 10s unless given; an explicit --state-dir (or ”) is kept
// with the interval given (0 by default).
func TestStateDefaults(t *testing.T) {
	xdg := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", xdg)
	t.Setenv("KVSHMD_CHECKPOINT_INTERVAL", "")
	other := filepath.Join(t.TempDir(), "k.sock")
	tests := []struct {
		socket string
		args   []string
		dir    string
		every  time.Duration
	}{
		{sock.DefaultSocketPath(), nil, filepath.Join(xdg, "kvshm", "state"), 10 * time.Second},
		{other, nil, other + ".state", 10 * time.Second},
		{other, []string{"--checkpoint-interval", "3s"}, other + ".state", 3 * time.Second},
		{other, []string{"--state-dir", "/x"}, "/x", 0},
		{other, []string{"--state-dir", ""}, "", 0},
	}
	for _, tt := range tests {
		o, err := parseServeFlags(append([]string{"--socket", tt.socket}, tt.args...), os.Getenv, func(*flag.FlagSet) {}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		c, err := o.config()
		if err != nil {
			t.Fatal(err)
		}
		dir := c.daemon.StateDir
		if c.defaultStateDir {
			dir, err = resolveStateDir(c.daemon.SocketPath)
		}
		if err != nil || dir != tt.dir || c.daemon.CheckpointInterval != tt.every {
			t.Errorf("socket %s %v: state dir %q every %v (%v); want %q every %v", tt.socket, tt.args, dir, c.daemon.CheckpointInterval, err, tt.dir, tt.every)
		}
	}
	if fi, err := os.Stat(filepath.Join(xdg, "kvshm")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the default state dir's parent: %v %v, want created 0700", fi, err)
	}
}
