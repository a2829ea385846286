package index

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// ckDriver feeds the same random stream to several indexes: stores with small hash alphabets (so nodes are shared,
// detached and reused), removes, clears, losses, unknown history, gaps and backwards ids, sometimes over more than
// 64 dp_ranks.
type ckDriver struct {
	rng  *rand.Rand
	id   uint64
	dps  []uint32
	seqs [][]uint64
}

func newCkDriver(seed uint64) *ckDriver {
	d := &ckDriver{rng: rand.New(rand.NewPCG(seed, seed^0x5bd1e995)), id: 1, dps: []uint32{0, 1, 2}}
	if d.rng.IntN(3) == 0 {
		for dp := uint32(3); dp < 70; dp++ {
			d.dps = append(d.dps, dp)
		}
	}
	return d
}

func (d *ckDriver) step(ixs ...*Indexer) {
	rng := d.rng
	switch p := rng.IntN(100); {
	case p < 3:
		d.id += 2 + uint64(rng.IntN(3))
	case p < 5 && d.id > 3:
		d.id -= uint64(1 + rng.IntN(3))
	default:
		d.id++
	}
	dp := d.dps[rng.IntN(len(d.dps))]
	if rng.IntN(3) > 0 {
		dp = d.dps[rng.IntN(3)]
	}
	ev := &Event{ID: d.id, DpRank: dp}
	switch p := rng.IntN(100); {
	case p < 2:
		for _, ix := range ixs {
			ix.MarkLost(d.id, d.id+1, "test loss")
		}
		d.id++
		return
	case p < 3:
		for _, ix := range ixs {
			ix.MarkUnknownHistory("test unknown")
		}
		return
	case p < 6:
		ev.Kind = KindCleared
	case p < 30:
		ev.Kind = KindRemoved
		for range 1 + rng.IntN(4) {
			ev.Hashes = append(ev.Hashes, uint64(rng.IntN(48)))
		}
	default:
		ev.Kind = KindStored
		if rng.IntN(2) == 0 {
			ev.HasParent, ev.Parent = true, uint64(rng.IntN(48))
		}
		var seq []uint64
		for range rng.IntN(5) {
			b := Block{BlockHash: uint64(rng.IntN(48)), TokensHash: uint64(rng.IntN(4))}
			ev.Blocks = append(ev.Blocks, b)
			seq = append(seq, b.TokensHash)
		}
		d.seqs = append(d.seqs, seq)
		if len(d.seqs) > 8 {
			d.seqs = d.seqs[1:]
		}
	}
	for _, ix := range ixs {
		_, _ = ix.Apply(ev)
	}
}

// dropDumpCache forgets the cached dump, as a restored index starts without one.
func dropDumpCache(ix *Indexer) {
	ix.cmu.Lock()
	ix.cache = nil
	ix.cmu.Unlock()
}

func normStats(s Stats) Stats {
	if len(s.LostRanges) == 0 {
		s.LostRanges = nil
	}
	return s
}

// sameAnswers compares every query of a and b byte for byte: Recover over a set of starts and ends (nil included),
// FindMatches of recent sequences, Stats.
func sameAnswers(t *testing.T, what string, a, b *Indexer, seqs [][]uint64) {
	t.Helper()
	ctx := context.Background()
	sa := a.Stats()
	starts := []*uint64{nil}
	for _, v := range []uint64{0, 1, sa.FirstEventID - 1, sa.FirstEventID, (sa.FirstEventID + sa.LastEventID) / 2, sa.LastEventID,
		sa.LastEventID + 1, sa.LastSeenID, sa.LastSeenID + 1} {
		starts = append(starts, &v)
	}
	for _, s := range starts {
		for _, e := range []*uint64{nil, s} {
			ra, err1 := a.Recover(ctx, s, e)
			rb, err2 := b.Recover(ctx, s, e)
			if err1 != nil || err2 != nil || ra.Kind != rb.Kind || !bytes.Equal(ra.JSON, rb.JSON) || ra.CacheHit != rb.CacheHit {
				t.Fatalf("%s: Recover(%s, %s):\n orig %s (hit %v, %v)\n rest %s (hit %v, %v)", what, ptrStr(s), ptrStr(e),
					ra.JSON, ra.CacheHit, err1, rb.JSON, rb.CacheHit, err2)
			}
		}
	}
	for _, seq := range seqs {
		for _, early := range []bool{false, true} {
			if ma, mb := a.FindMatches(seq, early), b.FindMatches(seq, early); !reflect.DeepEqual(ma, mb) {
				t.Fatalf("%s: FindMatches(%v, %v): orig %v, restored %v", what, seq, early, ma, mb)
			}
		}
	}
	if sa, sb := normStats(a.Stats()), normStats(b.Stats()); !reflect.DeepEqual(sa, sb) {
		t.Fatalf("%s: Stats:\n orig %+v\n rest %+v", what, sa, sb)
	}
}

func checkpointBytes(t testing.TB, ix *Indexer, meta []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := ix.WriteCheckpoint(&buf, meta); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestCheckpointRoundTrip: for random streams, an index restored from a checkpoint answers every query exactly as
// the original, re-encodes to the same bytes, and keeps answering identically after both apply the same events.
func TestCheckpointRoundTrip(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	for r := range 6 {
		s := seed + uint64(r)
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) {
			t.Logf("replay: go test ./index -run TestCheckpointRoundTrip -seed %d", s)
			d := newCkDriver(s)
			orig, _ := New(Config{WorkerID: 9, BlockSize: 2, MaxBufferSize: d.rng.IntN(40)})
			for round := range 8 {
				for range d.rng.IntN(120) {
					d.step(orig)
				}
				meta := []byte(fmt.Sprintf("round %d", round))
				b := checkpointBytes(t, orig, meta)
				rest, gotMeta, err := ReadCheckpoint(bytes.NewReader(b))
				if err != nil {
					t.Fatalf("round %d: read back: %v", round, err)
				}
				if string(gotMeta) != string(meta) || rest.Config() != orig.Config() {
					t.Fatalf("round %d: meta %q config %+v, want %q %+v", round, gotMeta, rest.Config(), meta, orig.Config())
				}
				if b2 := checkpointBytes(t, rest, meta); !bytes.Equal(b, b2) {
					t.Fatalf("round %d: restored index re-encodes to different bytes (%d vs %d)", round, len(b), len(b2))
				}
				dropDumpCache(orig)
				sameAnswers(t, fmt.Sprintf("round %d restored", round), orig, rest, d.seqs)
				for k := range 40 {
					d.step(orig, rest)
					if k%8 == 0 {
						sameAnswers(t, fmt.Sprintf("round %d after %d events", round, k), orig, rest, d.seqs)
					}
				}
				orig = rest // go on from the restored copy: checkpoints of restored indexes are tested too
			}
		})
	}
}

// TestCheckpointV1: a version 1 checkpoint (before token_mismatches and the losses since the last Cleared) is
// still read; a tainted index restores its taint's first cause as the loss an incomplete dump reports.
func TestCheckpointV1(t *testing.T) {
	ix, _ := New(Config{WorkerID: 1, BlockSize: 4, MaxBufferSize: 16})
	if _, err := ix.ApplyStoredTokens(1, 0, false, 0, hashesLE(1), toksLE(0, 5), nil, false); err != nil {
		t.Fatal(err)
	}
	ix.MarkLost(2, 3, "ring full")
	ix.MarkLost(5, 5, "ring full")
	var v1, v2 bytes.Buffer
	if err := ix.writeCheckpoint(&v1, nil, checkpointV1); err != nil {
		t.Fatal(err)
	}
	if err := ix.WriteCheckpoint(&v2, nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		b          []byte
		lost       []LostRange
		mismatches uint64
	}{
		{"v1", v1.Bytes(), []LostRange{{First: 2, Last: 3, Reason: "ring full"}}, 0},
		{"v2", v2.Bytes(), []LostRange{{First: 2, Last: 3, Reason: "ring full"}, {First: 4, Last: 5, Reason: "ring full"}}, 1},
	} {
		rest, _, err := ReadCheckpoint(bytes.NewReader(tc.b))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r, err := rest.Recover(context.Background(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Incomplete || !reflect.DeepEqual(r.Lost, tc.lost) || rest.Stats().TokenMismatches != tc.mismatches {
			t.Fatalf("%s: incomplete %v lost %+v mismatches %d; want lost %+v mismatches %d", tc.name, r.Incomplete,
				r.Lost, rest.Stats().TokenMismatches, tc.lost, tc.mismatches)
		}
	}
}

// TestCheckpointRejects: corrupted checkpoints are refused with a *CheckpointError wrapping ErrCheckpoint.
func TestCheckpointRejects(t *testing.T) {
	d := newCkDriver(11)
	ix, _ := New(Config{WorkerID: 1, BlockSize: 2, MaxBufferSize: 16})
	for range 200 {
		d.step(ix)
	}
	good := checkpointBytes(t, ix, []byte("m"))
	resum := func(b []byte) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crcTable))
		return b
	}
	cases := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"magic", append([]byte("XXXXXXXX"), good[8:]...)},
		{"version", resum(append(append(bytes.Clone(good[:8]), 4, 0, 0, 0), good[12:]...))},
		{"truncated", good[:len(good)/2]},
		{"flipped byte", func() []byte { b := bytes.Clone(good); b[len(b)/2] ^= 0x40; return b }()},
		{"trailing byte, checksum fixed", resum(append(append(bytes.Clone(good[:len(good)-4]), 0), 0, 0, 0, 0))},
		{"block size 0, checksum fixed", func() []byte {
			b := bytes.Clone(good)
			off := 8 + 4 + 4 + 1 + 8 // magic, version, meta length, meta "m", worker_id
			binary.LittleEndian.PutUint32(b[off:], 0)
			return resum(b)
		}()},
	}
	for _, c := range cases {
		_, _, err := ReadCheckpoint(bytes.NewReader(c.b))
		var ce *CheckpointError
		if !errors.Is(err, ErrCheckpoint) || !errors.As(err, &ce) {
			t.Errorf("%s: err %v, want a *CheckpointError wrapping ErrCheckpoint", c.name, err)
		}
	}
	if _, _, err := ReadCheckpoint(bytes.NewReader(good)); err != nil {
		t.Fatalf("the unmodified checkpoint: %v", err)
	}
}

// FuzzReadCheckpoint: no input makes ReadCheckpoint panic; with the checksum recomputed (so the structural checks
// are reached) an accepted checkpoint re-encodes to the same bytes and its index answers queries.
func FuzzReadCheckpoint(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3} {
		d := newCkDriver(seed)
		ix, _ := New(Config{WorkerID: seed, BlockSize: 2, MaxBufferSize: 8})
		for range 30 * int(seed) {
			d.step(ix)
		}
		f.Add(checkpointBytes(f, ix, []byte{byte(seed)}))
	}
	empty, _ := New(Config{WorkerID: 1, BlockSize: 1})
	f.Add(checkpointBytes(f, empty, nil))
	f.Add(checkpointBytes(f, tokenIndex(f), nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 1<<16 {
			return
		}
		try := func(b []byte) {
			ix, meta, err := ReadCheckpoint(bytes.NewReader(b))
			if err != nil {
				if !errors.Is(err, ErrCheckpoint) {
					t.Fatalf("error %v does not wrap ErrCheckpoint", err)
				}
				return
			}
			if b2 := checkpointBytes(t, ix, meta); !bytes.Equal(b, b2) {
				t.Fatalf("accepted checkpoint re-encodes differently")
			}
			checkTree(t, ix, "accepted checkpoint")
			if sn, err := ix.Snapshot(); err == nil {
				_ = sn.Events(func(*SnapshotEvent) {})
			}
			_, _ = ix.Recover(context.Background(), nil, nil)
			_ = ix.FindMatches([]uint64{0, 1, 2}, false)
			_, _ = ix.Apply(&Event{ID: 1 << 40, Kind: KindRemoved, Hashes: []uint64{0, 1, 2, 3}})
			_, _ = ix.Apply(&Event{ID: 1<<40 + 1, Kind: KindStored, Blocks: []Block{{1, 1}, {2, 2}}})
			_, _ = ix.Apply(&Event{ID: 1<<40 + 2, Kind: KindCleared})
			checkTree(t, ix, "events after an accepted checkpoint")
		}
		try(b)
		if len(b) >= 4 {
			b = bytes.Clone(b)
			binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crcTable))
			try(b)
		}
	})
}

// BenchmarkCheckpoint writes and reads the checkpoint of an index of n resident blocks (chains of 32, two
// dp_ranks, a full 10000-event log). go test ./index -run '^$' -bench Checkpoint -benchtime 3x
func BenchmarkCheckpoint(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		ix := fillBlocks(b, n)
		data := checkpointBytes(b, ix, nil)
		b.Run(fmt.Sprintf("op=write/blocks=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			var buf bytes.Buffer
			buf.Grow(len(data))
			for b.Loop() {
				buf.Reset()
				if err := ix.WriteCheckpoint(&buf, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(data))/float64(n), "bytes/block")
		})
		b.Run(fmt.Sprintf("op=read/blocks=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, _, err := ReadCheckpoint(bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(data))/float64(n), "bytes/block")
		})
	}
}

// endless is a reader that never ends (like /dev/zero).
type endless struct{ n int64 }

func (e *endless) Read(p []byte) (int, error) {
	clear(p)
	e.n += int64(len(p))
	return len(p), nil
}

// TestReadCheckpointBounded is the soak's endless-checkpoint-reader defect at the index's level: a reader that never ends is read only up to
// the bound (its Len here), then refused as a *CheckpointError, never read without limit.
func TestReadCheckpointBounded(t *testing.T) {
	r := &struct {
		*endless
		lenOnly
	}{&endless{}, lenOnly(1 << 20)}
	_, _, err := ReadCheckpoint(r)
	var ce *CheckpointError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCheckpoint) {
		t.Fatalf("ReadCheckpoint(endless reader of Len 1 MiB) = %v, want a *CheckpointError", err)
	}
	if r.n > 1<<20+1<<16 {
		t.Fatalf("read %d bytes from a reader of Len %d", r.n, 1<<20)
	}
}

type lenOnly int

func (l lenOnly) Len() int { return int(l) }

// tokenIndex is a small KeepTokens index: chains, an Eagle chain, a LoRA chain, a removal (a freed node).
func tokenIndex(tb testing.TB) *Indexer {
	tb.Helper()
	ix, _ := New(Config{WorkerID: 3, BlockSize: 2, MaxBufferSize: 8, KeepTokens: true})
	for i, e := range []struct {
		hasParent bool
		parent    uint64
		hs        []uint64
		toks      []uint32
		lora      string
		eagle     bool
	}{
		{false, 0, []uint64{1, 2, 3}, []uint32{1, 2, 3, 4, 5, 6}, "", false},
		{true, 2, []uint64{4}, []uint32{7, 8}, "", false},
		{false, 0, []uint64{5, 6}, []uint32{9, 9, 8, 8, 7}, "", true},
		{false, 0, []uint64{7}, []uint32{4, 4}, "ad", false},
	} {
		if _, err := ix.ApplyStoredTokens(uint64(i+1), uint32(i%2), e.hasParent, e.parent, hashesLE(e.hs...),
			tokensToLE(nil, e.toks), []byte(e.lora), e.eagle); err != nil && i != 1 {
			tb.Fatal(err)
		}
	}
	if _, err := ix.Apply(&Event{ID: 9, Kind: KindRemoved, Hashes: []uint64{3}}); err != nil {
		tb.Fatal(err)
	}
	return ix
}

func snapshotEvents(t *testing.T, ix *Indexer) []string {
	t.Helper()
	sn, err := ix.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	if err := sn.Events(func(e *SnapshotEvent) { out = append(out, fmt.Sprintf("%+v", *e)) }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCheckpointTokens: version 3 carries the token windows and LoRA names (a restored kvshmd answers the same
// snapshot); a version 2 checkpoint restores an index without tokens.
func TestCheckpointTokens(t *testing.T) {
	ix := tokenIndex(t)
	want := snapshotEvents(t, ix)
	if len(want) < 3 {
		t.Fatalf("snapshot of the test index: %q", want)
	}
	ix2, _, err := ReadCheckpoint(bytes.NewReader(checkpointBytes(t, ix, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if got := snapshotEvents(t, ix2); !slices.Equal(got, want) {
		t.Fatalf("restored snapshot:\n%q\nwant\n%q", got, want)
	}
	var v2 bytes.Buffer
	if err := ix.writeCheckpoint(&v2, nil, checkpointV2); err != nil {
		t.Fatal(err)
	}
	ix3, _, err := ReadCheckpoint(&v2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ix3.Snapshot(); !errors.Is(err, ErrNoTokens) {
		t.Fatalf("version 2 restore: Snapshot %v, want ErrNoTokens", err)
	}
}
