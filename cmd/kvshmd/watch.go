package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvshm/kvshm/vllmwire"
)

// watch subscribes to a KV-event stream in vLLM's wire format (kvshmd's own, vLLM's, SGLang's, any
// ZmqEventPublisher's) and prints one JSON line per batch: what a consumer receives, decoded. Block hashes are
// printed as the 64-bit pattern kvshm keys them by (an SGLang hash -1 is 18446744073709551615), or with --signed as
// signed int64, the form SGLang sends. With --replay it first asks the replay socket
// for the batches from --from on (printed with "replayed": true), then follows the live stream. It exits 0 after
// --count batches, 1 when nothing arrives for --timeout (0: wait forever) or a payload does not decode (printed
// with its error: a consumer would drop it), 2 on a usage error, 3 on an endpoint it can never connect to (an
// unknown transport or a malformed address).
//
// Like a libzmq SUB (and DEALER) it connects in the background: a publisher that is not up yet (connection
// refused, no ipc socket file) is dialed again every reconnectInterval until it is, and a lost connection is
// dialed again, so watch can start before the stream it watches and outlive its restarts. --timeout covers that
// wait too.
func watch(args []string, stdout, stderr io.Writer) int {
	return watchWith(context.Background(), args, stdout, stderr, reconnectInterval)
}

// reconnectInterval is libzmq's ZMQ_RECONNECT_IVL default.
const reconnectInterval = 100 * time.Millisecond

// zmqRetry are the socket options of a libzmq-like connect: retry every ivl, forever (until the context ends),
// and again after a lost connection.
func zmqRetry(ivl time.Duration) []zmq4.Option {
	return []zmq4.Option{zmq4.WithDialerRetry(ivl), zmq4.WithDialerMaxRetries(-1), zmq4.WithAutomaticReconnect(true)}
}

// watchWith is watch with its reconnect interval, until ctx ends (tests).
func watchWith(parent context.Context, args []string, stdout, stderr io.Writer, ivl time.Duration) int {
	fs := flag.NewFlagSet("kvshmd watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	topic := fs.String("topic", "", "subscribe to this topic prefix")
	count := fs.Int("count", 0, "exit 0 after this many batches (0: never)")
	timeout := fs.Duration("timeout", 0, "exit 1 when no batch arrives for this long (0: wait forever)")
	replay := fs.String("replay", "", "replay endpoint (ROUTER) to ask for the batches from --from first")
	from := fs.Uint64("from", 0, "first seq to replay (with --replay)")
	signed := fs.Bool("signed", false, "print block hashes as signed int64 (SGLang's form; default: kvshm's u64 keys)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: kvshmd watch [--topic T] [--count N] [--timeout D] [--replay EP --from SEQ] [--signed] ENDPOINT")
		return exitUsage
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	sub := zmq4.NewSub(ctx, zmqRetry(ivl)...)
	defer sub.Close()
	// Subscribed before the connection exists: the socket sends its topics on every connection it makes.
	if err := sub.SetOption(zmq4.OptionSubscribe, *topic); err != nil {
		fmt.Fprintf(stderr, "kvshmd watch: %v\n", err)
		return exitFailure
	}
	dialed := make(chan error, 1)
	go func() { dialed <- sub.Dial(fs.Arg(0)) }() // returns once connected, or on an endpoint it cannot dial
	w := watcher{out: json.NewEncoder(stdout), stderr: stderr, count: *count, ivl: ivl, signed: *signed}
	if *replay != "" {
		if rc, done := w.replay(ctx, *replay, *from, *timeout); done {
			return rc
		}
	}
	msgs := make(chan zmq4.Msg)
	errc := make(chan error, 1)
	go func() {
		if err := <-dialed; err != nil {
			if ctx.Err() == nil {
				errc <- unreachable{err}
			}
			return
		}
		for {
			m, err := sub.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				// The connection was lost (the publisher stopped: EOF, reset). The socket dials it again
				// (WithAutomaticReconnect); receive again after the reconnect interval, as a libzmq SUB just
				// keeps waiting. --timeout still ends a wait that never sees a batch.
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
					errors.Is(err, net.ErrClosed) {
					time.Sleep(ivl)
					continue
				}
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var idle <-chan time.Time
		if *timeout > 0 {
			idle = time.After(*timeout)
		}
		select {
		case m := <-msgs:
			if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
				fmt.Fprintf(stderr, "kvshmd watch: a message of %d frames is not [topic, seq, payload]\n", len(m.Frames))
				return exitFailure
			}
			if rc, done := w.print(string(m.Frames[0]), binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2], false); done {
				return rc
			}
		case err := <-errc:
			fmt.Fprintf(stderr, "kvshmd watch: %v\n", err)
			if errors.As(err, new(unreachable)) {
				return exitUnreachable
			}
			return exitFailure
		case <-ctx.Done(): // the caller's context (tests)
			return exitFailure
		case <-idle:
			fmt.Fprintf(stderr, "kvshmd watch: no batch for %v (%d received)\n", *timeout, w.seen)
			return exitFailure
		}
	}
}

// unreachable is a dial error no retry can fix (unknown transport, malformed address).
type unreachable struct{ error }

// watcher prints batches and counts them.
type watcher struct {
	out    *json.Encoder
	stderr io.Writer
	count  int
	seen   int
	ivl    time.Duration // reconnect interval of the replay DEALER
	signed bool          // hashes printed as int64
}

// replay asks a ROUTER replay socket for the batches from seq on and prints them until the end marker. done is
// true when watch must exit with rc.
func (w *watcher) replay(ctx context.Context, ep string, from uint64, timeout time.Duration) (rc int, done bool) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	d := zmq4.NewDealer(ctx, zmqRetry(w.ivl)...) // waits for the replay socket as the SUB does (bounded by timeout)
	defer d.Close()
	if err := d.Dial(ep); err != nil {
		fmt.Fprintf(w.stderr, "kvshmd watch: replay: %v\n", err)
		return exitUnreachable, true
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, start[:])); err != nil {
		fmt.Fprintf(w.stderr, "kvshmd watch: replay: %v\n", err)
		return exitFailure, true
	}
	for {
		m, err := d.Recv()
		if err != nil {
			fmt.Fprintf(w.stderr, "kvshmd watch: replay: %v (%d received)\n", err, w.seen)
			return exitFailure, true
		}
		// After the DEALER strips the identity: ["", seq, payload] (SGLang) or ["", topic, seq, payload] (vLLM,
		// kvshmd); the end marker has seq 2^64-1 and an empty payload.
		f := m.Frames
		if len(f) != 3 && len(f) != 4 || len(f[len(f)-2]) != 8 {
			fmt.Fprintf(w.stderr, "kvshmd watch: replay: a reply of %d frames\n", len(f))
			return exitFailure, true
		}
		seq, payload := binary.BigEndian.Uint64(f[len(f)-2]), f[len(f)-1]
		if len(payload) == 0 {
			return exitOK, false
		}
		topic := ""
		if len(f) == 4 {
			topic = string(f[1])
		}
		if rc, done := w.print(topic, seq, payload, true); done {
			return rc, true
		}
	}
}

// print decodes and prints one batch; done is true when watch must exit with rc.
func (w *watcher) print(topic string, seq uint64, payload []byte, replayed bool) (rc int, done bool) {
	line := watchLine{Topic: topic, Seq: seq, Replayed: replayed, Bytes: len(payload)}
	b, err := vllmwire.Decode(payload)
	if err != nil {
		line.Error = err.Error()
		_ = w.out.Encode(line)
		return exitFailure, true
	}
	line.TS = b.TS
	if b.HasDpRank {
		line.DpRank = &b.DpRank
	}
	for i := range b.Events {
		line.Events = append(line.Events, watchEvent(&b.Events[i], w.signed))
	}
	if err := w.out.Encode(line); err != nil {
		return exitFailure, true
	}
	w.seen++
	if w.count > 0 && w.seen >= w.count {
		return exitOK, true
	}
	return 0, false
}

// watchLine is one printed batch: vLLM's field names.
type watchLine struct {
	Topic    string           `json:"topic"`
	Seq      uint64           `json:"seq"`
	Replayed bool             `json:"replayed,omitempty"`
	TS       float64          `json:"ts"`
	DpRank   *int64           `json:"data_parallel_rank"`
	Events   []map[string]any `json:"events"`
	Bytes    int              `json:"payload_bytes"`
	Error    string           `json:"error,omitempty"`
}

// watchEvent gives an event the fields vLLM's (or SGLang's) struct has on the wire (absent optional fields omitted;
// Eagle tokens as the chain's stream, with "is_eagle"); signed prints int hashes as int64.
func watchEvent(e *vllmwire.Event, signed bool) map[string]any {
	m := map[string]any{"type": e.Kind.Tag()}
	if e.Kind == vllmwire.KindCleared {
		return m
	}
	m["block_hashes"] = e.BlockHashes // bytes hashes: their keys, with the bytes in block_hash_bytes
	if signed {
		hs := make([]int64, len(e.BlockHashes))
		for i, h := range e.BlockHashes {
			hs[i] = int64(h)
		}
		m["block_hashes"] = hs
	}
	if e.HashBytes != nil {
		var hs []string
		if n := len(e.BlockHashes); n > 0 {
			for i, size := 0, len(e.HashBytes)/n; i < n; i++ {
				hs = append(hs, hex.EncodeToString(e.HashBytes[i*size:(i+1)*size]))
			}
		}
		m["block_hash_bytes"] = hs
	}
	if e.HasMedium {
		m["medium"] = e.Medium
	}
	if e.HasGroupIdx {
		m["group_idx"] = e.GroupIdx
	}
	if e.Kind != vllmwire.KindStored {
		return m
	}
	m["parent_block_hash"] = nil
	if e.HasParent {
		m["parent_block_hash"] = e.ParentHash
		if signed {
			m["parent_block_hash"] = int64(e.ParentHash)
		}
		if e.ParentBytes != nil {
			m["parent_block_hash_bytes"] = hex.EncodeToString(e.ParentBytes)
		}
	}
	m["token_ids"], m["block_size"] = e.TokenIDs, e.BlockSize
	if e.IsEagle {
		m["is_eagle"] = true
	}
	if e.HasLoraID {
		m["lora_id"] = e.LoraID
	}
	if e.HasLoraName {
		m["lora_name"] = e.LoraName
	}
	if e.ExtraKeys != nil {
		m["extra_keys_msgpack_bytes"] = len(e.ExtraKeys)
	}
	if e.HasKVCacheSpecKind {
		m["kv_cache_spec_kind"] = e.KVCacheSpecKind
	}
	if e.HasSlidingWindow {
		m["kv_cache_spec_sliding_window"] = e.KVCacheSpecSlidingWindow
	}
	if e.HasCacheSalt {
		m["cache_salt"] = e.CacheSalt
	}
	if e.HasSessionID {
		m["session_id"] = e.SessionID
	}
	return m
}
