package stream

import (
	"context"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/go-zeromq/zmq4"
	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/drain"
	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/vllmwire"
	"github.com/kvshm/kvshm/zmqpub"
)

// TestScripts runs the data-driven scripts in testdata/ (github.com/cockroachdb/datadriven) against the engine
// alone: real rings, no socket, no drain worker. The script is the worker (it runs the passes, the housekeeping
// and the final drain) and the environment (a fake clock, producer pids it can kill, checkpoints in memory, the
// parent). A script is a sequence of blocks: a command line, "----", the expected output, a blank line; "#" lines
// are comments stating intent. -rewrite rewrites the expected outputs.
//
// Commands (key=W is worker W's ALL stream, key=W/R its per-rank stream of dp_rank R; default 1):
//
//	config [checkpoint-interval=D] [heartbeat=D]   before the first attach: the engine's Config
//	attach [key] [publish] [new-ring]   attach the key's ring: a new stream (StartBegin), a reattach of the same ring
//	                                    (StartReattach), or with new-ring a producer restart (Restart, StartBegin)
//	stored seq=S hashes=H,H [parent=P] [dp=D] [key]   one EVENT record, published
//	removed seq=S hashes=H,H [dp=D] [key] / cleared seq=S [key]
//	batch seq=S [dp=D] [key]            one BATCH record of the events on the following lines (stored/removed/
//	                                    cleared as above, without seq; "cpu" publishes a stored event on medium CPU)
//	drop seq=S [n=N] [key]              the producer drops events S..S+N-1 (ring full: loss pending; the LOSS
//	                                    record goes with the next event that fits)
//	drain [key]                         drain passes until one is empty; prints the records read
//	tick d=DURATION                     advance the clock; housekeep [key] runs the housekeeping at it
//	wait-checkpoint [key]               passes until the asynchronous checkpoint in flight is written and released
//	kill [key]                          the producer's pid is gone (a watch-detached of it has seen it when kill returns)
//	finish cause=eof|detach|pid|shutdown [key]   end the attachment: Finish, then the worker's Final
//	parent-gone                         the daemon's --parent-pid is gone
//	state [key]                         the stream as STATS reads it, and its index
//	recover [start=N] [key]             the index's answer to a recovery query from N
//	replay [from=N] [key]               what the stream's publisher replays from wire seq N (default 0)
//	env                                 what the engine asked of its environment since the last env
func TestScripts(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) == 0 {
		t.Fatal("no scripts in testdata")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			h := newHarness(t)
			datadriven.RunTest(t, file, h.run)
		})
	}
}

// fakeEnv is the engine's environment in the scripts. The clock (offset) is the script's alone; the rest is
// shared with watch-detached's goroutine.
type fakeEnv struct {
	h          *harness
	done       chan struct{}
	mu         sync.Mutex // protects the fields below
	parentGone bool
	dead       map[int]bool // pids the script killed
	log        []string     // what the engine asked, for env
	idle       int          // StreamIdle calls
}

func (e *fakeEnv) note(format string, args ...any) {
	e.mu.Lock()
	e.log = append(e.log, fmt.Sprintf(format, args...))
	e.mu.Unlock()
}

func (e *fakeEnv) Now() time.Time { return e.h.now() }
func (e *fakeEnv) Mono() int64    { return int64(e.h.offset) }
func (e *fakeEnv) StreamIdle() {
	e.mu.Lock()
	e.idle++
	e.mu.Unlock()
	e.note("stream idle (reaper woken)")
}
func (e *fakeEnv) Done() <-chan struct{} { return e.done }
func (e *fakeEnv) RankSeen(r uint32)     { e.note("rank %d seen", r) }

func (e *fakeEnv) ParentGone() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.parentGone
}

func (e *fakeEnv) ProcessAlive(pid int, _ uint64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.dead[pid]
}

func (e *fakeEnv) WatchPID(pid int, _ uint64) PIDWatch {
	e.note("pid watch opened")
	return fakePID{e, pid}
}

func (e *fakeEnv) Save(k Key, _ uint64, ix *index.Indexer, head uint64, trigger string) error {
	e.note("checkpoint %s head=%d trigger=%s last_id=%d", k, head, trigger, ix.Stats().LastSeenID)
	return nil
}

func (e *fakeEnv) SaveCopy(k Key, _ uint64, _ *index.CheckpointCopy, head uint64, trigger string) error {
	e.note("checkpoint %s head=%d trigger=%s (copy)", k, head, trigger)
	return nil
}

func (e *fakeEnv) Remove(k Key) { e.note("checkpoints of %s removed", k) }

type fakePID struct {
	e   *fakeEnv
	pid int
}

func (p fakePID) Alive() bool { return p.e.ProcessAlive(p.pid, 0) }
func (p fakePID) Close()      {}

// handScheduler is the script's hand on the attachments: Add returns a worker whose Wake does nothing (the script
// runs the passes) and whose Stop is noted (finish runs Final).
type handScheduler struct{}

type handWorker struct{}

func (handScheduler) Add(drain.Stream) (Worker, error) { return handWorker{}, nil }
func (handWorker) Wake()                               {}
func (handWorker) Stop()                               {}

// ring is a producer's ring in a script.
type ring struct {
	w    *shm.Writer
	path string
	gen  int // how many rings the key had: a new ring is a new epoch
}

type harness struct {
	t       *testing.T
	dir     string
	start   time.Time
	offset  time.Duration
	env     *fakeEnv
	eng     *Engine
	streams map[Key]*Stream
	rings   map[Key]*ring
	atts    map[Key]*Attachment
	fb      *flatbuffers.Builder
	ep      int // publisher endpoints made
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, dir: t.TempDir(), start: time.Now(), streams: map[Key]*Stream{}, rings: map[Key]*ring{},
		atts: map[Key]*Attachment{}, fb: flatbuffers.NewBuilder(1024)}
	h.env = &fakeEnv{h: h, dead: map[int]bool{}, done: make(chan struct{})}
	// Wire seqs from 1 (the clock's µs would differ run to run); a heartbeat after 1 s of silence.
	h.eng = New(Config{Heartbeat: time.Second, SeqZero: true, PIDCheckInterval: time.Second, ReplayFill: 16},
		h.env, handScheduler{}, testLogger(t))
	t.Cleanup(func() {
		close(h.env.done)
		for k, a := range h.atts {
			if !a.Stopping() {
				a.Finish(CauseShutdown, "script ended")
				a.Final()
			}
			delete(h.atts, k)
		}
		for _, st := range h.streams {
			st.ClosePublisher()
		}
		for _, r := range h.rings {
			_ = r.w.Close()
		}
	})
	return h
}

// now is the script's clock: the wall clock plus the ticks (the engine stamps a few times with time.Now).
func (h *harness) now() time.Time { return time.Now().Add(h.offset) }

// key reads the command's key argument (default worker 1, scope ALL).
func (h *harness) key(d *datadriven.TestData) Key {
	if !d.HasArg("key") {
		return Key{Worker: 1}
	}
	var s string
	d.ScanArgs(h.t, "key", &s)
	w, r, per := strings.Cut(s, "/")
	k := Key{Worker: h.u64(w), PerRank: per}
	if per {
		k.Rank = uint32(h.u64(r))
	}
	return k
}

func (h *harness) u64(s string) uint64 {
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		h.t.Fatalf("bad number %q: %v", s, err)
	}
	return v
}

func (h *harness) arg(d *datadriven.TestData, name string, def uint64) uint64 {
	if !d.HasArg(name) {
		return def
	}
	var s string
	d.ScanArgs(h.t, name, &s)
	return h.u64(s)
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	h.t = t
	k := h.key(d)
	switch d.Cmd {
	case "config":
		// Before the first attach: the engine's Config beyond the scripts' default.
		cfg := h.eng.cfg
		for _, arg := range d.CmdArgs {
			dur, err := time.ParseDuration(arg.Vals[0])
			if err != nil {
				t.Fatal(err)
			}
			switch arg.Key {
			case "checkpoint-interval":
				cfg.CheckpointInterval = dur
			case "heartbeat":
				cfg.Heartbeat = dur
			default:
				t.Fatalf("unknown config %q", arg.Key)
			}
		}
		h.eng = New(cfg, h.env, handScheduler{}, testLogger(t))
		return "ok"
	case "wait-checkpoint":
		// The asynchronous checkpoint in flight (its writer goroutine) is written; a pass releases its head.
		a := h.att(k)
		for a.ckptBusy {
			time.Sleep(time.Millisecond)
			a.Pass(h.now())
		}
		return "ok"
	case "attach":
		return h.attach(k, d.HasArg("publish"), d.HasArg("new-ring"))
	case "stored", "removed", "cleared":
		ev := h.event(d.Cmd, d.CmdArgs, h.arg(d, "seq", 0))
		if err := h.ring(k).w.WriteEvent(ev.Seq, fbs.Build(h.fb, &ev)); err != nil {
			return "not written: " + err.Error()
		}
		return "ok"
	case "batch":
		return h.batch(k, d)
	case "drop":
		seq := h.arg(d, "seq", 0)
		for i := range h.arg(d, "n", 1) {
			h.ring(k).w.CountDrop(seq+i, 100)
		}
		return "ok"
	case "drain":
		a := h.att(k)
		n, passes := 0, 0
		for {
			m := a.Pass(h.now())
			passes++
			n += m
			if m == 0 || passes > 100 {
				break
			}
		}
		return fmt.Sprintf("%d records", n)
	case "tick":
		var s string
		d.ScanArgs(t, "d", &s)
		dur, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		h.offset += dur
		return "ok"
	case "housekeep":
		a := h.att(k)
		if _, err := a.Housekeep(h.now()); err != nil {
			return "error: " + err.Error()
		}
		if a.Stopping() {
			return "ok: the attachment ends (finish runs its Final)"
		}
		return "ok"
	case "kill":
		h.env.mu.Lock()
		h.env.dead[int(h.ring(k).w.Header().ProducerPID)] = true
		idle := h.env.idle
		h.env.mu.Unlock()
		h.waitWatch(k, idle)
		return "ok"
	case "finish":
		return h.finish(k, d)
	case "parent-gone":
		h.env.mu.Lock()
		h.env.parentGone = true
		h.env.mu.Unlock()
		return "ok"
	case "state":
		return h.state(k)
	case "recover":
		ix, _ := h.stream(k).Current()
		start := h.arg(d, "start", 0)
		resp, err := ix.Recover(context.Background(), &start, nil)
		if err != nil {
			return "error: " + err.Error()
		}
		return fmt.Sprintf("%s last=%d events=%d incomplete=%v\n%s", resp.Kind, resp.LastEventID, resp.NumEvents,
			resp.Incomplete, resp.JSON)
	case "replay":
		return h.replay(k, h.arg(d, "from", 0))
	case "env":
		h.env.mu.Lock()
		out := strings.Join(h.env.log, "\n")
		h.env.log = nil
		h.env.mu.Unlock()
		if out == "" {
			return "nothing"
		}
		return out
	}
	t.Fatalf("unknown command %q", d.Cmd)
	return ""
}

// waitWatch waits until a watch-detached of the key's stream (if one runs) has seen the pid gone and ended:
// the stream has no watcher left and StreamIdle was called since idle (its count when the pid died).
func (h *harness) waitWatch(k Key, idle int) {
	st := h.streams[k]
	if st == nil {
		return
	}
	st.mu.Lock()
	watched := st.watchers > 0
	st.mu.Unlock()
	if !watched {
		return
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		st.mu.Lock()
		n := st.watchers
		st.mu.Unlock()
		h.env.mu.Lock()
		called := h.env.idle > idle
		h.env.mu.Unlock()
		if n == 0 && called {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("the watch of %s did not end in 30 s after its pid died", k)
		}
	}
}

func (h *harness) stream(k Key) *Stream {
	st := h.streams[k]
	if st == nil {
		h.t.Fatalf("no stream %s", k)
	}
	return st
}

func (h *harness) att(k Key) *Attachment {
	a := h.atts[k]
	if a == nil {
		h.t.Fatalf("%s is not attached", k)
	}
	return a
}

func (h *harness) ring(k Key) *ring {
	r := h.rings[k]
	if r == nil {
		h.t.Fatalf("%s has no ring", k)
	}
	return r
}

// attach opens the key's ring (a new one with new-ring, or for the first attach) and attaches it.
func (h *harness) attach(k Key, publish, newRing bool) string {
	r := h.rings[k]
	if r == nil || newRing {
		gen := 1
		if r != nil {
			gen = r.gen + 1
			_ = r.w.Close()
			time.Sleep(time.Microsecond) // a new ring epoch (the clock in ns)
		}
		path := filepath.Join(h.dir, fmt.Sprintf("%d-%d-%d.ring", k.Worker, k.Rank, gen))
		w, err := shm.Create(path, shm.Options{Capacity: 1 << 16, WorkerID: k.Worker, KVBlockSize: 2, MaxBufferSize: 64})
		if err != nil {
			h.t.Fatal(err)
		}
		r = &ring{w: w, path: path, gen: gen}
		h.rings[k] = r
	}
	rd, err := shm.Open(r.path)
	if err != nil {
		h.t.Fatal(err)
	}
	var p *Publish
	if publish {
		h.ep++
		p = &Publish{Wire: vllmwire.Wire033, Config: zmqpub.Config{HWM: 100, BufferSteps: 100,
			Endpoint:       "ipc://" + filepath.Join(h.dir, fmt.Sprintf("pub%d", h.ep)),
			ReplayEndpoint: "ipc://" + filepath.Join(h.dir, fmt.Sprintf("rep%d", h.ep))}}
	}
	newIndex := func() *index.Indexer {
		ix, err := index.New(index.Config{WorkerID: k.Worker, BlockSize: 2, MaxBufferSize: 64, KeepTokens: h.eng.KeepTokens(publish)})
		if err != nil {
			h.t.Fatal(err)
		}
		return ix
	}
	hdr := rd.Header()
	st := h.streams[k]
	start, what := StartReattach, "reattach"
	switch {
	case st == nil:
		var pub *zmqpub.Publisher
		if p != nil {
			if pub, err = h.eng.OpenPublisher(k, p); err != nil {
				h.t.Fatal(err)
			}
		}
		st = h.eng.NewStream(k, newIndex(), pub, p)
		h.streams[k] = st
		start, what = StartBegin, "new stream"
	case newRing:
		if err := st.SetPublisher(p); err != nil {
			h.t.Fatal(err)
		}
		st.Restart(newIndex(), hdr.Epoch)
		start, what = StartBegin, "restart"
	default:
		if err := st.SetPublisher(p); err != nil {
			h.t.Fatal(err)
		}
	}
	a, att, err := st.Attach(AttachSpec{Ring: rd, Header: hdr, Head: rd.Stats().Head, RingPath: r.path, BlockSize: 2,
		Wire: vllmwire.Wire033, Lease: nopCloser{}, CheckPID: true, Start: start})
	if err != nil {
		h.t.Fatal(err)
	}
	h.atts[k] = a
	return fmt.Sprintf("%s: stream_epoch=%d publishing=%v", what, att.StreamEpoch, att.Publishing)
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// event parses stored/removed/cleared arguments.
func (h *harness) event(kind string, args []datadriven.CmdArg, seq uint64) fbs.EventSpec {
	ev := fbs.EventSpec{Seq: seq}
	for _, a := range args {
		switch a.Key {
		case "hashes":
			for _, v := range a.Vals {
				for _, s := range strings.Split(v, ",") {
					ev.BlockHashes = append(ev.BlockHashes, h.u64(s))
				}
			}
		case "parent":
			ev.HasParent, ev.ParentHash = true, h.u64(a.Vals[0])
		case "dp":
			ev.DpRank = uint32(h.u64(a.Vals[0]))
		}
	}
	switch kind {
	case "stored":
		ev.Kind = fbs.KindStored
		ev.TokenIDs = tokens(uint32(ev.BlockHashes[0]*10), len(ev.BlockHashes), 2)
	case "removed":
		ev.Kind = fbs.KindRemoved
	default:
		ev.Kind = fbs.KindCleared
		ev.BlockHashes = nil
	}
	return ev
}

// batch writes one BATCH record of the events on the command's input lines, all under seq and dp.
func (h *harness) batch(k Key, d *datadriven.TestData) string {
	seq, dp := h.arg(d, "seq", 0), h.arg(d, "dp", 0)
	var subs []shm.Sub
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		var args []datadriven.CmdArg
		cpu := false
		for _, kv := range f[1:] {
			if kv == "cpu" {
				cpu = true
				continue
			}
			key, val, _ := strings.Cut(kv, "=")
			args = append(args, datadriven.CmdArg{Key: key, Vals: []string{val}})
		}
		ev := h.event(f[0], args, seq)
		ev.DpRank = uint32(dp)
		if cpu {
			m := fbs.MetaSpec{HasMedium: true, Medium: "CPU"}
			subs = append(subs, shm.Sub{Type: shm.SubMeta, Payload: slices.Clone(fbs.BuildMeta(h.fb, &m))})
		}
		subs = append(subs, shm.Sub{Type: shm.SubEvent, Payload: slices.Clone(fbs.Build(h.fb, &ev))})
	}
	ok, err := h.ring(k).w.WriteBatch(0, subs)
	if err != nil || !ok {
		return fmt.Sprintf("not written: %v %v", ok, err)
	}
	return "ok"
}

var causes = map[string]EndCause{"eof": CauseEOF, "detach": CauseDetach, "pid": CausePIDGone, "shutdown": CauseShutdown}

// finish ends the attachment as its worker would: Finish (Stop), then Final on the worker.
func (h *harness) finish(k Key, d *datadriven.TestData) string {
	var c string
	d.ScanArgs(h.t, "cause", &c)
	cause, ok := causes[c]
	if !ok {
		h.t.Fatalf("unknown cause %q", c)
	}
	a := h.att(k)
	a.Finish(cause, "script: "+c)
	a.Final()
	<-a.Done()
	delete(h.atts, k)
	return fmt.Sprintf("final head=%d", a.FinalHead())
}

func (h *harness) state(k Key) string {
	st := h.stream(k)
	s := st.Status()
	is := s.Index.Stats()
	var b strings.Builder
	fmt.Fprintf(&b, "stream_epoch=%d resets=%d attached=%v alive=%v\n", s.StreamEpoch, s.Resets, s.Attached, s.Alive)
	var recv [3]uint64
	copy(recv[:], s.EventsRecv[:])
	fmt.Fprintf(&b, "received stored=%d removed=%d cleared=%d batches=%d loss_records=%d malformed=%d not_indexed=%v\n",
		recv[0], recv[1], recv[2], s.Batches, s.LossRecords, s.Malformed, s.NotIndexed)
	if r := h.rings[k]; r != nil && s.Attached {
		rs := r.w.Stats() // the header as the producer sees it: the head released so far
		fmt.Fprintf(&b, "ring head=%d tail=%d\n", rs.Head, rs.Tail)
	}
	fmt.Fprintf(&b, "index last_id=%d buffered=%d resident=%d tainted=%v\n", is.LastSeenID, is.Buffered, is.ResidentBlocks, is.Tainted)
	for _, lr := range is.LostRanges {
		fmt.Fprintf(&b, "lost %d..%d unknown=%v: %s\n", lr.First, lr.Last, lr.Unknown, lr.Reason)
	}
	if st.Publisher() != nil {
		fmt.Fprintf(&b, "wire seq=%d\n", st.WireSeq())
	}
	return b.String()
}

// replay asks the stream's publisher to replay from wire seq from, over its replay socket (zmqpub's ROUTER), and
// prints each batch: its seq and its events (without the timestamp, which is the wall clock's).
func (h *harness) replay(k Key, from uint64) string {
	p := h.stream(k).Publisher()
	if p == nil {
		return "not publishing"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dl := zmq4.NewDealer(ctx)
	defer dl.Close()
	if err := dl.Dial(p.Stats().ReplayEndpoint); err != nil {
		h.t.Fatal(err)
	}
	if err := dl.SendMulti(zmq4.NewMsgFrom(nil, binary.BigEndian.AppendUint64(nil, from))); err != nil {
		h.t.Fatal(err)
	}
	var b strings.Builder
	for {
		r, err := dl.Recv()
		if err != nil {
			h.t.Fatal(err)
		}
		if len(r.Frames) != 4 {
			h.t.Fatalf("reply frames %d, want 4", len(r.Frames))
		}
		if len(r.Frames[3]) == 0 {
			return b.String()
		}
		bt, err := vllmwire.Decode(r.Frames[3])
		if err != nil {
			h.t.Fatalf("decode replayed batch: %v", err)
		}
		fmt.Fprintf(&b, "seq %d rank %d: %s\n", binary.BigEndian.Uint64(r.Frames[2]), bt.DpRank, strings.Join(describeEvents(bt), " "))
	}
}

// describeEvents names each event of a batch with its block hashes.
func describeEvents(b vllmwire.Batch) []string {
	out := []string{}
	for _, e := range b.Events {
		switch e.Kind {
		case vllmwire.KindStored:
			s := fmt.Sprint("Stored", e.BlockHashes)
			if e.HasParent {
				s += fmt.Sprintf("^%d", e.ParentHash)
			}
			if e.Medium != "GPU" {
				s += "@" + e.Medium
			}
			out = append(out, s)
		case vllmwire.KindRemoved:
			out = append(out, fmt.Sprint("Removed", e.BlockHashes))
		default:
			out = append(out, "Cleared")
		}
	}
	if len(out) == 0 {
		out = append(out, "(empty)")
	}
	return out
}
