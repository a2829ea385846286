package daemon

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/proto/sock"
	"github.com/kvshm/kvshm/shm"
)

// livePID matches the producer pid and ring path of a conflict message.
var livePID = regexp.MustCompile(`\(pid \d+, ring [^)]*\)`)

// TestProtocolScripts runs the data-driven scripts in testdata/protocol (github.com/cockroachdb/datadriven)
// against a real server over real sockets. A script is a sequence of blocks: a command line, "----", the expected
// output, a blank line; "#" lines are comments stating intent. -rewrite rewrites the expected outputs.
//
// Commands:
//
//	attach worker=W [rank=R] bs=B               create a ring and attach it (keeps the connection); rank: dp_rank
//	stored seq=S dp=D [parent=P] hashes=H,H [lora=NAME] [eagle] [to=W or W/R]   publish (tokens derived from
//	                                            the hashes) into producer to (default: the only one)
//	removed seq=S dp=D hashes=H,H [to=...]      publish
//	cleared seq=S [to=...]                      publish
//	close-producer worker=W[/R]                 close the attaching connection, wait for the detach
//	events|dump|stats|match|health|detach|forget ...   a request with key=value fields (JSON body), reply printed
//	send HEX                                    raw bytes on a fresh connection; replies and closed/open printed
func TestProtocolScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/protocol/*.txt")
	if len(files) == 0 {
		t.Fatal("no scripts in testdata/protocol")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runScript(t, file) })
	}
}

type scriptEnv struct {
	t         *testing.T
	ts        *testServer
	q         *sock.Client
	producers map[string]*scriptProducer // by "W" (ALL stream) or "W/R" (per-rank)
}

type scriptProducer struct {
	w    *shm.Writer
	conn *sock.Client
	bs   uint32
	b    *flatbuffers.Builder
}

func runScript(t *testing.T, file string) {
	var err error
	e := &scriptEnv{t: t, producers: map[string]*scriptProducer{}}
	e.ts = startServer(t, func(c *Config) {
		c.Version = "test"
		c.MaxRequestBytes = 1 << 10
		c.IdleTimeout = 5 * time.Second         // longer than send's 1 s wait: "open" means not closed
		c.FrameTimeout = 100 * time.Millisecond // shorter: a truncated frame shows as closed
	})
	e.q, err = sock.Dial(ctxT(t), e.ts.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer e.q.Close()

	datadriven.RunTest(t, file, func(t *testing.T, d *datadriven.TestData) string {
		line := []string{d.Cmd}
		for _, a := range d.CmdArgs {
			line = append(line, a.String())
		}
		return e.run(strings.Join(line, " "))
	})
}

func (e *scriptEnv) run(line string) string {
	t := e.t
	f := strings.Fields(line)
	args := map[string]string{}
	for _, a := range f[1:] {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	num := func(k string) uint64 {
		n, err := strconv.ParseUint(args[k], 10, 64)
		if err != nil {
			t.Fatalf("%q: %s=%q: %v", line, k, args[k], err)
		}
		return n
	}
	list := func(k string) []uint64 {
		var out []uint64
		for _, s := range strings.Split(args[k], ",") {
			if s == "" {
				continue
			}
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			out = append(out, n)
		}
		return out
	}
	switch f[0] {
	case "attach":
		w := num("worker")
		p := &scriptProducer{bs: uint32(num("bs")), b: flatbuffers.NewBuilder(256)}
		path := filepath.Join(t.TempDir(), "ring")
		var rank *uint32
		name := strconv.FormatUint(w, 10)
		if _, ok := args["rank"]; ok { // attach with AttachRequest.dp_rank (a per-rank stream)
			r := uint32(num("rank"))
			rank, name = &r, name+"/"+args["rank"]
		}
		var err error
		if p.w, err = shm.Create(path, shm.Options{Capacity: 1 << 16, WorkerID: w, KVBlockSize: p.bs, MaxBufferSize: 64}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.w.Close() })
		if p.conn, err = sock.Dial(ctxT(t), e.ts.SocketPath()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.conn.Close() })
		rep, err := p.conn.Attach(ctxT(t), sock.AttachRequest{RingPath: path, WorkerID: w, KVBlockSize: p.bs, MaxBufferSize: 64, DpRank: rank})
		if err != nil {
			return livePID.ReplaceAllString(errText(err), "(pid P, ring R)") // stable across runs
		}
		e.producers[name] = p
		return fmt.Sprintf("attached worker=%d stream_epoch=%d resumed=%v head=%d", rep.WorkerID, rep.StreamEpoch, rep.Resumed, rep.Head)
	case "stored", "removed", "cleared":
		var p *scriptProducer
		if to, ok := args["to"]; ok { // to=W or to=W/R: that producer
			p = e.producers[to]
		} else {
			for _, p = range e.producers { // else the one attached producer
			}
		}
		ev := fbs.EventSpec{Seq: num("seq")}
		if _, ok := args["dp"]; ok {
			ev.DpRank = uint32(num("dp"))
		}
		switch f[0] {
		case "stored":
			ev.Kind, ev.BlockHashes = fbs.KindStored, list("hashes")
			if _, ok := args["parent"]; ok {
				ev.HasParent, ev.ParentHash = true, num("parent")
			}
			for _, h := range ev.BlockHashes {
				ev.TokenIDs = append(ev.TokenIDs, tokens(uint32(h)*p.bs, 1, p.bs)...)
			}
			ev.LoraName = args["lora"]
			if _, ok := args["eagle"]; ok {
				ev.IsEagle = true
				ev.TokenIDs = append(ev.TokenIDs, 7)
			}
		case "removed":
			ev.Kind, ev.BlockHashes = fbs.KindRemoved, list("hashes")
		default:
			ev.Kind = fbs.KindCleared
		}
		if err := p.w.WriteEvent(ev.Seq, fbs.Build(p.b, &ev)); err != nil {
			return errText(err)
		}
		return "published"
	case "close-producer":
		ws, rs, perRank := strings.Cut(args["worker"], "/")
		w, _ := strconv.ParseUint(ws, 10, 64)
		r, _ := strconv.ParseUint(rs, 10, 32)
		e.producers[args["worker"]].conn.Close()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			sr, err := e.q.Stats(ctxT(t), &w)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(sr.Streams, func(s sock.StreamStats) bool {
				return (s.DpRank != nil) == perRank && (!perRank || uint64(*s.DpRank) == r)
			})
			if i >= 0 && !sr.Streams[i].Attached {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%q: the stream did not detach: %+v", line, sr)
			}
		}
		return "detached"
	case "send":
		return e.send(strings.Join(f[1:], ""))
	}
	// Requests: key=value fields become a JSON object (numbers stay numbers, "null" stays null).
	kinds := map[string]sock.Kind{"detach": sock.KindDetach, "events": sock.KindEvents, "dump": sock.KindDump, "stats": sock.KindStats, "match": sock.KindMatch, "health": sock.KindHealth, "forget": sock.KindForget}
	kind, ok := kinds[f[0]]
	if !ok {
		t.Fatalf("unknown command %q", line)
	}
	fields := make([]string, 0, len(args))
	for _, a := range f[1:] {
		k, v, _ := strings.Cut(a, "=")
		if k == "tokens" { // tokens=HASH: the tokens stored for that block hash
			p := e.anyProducer()
			h, _ := strconv.ParseUint(v, 10, 32)
			b, _ := json.Marshal(tokens(uint32(h)*p.bs, 1, p.bs))
			v = string(b)
		}
		fields = append(fields, strconv.Quote(k)+":"+v)
	}
	body, err := e.q.Do(ctxT(t), kind, []byte("{"+strings.Join(fields, ",")+"}"))
	if err != nil {
		return errText(err)
	}
	if kind == sock.KindStats {
		return statsSummary(t, body)
	}
	return string(body)
}

func (e *scriptEnv) anyProducer() *scriptProducer {
	for _, p := range e.producers {
		return p
	}
	e.t.Fatal("no producer attached")
	return nil
}

// statsSummary prints the stable fields of a STATS reply (no paths, pids, epochs, byte counts).
func statsSummary(t *testing.T, body []byte) string {
	var r sock.StatsReply
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Streams) == 0 {
		return "no streams"
	}
	var b strings.Builder
	for _, s := range r.Streams {
		ids := "none"
		if s.FirstEventID != nil {
			ids = fmt.Sprintf("%d..%d", *s.FirstEventID, *s.LastEventID)
		}
		rank := "all"
		if s.DpRank != nil {
			rank = strconv.FormatUint(uint64(*s.DpRank), 10)
		}
		fmt.Fprintf(&b, "worker=%d dp_rank=%s attached=%v alive=%v stream_epoch=%d ids=%s buffered=%d resident=%d incomplete=%v lost=%d lost_ranges=%d\n",
			s.WorkerID, rank, s.Attached, s.ProducerAlive, s.StreamEpoch, ids, s.Buffered, s.ResidentBlocks, s.Incomplete, s.LostEvents, len(s.LostRanges))
	}
	return b.String()
}

func errText(err error) string {
	var re *sock.RemoteError
	if errors.As(err, &re) {
		return "error " + re.Code + ": " + re.Message
	}
	return "error: " + err.Error()
}

// send writes raw bytes on a fresh connection and prints every reply frame, then whether the daemon closed it.
func (e *scriptEnv) send(hexBytes string) string {
	raw, err := hex.DecodeString(hexBytes)
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := net.Dial("unix", e.ts.SocketPath())
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(raw); err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		f, _, err := sock.ReadFrame(br, sock.MaxResponse, nil)
		if err != nil {
			if isTimeout(err) {
				b.WriteString("connection open\n")
			} else if err == io.EOF || isReset(err) {
				b.WriteString("connection closed\n")
			} else {
				fmt.Fprintf(&b, "read error: %v\n", err)
			}
			return b.String()
		}
		fmt.Fprintf(&b, "reply kind=%d status=%d %s\n", f.Kind, f.Status, bytes.TrimSpace(f.Body))
	}
}
