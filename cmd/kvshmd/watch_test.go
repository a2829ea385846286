package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"

	"github.com/kvshm/kvshm/internal/testenv"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// TestWatch: kvshmd watch follows a real zmqpub publisher (the daemon's), replays from a seq first, decodes every
// batch into vLLM's field names and exits 0 after --count; a stream that stays silent ends with exit 1.
func TestWatch(t *testing.T) {
	dir := t.TempDir()
	ep, rep := "ipc://"+filepath.Join(dir, "pub.sock"), "ipc://"+filepath.Join(dir, "replay.sock")
	// JoinWindow 1 ns: a publisher past its join window, as a daemon's stream is after its first seconds, so that
	// a watch without --replay gets only live batches (zmqpub: late joiners get the buffered ones).
	p, err := zmqpub.New(zmqpub.Config{Endpoint: ep, ReplayEndpoint: rep, Topic: "kv", BufferSteps: 100,
		JoinWindow: time.Nanosecond}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	payload := func(seq uint64) []byte {
		b := vllmwire.AppendBatchHeader(nil, 1.5, 1)
		b = vllmwire.AppendEvent(b, &vllmwire.Event{Kind: vllmwire.KindStored, BlockHashes: []uint64{seq, 1 << 63},
			TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, HasMedium: true, Medium: "GPU",
			HasLoraName: true, LoraName: "a"})
		return vllmwire.AppendBatchTrailer(b, 2)
	}
	p.Publish(7, payload(7)) // in the replay buffer before anyone subscribes
	p.Publish(8, payload(8))
	waitPublished(t, p, 2)
	// runUntil runs watch with args while publishing new seqs (PUB drops what it sends before the subscription
	// arrives) and returns its exit code and output lines.
	next := uint64(9)
	runUntil := func(args ...string) (int, []string, string) {
		var out, errb testenv.SyncBuffer
		done := make(chan int)
		go func() { done <- run(append([]string{"watch", "--timeout", "30s"}, args...), &out, &errb) }()
		for {
			p.Publish(next, payload(next))
			next++
			select {
			case rc := <-done:
				return rc, strings.Split(strings.TrimSpace(out.String()), "\n"), errb.String()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	type line struct {
		Topic    string           `json:"topic"`
		Seq      uint64           `json:"seq"`
		Replayed bool             `json:"replayed"`
		TS       float64          `json:"ts"`
		DpRank   *int64           `json:"data_parallel_rank"`
		Events   []map[string]any `json:"events"`
	}
	parse := func(s string) line {
		var l line
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		if err := d.Decode(&l); err != nil {
			t.Fatalf("%v: %s", err, s)
		}
		return l
	}

	// Replay from 5 (the buffer starts at 7), then live: seqs increase, the first is the replayed 7.
	rc, lines, errs := runUntil("--count", "3", "--replay", rep, "--from", "5", ep)
	if rc != exitOK || len(lines) != 3 {
		t.Fatalf("watch exited %d with %d lines: %s\n%s", rc, len(lines), errs, strings.Join(lines, "\n"))
	}
	first := parse(lines[0])
	if first.Seq != 7 || !first.Replayed || first.Topic != "kv" || first.TS != 1.5 || first.DpRank == nil || *first.DpRank != 2 {
		t.Fatalf("replayed line: %+v", first)
	}
	ev := first.Events[0]
	if ev["type"] != "BlockStored" || ev["medium"] != "GPU" || ev["lora_name"] != "a" ||
		ev["block_hashes"].([]any)[1].(json.Number).String() != "9223372036854775808" || ev["parent_block_hash"] != nil {
		t.Fatalf("replayed event: %v", ev)
	}
	if a, b := parse(lines[1]).Seq, parse(lines[2]).Seq; !(7 < a && a < b) {
		t.Fatalf("seqs %d, %d after the replayed 7", a, b)
	}
	// Live only.
	rc, lines, errs = runUntil("--count", "1", ep)
	if l := parse(lines[0]); rc != exitOK || l.Replayed || l.Seq < 8 {
		t.Fatalf("live: exit %d %+v %s", rc, l, errs)
	}

	// Silence: --timeout ends it with exit 1 and says how many batches came.
	var out, errb testenv.SyncBuffer
	if rc := run([]string{"watch", "--timeout", "200ms", ep}, &out, &errb); rc != exitFailure ||
		!strings.Contains(errb.String(), "no batch for 200ms (0 received)") {
		t.Fatalf("silent stream: exit %d, %q", rc, errb.String())
	}
	if rc := run([]string{"watch"}, &out, &errb); rc != exitUsage {
		t.Fatalf("no endpoint: exit %d", rc)
	}
}

// waitPublished waits until p has published n batches (Publish only queues); all but the last are then in the
// replay buffer too (the sender buffers a batch after counting it, before the next).
func waitPublished(t *testing.T, p *zmqpub.Publisher, n uint64) {
	t.Helper()
	for p.Stats().Published < n {
		time.Sleep(time.Millisecond)
	}
}

// refusingTransport is a zmq4 transport that refuses the first n dials of each address (ECONNREFUSED, as a tcp
// port nobody listens on yet) and then dials the unix socket at that address: a publisher that comes up late.
type refusingTransport struct {
	n     int
	mu    sync.Mutex
	tries map[string]int
}

func (r *refusingTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	r.mu.Lock()
	r.tries[addr]++
	refuse := r.tries[addr] <= r.n
	r.mu.Unlock()
	if refuse {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: syscall.ECONNREFUSED}
	}
	return d.DialContext(ctx, "unix", addr)
}

func (r *refusingTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("refusing transport: dial only")
}

func (r *refusingTransport) Addr(ep string) (string, error) { return ep, nil }

func (r *refusingTransport) attempts(addr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tries[addr]
}

var refusing = sync.OnceValue(func() *refusingTransport {
	r := &refusingTransport{n: 40, tries: map[string]int{}} // 40: beyond zmq4's default of 10 retries
	if err := zmq4.RegisterTransport("refusing", r); err != nil {
		panic(err)
	}
	return r
})

// TestWatchRetriesRefused: like a libzmq SUB, watch keeps dialing a publisher (and a replay socket) that refuses
// the connection until it is up, however many attempts that takes, then receives; an endpoint no retry can fix (an
// unknown transport) exits 3 at once. Before: zmq4's dial gave up after 10 retries and watch exited 3.
func TestWatchRetriesRefused(t *testing.T) {
	r := refusing()
	dir := t.TempDir()
	pubPath, repPath := filepath.Join(dir, "pub.sock"), filepath.Join(dir, "replay.sock")
	p, err := zmqpub.New(zmqpub.Config{Endpoint: "ipc://" + pubPath, ReplayEndpoint: "ipc://" + repPath, Topic: "kv",
		BufferSteps: 10}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	batch := vllmwire.AppendBatchTrailer(vllmwire.AppendBatchHeader(nil, 1, 0), 0)
	p.Publish(1, batch) // for the replay
	p.Publish(2, batch)
	waitPublished(t, p, 2)
	seq := uint64(3)
	watchRefused := func(args ...string) (int, string, string) {
		var out, errb testenv.SyncBuffer
		done := make(chan int)
		go func() {
			done <- watchWith(context.Background(), append([]string{"--count", "1", "--timeout", "60s"}, args...), &out, &errb, time.Millisecond)
		}()
		for {
			p.Publish(seq, batch) // PUB drops what it sends before the subscription arrives
			seq++
			select {
			case rc := <-done:
				return rc, out.String(), errb.String()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	// Live: the SUB's dials are refused 40 times, then it receives.
	if rc, out, errs := watchRefused("refusing://" + pubPath); rc != exitOK || strings.Contains(out, "replayed") {
		t.Fatalf("live: watch exited %d: %s\n%s", rc, errs, out)
	}
	// Replay: the DEALER's dials likewise.
	if rc, out, errs := watchRefused("--replay", "refusing://"+repPath, "--from", "0", "ipc://"+pubPath); rc != exitOK ||
		!strings.Contains(out, `"replayed":true`) {
		t.Fatalf("replay: watch exited %d: %s\n%s", rc, errs, out)
	}
	if a, b := r.attempts(pubPath), r.attempts(repPath); a <= r.n || b <= r.n {
		t.Fatalf("dial attempts: pub %d, replay %d; want more than the %d refused", a, b, r.n)
	}
	var out, errb testenv.SyncBuffer
	if rc := watchWith(context.Background(), []string{"--timeout", "60s", "bogus://x"}, &out, &errb, time.Millisecond); rc != exitUnreachable {
		t.Fatalf("unknown transport: exit %d, want %d", rc, exitUnreachable)
	}
}

// TestWatchReconnects: a publisher that goes away and comes back on the same endpoint (kvshmd restarted) is
// dialed again, as a libzmq SUB would: watch keeps receiving.
func TestWatchReconnects(t *testing.T) {
	ep := "ipc://" + filepath.Join(t.TempDir(), "pub.sock")
	newPub := func() *zmqpub.Publisher {
		p, err := zmqpub.New(zmqpub.Config{Endpoint: ep, Topic: "kv"}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	batch := vllmwire.AppendBatchTrailer(vllmwire.AppendBatchHeader(nil, 1, 0), 0)
	var out, errb testenv.SyncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- watchWith(ctx, []string{ep}, &out, &errb, time.Millisecond) }()
	// publishUntil publishes from seq on until watch printed what contains want.
	publishUntil := func(p *zmqpub.Publisher, seq uint64, want string) {
		for ; !strings.Contains(out.String(), want); seq++ {
			p.Publish(seq, batch)
			select {
			case rc := <-done:
				t.Fatalf("watch exited %d: %s\n%s", rc, errb.String(), out.String())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	p := newPub()
	publishUntil(p, 1, `"seq":`)
	_ = p.Close()
	p = newPub() // the same endpoint, a new publisher: seqs from 1000
	defer p.Close()
	publishUntil(p, 1000, `"seq":10`)
	cancel()
	<-done
}

// TestWatchEventSGLang: an SGLang batch (signed hashes, cache_salt, session_id) prints with its hashes as kvshm's
// u64 keys, or as SGLang's int64 with --signed, and with SGLang's fields.
func TestWatchEventSGLang(t *testing.T) {
	e := vllmwire.Event{Kind: vllmwire.KindStored, BlockHashes: []uint64{1<<64 - 1, 5}, HasParent: true,
		ParentHash: 1 << 63, TokenIDs: []uint32{1, 2}, BlockSize: 1, HasMedium: true, Medium: "GPU",
		HasCacheSalt: true, CacheSalt: "salt", HasSessionID: true, SessionID: "s1"}
	p := vllmwire.AppendBatchHeader(nil, 1, 1)
	p = vllmwire.AppendBatchTrailer(vllmwire.WireSGLang.AppendEvent(p, &e), 0)
	b, err := vllmwire.Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	keys, signed := watchEvent(&b.Events[0], false), watchEvent(&b.Events[0], true)
	if got := fmt.Sprint(keys["block_hashes"], keys["parent_block_hash"]); got != "[18446744073709551615 5] 9223372036854775808" {
		t.Errorf("keys: %s", got)
	}
	if got := fmt.Sprint(signed["block_hashes"], signed["parent_block_hash"]); got != "[-1 5] -9223372036854775808" {
		t.Errorf("signed: %s", got)
	}
	if signed["cache_salt"] != "salt" || signed["session_id"] != "s1" || signed["medium"] != "GPU" {
		t.Errorf("SGLang's fields: %v", signed)
	}
}
