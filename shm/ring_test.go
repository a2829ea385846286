package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLayoutOffsets pins every offset to the table of FORMAT.md: the Python writer uses the same
// numbers.
func TestLayoutOffsets(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"magic", offMagic, 0x000}, {"version", offVersion, 0x008}, {"header_size", offHeaderSize, 0x00C},
		{"capacity", offCapacity, 0x010}, {"max_record", offMaxRecord, 0x018}, {"flags", offFlags, 0x01C},
		{"producer_pid", offProducerPID, 0x020}, {"producer_start_time", offProducerStart, 0x028},
		{"epoch", offEpoch, 0x030}, {"worker_id", offWorkerID, 0x038}, {"kv_block_size", offKVBlockSize, 0x040},
		{"max_buffer_size", offMaxBufferSize, 0x044}, {"state", offState, 0x048}, {"tail", offTail, 0x080},
		{"head", offHead, 0x100}, {"dropped_events", offDroppedEvents, 0x180}, {"dropped_bytes", offDroppedBytes, 0x188},
		{"loss_first_seq", offLossFirstSeq, 0x190}, {"loss_last_seq", offLossLastSeq, 0x198},
		{"loss_pending", offLossPending, 0x1A0}, {"consumer_heartbeat", offHeartbeat, 0x200},
		{"consumer_parked", offParked, 0x208},
	} {
		if c.got != c.want {
			t.Errorf("offset of %s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

// TestWrapAndPadding drives the writer to chosen positions and checks where each record lands, which appends are
// refused (nothing written), and where padding records appear.
func TestWrapAndPadding(t *testing.T) {
	const capacity = 64 << 10
	rep := func(size, n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = size
		}
		return s
	}
	cases := []struct {
		name    string
		start   uint64  // head = tail = start before the case
		setup   []int   // payload sizes appended first (must fit)
		appends []int   // payload sizes under test
		want    []int64 // record position per append, -1 = refused
		pads    []uint64
	}{
		{name: "exact fit to the end needs no padding", start: capacity - 1024,
			appends: []int{1016, 0}, want: []int64{capacity - 1024, capacity}},
		{name: "minimal 8-byte padding", start: capacity - 8,
			appends: []int{8}, want: []int64{capacity}, pads: []uint64{capacity - 8}},
		{name: "padding on the second lap", start: 2*capacity - 40,
			appends: []int{100}, want: []int64{2 * capacity}, pads: []uint64{2*capacity - 40}},
		{name: "pad plus record exactly fill the ring", start: 8192, setup: append(rep(1016, 55), 504),
			appends: []int{8184, 0}, want: []int64{capacity, -1}, pads: []uint64{65024}},
		{name: "pad does not fit: nothing written, smaller record still fits at the end", start: 8184,
			setup: append(rep(1016, 55), 512), appends: []int{8184, 400, 0}, want: []int64{-1, 65024, 65432}},
		{name: "zero and unaligned payloads", start: 0,
			appends: []int{0, 1, 7, 8, 9}, want: []int64{0, 8, 24, 40, 56}},
		{name: "max_record boundary", start: 0, appends: []int{8184, 8185}, want: []int64{0, -1}},
		{name: "ring exactly full", start: 0, setup: rep(8184, 7), appends: []int{8184, 0}, want: []int64{57344, -1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, r, _ := newTestRing(t, Options{Capacity: capacity, MaxRecord: 8192})
			advanceTo(t, w, r, c.start)
			for i, n := range c.setup {
				if !w.Append(TypeEvent, payloadOf(i, n)) {
					t.Fatalf("setup append %d (%d bytes) refused", i, n)
				}
			}
			var wantPos []uint64
			var wantPayloads [][]byte
			for i, n := range c.appends {
				before := w.tail
				p := payloadOf(1000+i, n)
				ok := w.Append(TypeEvent, p)
				if ok != (c.want[i] >= 0) {
					t.Fatalf("append %d (%d bytes) at tail %d: ok=%v, want position %d", i, n, before, ok, c.want[i])
				}
				if !ok {
					if w.tail != before {
						t.Fatalf("refused append %d moved the staged tail from %d to %d", i, before, w.tail)
					}
					continue
				}
				wantPos = append(wantPos, uint64(c.want[i]))
				wantPayloads = append(wantPayloads, p)
			}
			w.Publish()
			recs := drain(t, r)
			if len(recs) != len(c.setup)+len(wantPos) {
				t.Fatalf("read %d records, want %d setup + %d", len(recs), len(c.setup), len(wantPos))
			}
			for i, rec := range recs[len(c.setup):] {
				if rec.Pos != wantPos[i] || !bytes.Equal(rec.Payload, wantPayloads[i]) || rec.Type != TypeEvent {
					t.Errorf("record %d: pos %d type %d len %d, want pos %d len %d",
						i, rec.Pos, rec.Type, len(rec.Payload), wantPos[i], len(wantPayloads[i]))
				}
			}
			for _, p := range c.pads {
				idx := p & (capacity - 1)
				if typ, n := le32(r.data[idx+4:]), le32(r.data[idx:]); typ != TypePadding || uint64(n) != capacity-idx {
					t.Errorf("at %d: type %#x length %d, want PADDING of %d", p, typ, n, capacity-idx)
				}
			}
			if st := r.Stats(); st.Head != st.Tail || st.Tail != w.published {
				t.Errorf("after drain: head %d tail %d, writer published %d", st.Head, st.Tail, w.published)
			}
		})
	}
}

// TestRingFullLoss checks the drop accounting: full ring and oversize events return at once, the header shows the
// exact pending range, and the next event that fits is preceded by a LOSS record in the same publication.
func TestRingFullLoss(t *testing.T) {
	w, r, path := newTestRing(t, Options{Capacity: 64 << 10, MaxRecord: 8192})
	for seq := uint64(1); seq <= 64; seq++ { // 64 records of 1024 bytes fill 64 KiB exactly
		if err := w.WriteEvent(seq, payloadOf(int(seq), 1016)); err != nil {
			t.Fatalf("WriteEvent(%d): %v", seq, err)
		}
	}
	if err := w.WriteEvent(65, payloadOf(65, 1016)); !errors.Is(err, ErrFull) {
		t.Fatalf("WriteEvent(65) on a full ring = %v, want ErrFull", err)
	}
	if err := w.WriteEvent(66, payloadOf(66, 10)); !errors.Is(err, ErrFull) {
		t.Fatalf("WriteEvent(66) = %v, want ErrFull", err)
	}
	if err := w.WriteEvent(67, make([]byte, 9000)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("WriteEvent(67) oversize = %v, want ErrTooLarge", err)
	}
	want := RingStats{Head: 0, Tail: 65536, ReadPos: 0, Used: 65536, Capacity: 65536, DroppedEvents: 3,
		DroppedBytes: 1016 + 10 + 9000, LossPending: true, LossFirstSeq: 65, LossLastSeq: 67, State: StateReady}
	if st := r.Stats(); st != want {
		t.Fatalf("stats after drops:\n got %+v\nwant %+v", st, want)
	}
	if _, st, err := Inspect(path); err != nil || st.DroppedEvents != 3 || !st.LossPending || st.LossFirstSeq != 65 {
		t.Fatalf("Inspect = %+v, %v; want the same drop fields", st, err)
	}

	// Free exactly one 1024-byte record: LOSS (32) + a 1008-byte event do not fit together, so neither is published.
	if rec, err := r.Next(); err != nil || rec.Pos != 0 {
		t.Fatalf("Next = %+v, %v", rec, err)
	}
	r.Release()
	if err := w.WriteEvent(68, payloadOf(68, 1000)); !errors.Is(err, ErrFull) {
		t.Fatalf("WriteEvent(68) with LOSS+event > free = %v, want ErrFull", err)
	}
	if st := r.Stats(); st.Tail != 65536 || st.DroppedEvents != 4 || st.LossLastSeq != 68 {
		t.Fatalf("after refused LOSS+event: %+v", st)
	}
	// A small event fits with its LOSS record.
	if err := w.WriteEvent(69, payloadOf(69, 100)); err != nil {
		t.Fatalf("WriteEvent(69): %v", err)
	}
	recs := drain(t, r)
	if len(recs) != 63+2 {
		t.Fatalf("read %d records, want 63 events + LOSS + event", len(recs))
	}
	loss, ev := recs[63], recs[64]
	first, last, count, ok := loss.Loss()
	if !ok || first != 65 || last != 68 || count != 4 || loss.Pos != 65536 {
		t.Fatalf("LOSS record = %+v (first %d last %d count %d ok %v), want [65,68] count 4 at 65536",
			loss, first, last, count, ok)
	}
	if ev.Type != TypeEvent || !bytes.Equal(ev.Payload, payloadOf(69, 100)) || ev.Pos != 65536+32 {
		t.Fatalf("event after LOSS = pos %d type %d len %d", ev.Pos, ev.Type, len(ev.Payload))
	}
	st := r.Stats()
	if st.LossPending || st.DroppedEvents != 4 || st.DroppedBytes != 1016+10+9000+1000 {
		t.Fatalf("stats after LOSS record: %+v", st)
	}
	// The next loss starts a new range and count.
	if err := w.WriteEvent(70, make([]byte, 9000)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("WriteEvent(70) = %v", err)
	}
	if err := w.WriteEvent(71, nil); err != nil {
		t.Fatalf("WriteEvent(71): %v", err)
	}
	recs = drain(t, r)
	if len(recs) != 2 {
		t.Fatalf("read %d records, want LOSS + event", len(recs))
	}
	if first, last, count, ok := recs[0].Loss(); !ok || first != 70 || last != 70 || count != 1 {
		t.Fatalf("second LOSS = [%d,%d] count %d ok %v, want [70,70] count 1", first, last, count, ok)
	}
}

// TestWriterModel runs random appends, publications and drains against a model of the free-space rule and the
// record stream.
func TestWriterModel(t *testing.T) {
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	const capacity = 64 << 10
	w, r, _ := newTestRing(t, Options{Capacity: capacity, MaxRecord: 4096})
	var staged, published [][]byte // model: payloads staged / published but unread
	var head, tail uint64          // model positions (head = released, tail = staged)
	var readEnd uint64             // end of the records handed out by Next, not yet released
	steps := 20000
	if testing.Short() {
		steps = 2000
	}
	for i := range steps {
		switch op := rng.IntN(10); {
		case op < 6: // append
			n := rng.IntN(1200)
			if rng.IntN(20) == 0 {
				n = 4096 - 8 + rng.IntN(3) - 1 // around max_record
			}
			p := payloadOf(i, n)
			size := align8(uint64(8 + n))
			idx := tail & (capacity - 1)
			need := size
			if size > capacity-idx {
				need += capacity - idx
			}
			fits := uint64(8+n) <= 4096 && tail+need-head <= capacity
			if got := w.Append(TypeEvent, p); got != fits {
				t.Fatalf("step %d: Append(%d) at tail %d head %d = %v, model says %v", i, n, tail, head, got, fits)
			}
			if fits {
				tail += need
				staged = append(staged, p)
			}
		case op < 8:
			w.Publish()
			published = append(published, staged...)
			staged = nil
		default: // drain some, release
			k := rng.IntN(len(published) + 1)
			for j := range k {
				rec, err := r.Next()
				if err != nil {
					t.Fatalf("step %d: Next %d/%d: %v", i, j, k, err)
				}
				if !bytes.Equal(rec.Payload, published[j]) {
					t.Fatalf("step %d: record at %d has %d bytes, want %d", i, rec.Pos, len(rec.Payload), len(published[j]))
				}
				readEnd = rec.Pos + align8(uint64(8+len(rec.Payload)))
			}
			published = published[k:]
			if len(published) == 0 {
				if _, err := r.Next(); !errors.Is(err, ErrEmpty) { // also skips trailing padding
					t.Fatalf("step %d: Next on drained ring = %v, want ErrEmpty", i, err)
				}
				readEnd = r.pos
			}
			r.Release()
			if k > 0 || len(published) == 0 {
				head = max(head, readEnd)
			}
		}
	}
}

// TestSecondProducerRefused checks the flock: a second Create on the same path is refused with ErrLocked while a
// producer lives (whether it is a Writer or a foreign process holding flock, like the Python writer), and with
// ErrExist once the file is stale.
func TestSecondProducerRefused(t *testing.T) {
	w, _, path := newTestRing(t, Options{Capacity: MinCapacity})
	if _, err := Create(path, Options{Capacity: MinCapacity}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Create = %v, want ErrLocked", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path, Options{Capacity: MinCapacity}); !errors.Is(err, ErrExist) || errors.Is(err, ErrLocked) {
		t.Fatalf("Create on a stale ring = %v, want ErrExist", err)
	}
	// A lock held through another open file description (as the Python writer's fcntl.flock) also refuses.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path, Options{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("Create while another descriptor holds flock = %v, want ErrLocked", err)
	}
}

func TestCreateFile(t *testing.T) {
	w, r, path := newTestRing(t, Options{Capacity: MinCapacity, WorkerID: 9, KVBlockSize: 16, MaxBufferSize: 100})
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || fi.Size() != HeaderSize+MinCapacity {
		t.Fatalf("ring file mode %v size %d, want 0600 and %d", fi.Mode().Perm(), fi.Size(), HeaderSize+MinCapacity)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 < HeaderSize+MinCapacity {
		t.Fatalf("ring file has %d allocated bytes, want the whole file preallocated", st.Blocks*512)
	}
	h := r.Header()
	want := Header{Version: 1, HeaderSize: 4096, Capacity: MinCapacity, MaxRecord: MinCapacity / 8,
		ProducerPID: testIdentity.pid, ProducerStartTime: testIdentity.startTime, Epoch: testIdentity.epoch,
		WorkerID: 9, KVBlockSize: 16, MaxBufferSize: 100, State: StateReady}
	copy(want.Magic[:], Magic)
	if h != want || w.Header() != want {
		t.Fatalf("header:\n got %+v\nwant %+v", h, want)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if s := r.Header().State; s != StateClosed {
		t.Fatalf("state after Writer.Close = %v, want CLOSED", s)
	}
	if err := w.WriteEvent(1, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("WriteEvent after Close = %v, want ErrClosed", err)
	}

	// The real identity: our pid and start time, a nonzero epoch; mode is applied exactly despite the umask.
	p2 := filepath.Join(t.TempDir(), "real.ring")
	w2, err := Create(p2, Options{Capacity: MinCapacity, Mode: 0o640})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	st2, _ := ReadProcStat(0)
	if h := w2.Header(); h.ProducerPID != uint32(os.Getpid()) || h.ProducerStartTime != st2.StartTime || h.Epoch == 0 {
		t.Fatalf("identity = pid %d start %d epoch %d, want pid %d start %d, epoch != 0",
			h.ProducerPID, h.ProducerStartTime, h.Epoch, os.Getpid(), st2.StartTime)
	}
	if fi, _ := os.Stat(p2); fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640", fi.Mode().Perm())
	}
}

func TestOptionsValidation(t *testing.T) {
	for _, o := range []Options{
		{Capacity: MinCapacity / 2}, {Capacity: MinCapacity + 8}, {Capacity: MaxCapacity * 2},
		{Capacity: MinCapacity, MaxRecord: MinCapacity/8 + 8}, {Capacity: MinCapacity, MaxRecord: 24},
		{Capacity: MinCapacity, MaxRecord: 1001}, {Capacity: MinCapacity, Mode: os.ModeDir | 0o600},
	} {
		path := filepath.Join(t.TempDir(), "x.ring")
		if _, err := Create(path, o); !errors.Is(err, ErrOptions) {
			t.Errorf("Create(%+v) = %v, want ErrOptions", o, err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Create(%+v) left a file behind", o)
		}
	}
}

func TestProcStat(t *testing.T) {
	dir := t.TempDir()
	fields := "T 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 987654321 20 21"
	for _, comm := range []string{"(python3)", "(a) (b c))", "()"} {
		p := filepath.Join(dir, "stat")
		if err := os.WriteFile(p, []byte("1234 "+comm+" "+fields+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := readProcStat(p); err != nil || got != (ProcStat{State: 'T', StartTime: 987654321}) {
			t.Errorf("comm %q: %+v, %v; want state T, start time 987654321", comm, got, err)
		}
	}
	for name, body := range map[string]string{"short": "1 (x) S 1 2", "no comm": "1 x S", "bad start": "1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 -5 20"} {
		p := filepath.Join(dir, "bad")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readProcStat(p); err == nil {
			t.Errorf("%s: stat file accepted", name)
		}
	}
	if _, err := ReadProcStat(1<<22 + 1); !errors.Is(err, os.ErrNotExist) { // above pid_max's ceiling
		t.Errorf("a pid that cannot exist: %v, want os.ErrNotExist", err)
	}
	self, err := ReadProcStat(os.Getpid())
	if again, err2 := ReadProcStat(0); err != nil || err2 != nil || self.StartTime == 0 || again.StartTime != self.StartTime ||
		!bytes.ContainsRune([]byte("RSD"), rune(self.State)) {
		t.Errorf("own stat: %+v, %v; /proc/self: %+v, %v; want a live state and one start time", self, err, again, err2)
	}
}

// TestOpenValidation corrupts one header field at a time and checks Open and Inspect refuse with the right error.
func TestOpenValidation(t *testing.T) {
	base := validImage(t)
	le := binary.LittleEndian
	cases := []struct {
		name    string
		mutate  func(b []byte) []byte
		want    error
		message string // substring of the error message
	}{
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, ErrMagic, "bad magic"},
		{"newer version", func(b []byte) []byte { le.PutUint32(b[offVersion:], 2); return b }, ErrVersion,
			"file has version 2, this build reads version 1"},
		{"header size", func(b []byte) []byte { le.PutUint32(b[offHeaderSize:], 8192); return b }, ErrHeader, "header_size"},
		{"capacity not a power of two", func(b []byte) []byte { le.PutUint64(b[offCapacity:], 65536+8); return b }, ErrHeader, "capacity"},
		{"capacity too small", func(b []byte) []byte { le.PutUint64(b[offCapacity:], 4096); return b }, ErrHeader, "capacity"},
		{"max_record above capacity/8", func(b []byte) []byte { le.PutUint32(b[offMaxRecord:], 8200); return b }, ErrHeader, "max_record"},
		{"max_record unaligned", func(b []byte) []byte { le.PutUint32(b[offMaxRecord:], 4001); return b }, ErrHeader, "max_record"},
		{"max_record below a LOSS record", func(b []byte) []byte { le.PutUint32(b[offMaxRecord:], 16); return b }, ErrHeader, "max_record"},
		{"file truncated", func(b []byte) []byte { return b[:len(b)-4096] }, ErrHeader, "file is"},
		{"file too short for a header", func(b []byte) []byte { return b[:100] }, ErrHeader, "file is"},
		{"state INIT", func(b []byte) []byte { le.PutUint32(b[offState:], 0); return b }, ErrNotReady, "not ready"},
		{"unknown state", func(b []byte) []byte { le.PutUint32(b[offState:], 7); return b }, ErrHeader, "state"},
		{"head past tail", func(b []byte) []byte { le.PutUint64(b[offHead:], 1<<20); return b }, ErrCorrupt, "behind head"},
		{"tail unaligned", func(b []byte) []byte { le.PutUint64(b[offTail:], 1003); return b }, ErrCorrupt, "multiple of 8"},
		{"tail beyond head+capacity", func(b []byte) []byte { le.PutUint64(b[offTail:], 1<<20); return b }, ErrCorrupt, "more than capacity"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.ring")
			if err := os.WriteFile(path, c.mutate(bytes.Clone(base)), 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := Open(path)
			if err == nil {
				r.Close()
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.message) || !strings.HasPrefix(err.Error(), "open ring ") {
				t.Fatalf("Open = %v, want %v mentioning %q", err, c.want, c.message)
			}
			if c.want == ErrNotReady { // Inspect shows a ring being created without complaint
				if _, _, err := Inspect(path); err != nil {
					t.Fatalf("Inspect of an INIT ring = %v", err)
				}
				return
			}
			if h, _, err := Inspect(path); !errors.Is(err, c.want) {
				t.Fatalf("Inspect = %v, want %v", err, c.want)
			} else if len(base) == len(c.mutate(bytes.Clone(base))) && h.Version == 0 {
				t.Fatalf("Inspect returned no fields with the error")
			}
		})
	}
	t.Run("valid", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ok.ring")
		if err := os.WriteFile(path, base, 0o600); err != nil {
			t.Fatal(err)
		}
		h, st, err := Inspect(path)
		if err != nil || h.Capacity != 65536 || st.Tail == 0 || st.Used != st.Tail-st.Head {
			t.Fatalf("Inspect = %+v %+v %v", h, st, err)
		}
	})
}

// validImage returns the bytes of a small valid ring with a few published records.
func validImage(t testing.TB) []byte {
	t.Helper()
	w, _, path := newTestRing(t, Options{Capacity: 64 << 10, MaxRecord: 8192})
	for i := range 10 {
		if err := w.WriteEvent(uint64(i), payloadOf(i, 100*i)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCorruptRecords writes invalid bytes at the read position of an in-memory image and checks Next reports a
// CorruptionError at that position, repeats it, and recovers with SkipToTail.
func TestCorruptRecords(t *testing.T) {
	const capacity = 64 << 10
	le := binary.LittleEndian
	cases := []struct {
		name   string
		tail   uint64 // published tail (head 0, record area at index 0 or at idx)
		idx    uint64 // where the bad header is (and head)
		length uint32
		typ    uint32
		reason string
	}{
		{"zero type", 64, 0, 16, 0, "unknown record type"},
		{"unknown type", 64, 0, 16, 5, "unknown record type"},
		{"sub-record type as a record", 64, 0, 16, SubMeta, "unknown record type"},
		{"length below header", 64, 0, 4, TypeEvent, "shorter than its header"},
		{"length above max_record", 16384, 0, 8200, TypeEvent, "exceeds max_record"},
		{"record past tail", 64, 0, 72, TypeEvent, "past the tail"},
		{"record crosses the end", capacity, capacity - 64, 72, TypeEvent, "crosses the end"},
		{"padding too short", capacity, capacity - 64, 32, TypePadding, "padding length"},
		{"padding too long", capacity, capacity - 64, 128, TypePadding, "padding length"},
		{"padding past tail", capacity - 32, capacity - 64, 64, TypePadding, "past the tail"},
		{"LOSS of wrong length", 64, 0, 40, TypeLoss, "LOSS record length"},
		{"LOSS of zero length", 64, 0, 8, TypeLoss, "LOSS record length"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := blankImage(capacity, 8192)
			le.PutUint64(m[offHead:], c.idx)
			le.PutUint64(m[offTail:], c.tail+c.idx*0)
			if c.tail < c.idx {
				t.Fatalf("bad case")
			}
			le.PutUint32(m[HeaderSize+c.idx:], c.length)
			le.PutUint32(m[HeaderSize+c.idx+4:], c.typ)
			r, err := newReader(m, nil)
			if err != nil {
				t.Fatalf("newReader: %v", err)
			}
			for range 2 { // the error repeats until SkipToTail
				_, err = r.Next()
				var ce *CorruptionError
				if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Pos != c.idx || !strings.Contains(ce.Reason, c.reason) {
					t.Fatalf("Next = %v, want CorruptionError at %d with %q", err, c.idx, c.reason)
				}
			}
			r.SkipToTail()
			if _, err := r.Next(); !errors.Is(err, ErrEmpty) {
				t.Fatalf("Next after SkipToTail = %v, want ErrEmpty", err)
			}
			if h := le.Uint64(m[offHead:]); h != c.tail {
				t.Fatalf("head after SkipToTail = %d, want tail %d", h, c.tail)
			}
		})
	}
	t.Run("tail word moves backwards", func(t *testing.T) {
		w, r, _ := newTestRing(t, Options{Capacity: capacity})
		w.WriteEvent(1, make([]byte, 100))
		drain(t, r)
		storeTail(r.m, 8) // a third party scribbles over the tail word
		w.published, w.tail = 8, 8
		if _, err := r.Next(); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Next with tail behind head = %v, want ErrCorrupt", err)
		}
		r.SkipToTail() // cannot repair: head stays
		if st := r.Stats(); st.Head != 112 {
			t.Fatalf("SkipToTail moved head backwards to %d", st.Head)
		}
	})
}

// blankImage returns an in-memory ring image with a valid READY header and an empty data area.
func blankImage(capacity uint64, maxRecord uint32) []byte {
	m := make([]byte, HeaderSize+capacity)
	h := Header{Version: Version, HeaderSize: HeaderSize, Capacity: capacity, MaxRecord: maxRecord, State: StateReady}
	copy(h.Magic[:], Magic)
	putHeader(m, &h)
	binary.LittleEndian.PutUint32(m[offState:], uint32(StateReady))
	return m
}

// TestResumeAtPersistedHead reopens a ring after a partial drain: the new Reader starts at the released head, and
// records handed out but not released are delivered again.
func TestResumeAtPersistedHead(t *testing.T) {
	w, r, path := newTestRing(t, Options{Capacity: MinCapacity})
	for i := range 10 {
		if err := w.WriteEvent(uint64(i), payloadOf(i, 10+i)); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}
	r.Release()
	if _, err := r.Next(); err != nil { // read, not released: redelivered
		t.Fatal(err)
	}
	r.Heartbeat(12345)
	r.Close()
	if _, err := r.Next(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close = %v, want ErrClosed", err)
	}
	r2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	recs := drain(t, r2)
	if len(recs) != 6 || !bytes.Equal(recs[0].Payload, payloadOf(4, 14)) {
		t.Fatalf("resumed reader read %d records starting with %d bytes, want 6 starting with record 4", len(recs), len(recs[0].Payload))
	}
	if st := r2.Stats(); st.ConsumerHeartbeat != 12345 || st.Head != st.Tail {
		t.Fatalf("stats after resume: %+v", st)
	}
}

func TestAppendRejectsReservedTypes(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	for _, typ := range []uint32{0, SubMeta, 5, TypePadding} {
		if w.Append(typ, []byte("x")) {
			t.Errorf("Append(type %#x) accepted", typ)
		}
	}
	w.Publish()
	if _, err := r.Next(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Next = %v, want ErrEmpty", err)
	}
}

// TestCreateNoSpace fills a real 128 KiB tmpfs (mounting needs CAP_SYS_ADMIN; skipped without it): the second
// ring does not fit and Create refuses with ErrNoSpace at once, leaving no file behind.
func TestCreateNoSpace(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=128k"); err != nil {
		t.Skipf("cannot mount a small tmpfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, 0) })
	w, err := Create(filepath.Join(dir, "a.ring"), Options{Capacity: MinCapacity})
	if err != nil {
		t.Fatalf("first ring: %v", err)
	}
	defer w.Close()
	p := filepath.Join(dir, "b.ring")
	if _, err := Create(p, Options{Capacity: MinCapacity}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("second ring on a full tmpfs: %v, want ErrNoSpace", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed Create left %s behind", p)
	}
}

// TestCreateWithoutFallocate covers file systems without fallocate: the blocks are written with zeros instead.
func TestCreateWithoutFallocate(t *testing.T) {
	saved := fallocate
	defer func() { fallocate = saved }()
	fallocate = func(int, uint32, int64, int64) error { return unix.EOPNOTSUPP }
	w, r, path := newTestRing(t, Options{Capacity: MinCapacity})
	if err := w.WriteEvent(1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if recs := drain(t, r); len(recs) != 1 {
		t.Fatalf("read %d records, want 1", len(recs))
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Blocks*512 < HeaderSize+MinCapacity {
		t.Fatalf("file has %d allocated bytes (%v), want it fully written", st.Blocks*512, err)
	}
	fallocate = func(int, uint32, int64, int64) error { return unix.ENOSPC }
	if _, err := Create(filepath.Join(t.TempDir(), "full.ring"), Options{}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Create with ENOSPC = %v, want ErrNoSpace", err)
	}
}

// TestCorruptTailAheadHeals is a defect the soak found: a tail word scribbled to a value ahead of the producer's tail
// must not wedge the stream. Beyond head+capacity SkipToTail stays put and the producer's next publish rewrites the
// word. Within it SkipToTail moves head there (it cannot tell the word from a real tail); the reader then refuses
// the producer's smaller tails (never re-reading old bytes) until the producer, finding its ring full, re-bases at
// that head: at most one ring's worth of events is unreadable (the daemon marks the history unknown), one drop is
// reported by a LOSS record, and events flow again.
func TestCorruptTailAheadHeals(t *testing.T) {
	const capacity = 64 << 10
	const payload = 120 // 128-byte records
	for _, c := range []struct {
		name    string
		bad     func(tail uint64) uint64
		skipped bool // SkipToTail moves head to the bad word
		rebase  bool // the producer must re-base at that head (its cached head is too old to reach it)
	}{
		{"more than capacity ahead", func(tail uint64) uint64 { return tail + 4*capacity }, false, false},
		{"far beyond", func(uint64) uint64 { return 1 << 62 }, false, false},
		{"within capacity ahead, between records", func(tail uint64) uint64 { return tail + capacity/4 + 8 }, true, false},
		{"exactly capacity ahead", func(tail uint64) uint64 { return tail + capacity }, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, r, _ := newTestRing(t, Options{Capacity: capacity})
			// Half a ring of events, drained: the producer's cached head stays at 0, the consumer's head moves on.
			for seq := range uint64(capacity / 2 / (payload + 8)) {
				if err := w.WriteEvent(seq, payloadOf(int(seq), payload)); err != nil {
					t.Fatal(err)
				}
			}
			drain(t, r)
			good := r.Stats().Tail
			bad := c.bad(good)
			storeTail(r.m, bad) // a third party scribbles over the tail word
			if _, err := r.Next(); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Next with tail %d = %v, want ErrCorrupt", bad, err)
			}
			r.SkipToTail()
			wantHead := good
			if c.skipped {
				wantHead = bad
			}
			if h := r.Stats().Head; h != wantHead {
				t.Fatalf("head after SkipToTail = %d, want %d", h, wantHead)
			}
			// The producer goes on; the reader skips on corruption as the daemon does. Within two rings' worth of
			// events the stream must be healthy again: every one of the last 10 events delivered.
			const n = 2*capacity/(payload+8) + 10
			delivered, losses := make(map[uint64]bool), 0
			const first = capacity / 2 / (payload + 8)
			for seq := uint64(first); seq < first+n; seq++ {
				_ = w.WriteEvent(seq, payloadOf(int(seq), payload))
				for {
					rec, err := r.Next()
					if errors.Is(err, ErrEmpty) {
						break
					}
					if errors.Is(err, ErrCorrupt) {
						r.SkipToTail()
						break
					}
					if err != nil {
						t.Fatalf("seq %d: Next = %v", seq, err)
					}
					if rec.Type == TypeLoss {
						losses++
						continue
					}
					if !bytes.Equal(rec.Payload, payloadOf(int(seq), payload)) {
						t.Fatalf("seq %d: delivered a record that is not the event just published", seq)
					}
					delivered[seq] = true
				}
				r.Release()
			}
			for seq := uint64(first + n - 10); seq < first+n; seq++ {
				if !delivered[seq] {
					t.Fatalf("event %d of the last 10 not delivered: the stream is wedged (%d delivered in all)", seq, len(delivered))
				}
			}
			if wantLosses := map[bool]int{true: 1}[c.rebase]; losses != wantLosses {
				t.Fatalf("%d LOSS records, want %d (one for the event dropped when the producer re-bases)", losses, wantLosses)
			}
			if !c.skipped && len(delivered) != n {
				t.Fatalf("delivered %d of %d events, want all (the producer rewrites the tail word)", len(delivered), n)
			}
		})
	}
}

// TestSkipTo: the read position moves only to the end of a published record, and the head is released there;
// anything else is an error that leaves the Reader as it was.
func TestSkipTo(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	var ends []uint64 // end position of each record
	for i := range 5 {
		if err := w.WriteEvent(uint64(i), payloadOf(i, 40+i)); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, w.Stats().Tail)
	}
	for _, bad := range []uint64{ends[1] + 8, ends[4] + 8, ends[4] + 1<<20, ends[0] - 8} {
		if err := r.SkipTo(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("SkipTo(%d) = %v, want ErrCorrupt (record ends %v)", bad, err, ends)
		}
		if st := r.Stats(); st.ReadPos != 0 || st.Head != 0 {
			t.Fatalf("a refused SkipTo moved the reader: %+v", st)
		}
	}
	if err := r.SkipTo(ends[2]); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.ReadPos != ends[2] || st.Head != ends[2] {
		t.Fatalf("after SkipTo(%d): %+v", ends[2], st)
	}
	rec, err := r.Next()
	if err != nil || !bytes.Equal(rec.Payload, payloadOf(3, 43)) {
		t.Fatalf("Next after SkipTo = %v, want record 3", err)
	}
}

func TestReleaseTo(t *testing.T) {
	w, r, _ := newTestRing(t, Options{Capacity: MinCapacity})
	var ends []uint64 // end position of each record
	for i := range 4 {
		if err := w.WriteEvent(uint64(i), payloadOf(i, 40+i)); err != nil {
			t.Fatal(err)
		}
		ends = append(ends, w.Stats().Tail)
	}
	for range 3 { // read records 0..2: read position ends[2]
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.ReleaseTo(ends[0]); err != nil { // head ends[0]
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		pos  uint64
		err  error
		head uint64 // head after the call
	}{
		{"below head", 0, ErrReleasePos, ends[0]},
		{"beyond read position", ends[3], ErrReleasePos, ends[0]},
		{"unaligned", ends[1] + 1, ErrReleasePos, ends[0]},
		{"at head", ends[0], nil, ends[0]},
		{"boundary", ends[1], nil, ends[1]},
		{"read position", ends[2], nil, ends[2]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := r.ReleaseTo(tc.pos); !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("ReleaseTo(%d) = %v, want %v", tc.pos, err, tc.err)
			}
			st := r.Stats()
			if st.Head != tc.head || st.ReadPos != ends[2] {
				t.Fatalf("after ReleaseTo(%d): head %d read %d, want head %d read %d", tc.pos, st.Head, st.ReadPos, tc.head, ends[2])
			}
			if got := w.Stats().Head; got != tc.head {
				t.Fatalf("producer sees head %d, want %d", got, tc.head)
			}
		})
	}
}
