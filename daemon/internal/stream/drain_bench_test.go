package stream

import (
	"fmt"
	"path/filepath"
	"testing"

	flatbuffers "github.com/google/flatbuffers/go"

	"github.com/kvshm/kvshm/index"
	"github.com/kvshm/kvshm/proto/fbs"
	"github.com/kvshm/kvshm/shm"
	"github.com/kvshm/kvshm/zmqpub"
)

// BenchmarkDrainBatch measures the drain path alone (Reader.Next, fbs.Decode, index apply, per-batch counters,
// Release): each op fills the ring with one batch of Cleared events on an empty tree (the cheapest apply, so the
// drain's own overhead dominates) outside the timer and drains it with drainBatch.
func BenchmarkDrainBatch(b *testing.B) {
	w, r, ix := benchRing(b, 1<<20, 4, 1024)
	st := &Stream{key: Key{Worker: 1}, ix: ix}
	a := &Attachment{st: st, r: r, ix: ix, log: testLogger(b)}
	fb := flatbuffers.NewBuilder(256)
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for range maxBatch {
			ev := fbs.EventSpec{Seq: seq, Kind: fbs.KindCleared}
			seq++
			if !w.Append(shm.TypeEvent, fbs.Build(fb, &ev)) {
				b.Fatal("ring full")
			}
		}
		w.Publish()
		b.StartTimer()
		if n := a.drainBatch(); n != maxBatch {
			b.Fatalf("drained %d records, want %d", n, maxBatch)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*maxBatch), "ns/record")
}

// BenchmarkDrainPublish measures the drain path for BATCH records of one 32-block × 32-token Stored event with its
// Meta (medium "GPU"), without and with a ZMQ publisher (no subscriber: what the drain goroutine pays to encode
// and hand over each batch). Each op drains 64 such records.
//
//	go test -run '^$' -bench DrainPublish -benchmem ./daemon/internal/stream/
func BenchmarkDrainPublish(b *testing.B) {
	const perOp, nb, bs = 64, 32, 32
	for _, publish := range []bool{false, true} {
		b.Run(fmt.Sprintf("publish=%v", publish), func(b *testing.B) {
			w, r, ix := benchRing(b, 8<<20, bs, 1<<16)
			st := &Stream{key: Key{Worker: 1}, ix: ix, groups: map[groupKey]bool{}}
			if publish {
				p, err := zmqpub.New(zmqpub.Config{Endpoint: "ipc://" + filepath.Join(b.TempDir(), "p.sock"), HWM: 1000, BufferSteps: 1000}, nil)
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				st.pub.Store(p)
			}
			a := &Attachment{st: st, r: r, ix: ix, log: testLogger(b), hdr: shm.Header{KVBlockSize: bs}}
			fb := flatbuffers.NewBuilder(1 << 14)
			meta := append([]byte(nil), fbs.BuildMeta(fb, &fbs.MetaSpec{HasMedium: true, Medium: "GPU"})...)
			hashes := make([]uint64, nb)
			var seq uint64
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				for range perOp {
					for j := range hashes {
						hashes[j] = seq<<8 | uint64(j) | 1<<63
					}
					ev := fbs.EventSpec{Seq: seq, Kind: fbs.KindStored, BlockHashes: hashes, TokenIDs: tokens(uint32(seq), nb, bs)}
					if seq%64 == 63 {
						ev = fbs.EventSpec{Seq: seq, Kind: fbs.KindCleared} // keep the tree small
					}
					seq++
					if ok, err := w.WriteBatch(1, []shm.Sub{{Type: shm.SubMeta, Payload: meta}, {Type: shm.SubEvent, Payload: fbs.Build(fb, &ev)}}); !ok || err != nil {
						b.Fatalf("WriteBatch: %v %v", ok, err)
					}
				}
				b.StartTimer()
				if n := a.drainBatch(); n != perOp {
					b.Fatalf("drained %d records, want %d", n, perOp)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perOp), "ns/batch")
		})
	}
}

// benchRing is worker 1's ring of capacity bytes (closed when b ends), a reader of it and an empty index with the
// ring's block size and buffer.
func benchRing(b *testing.B, capacity uint64, bs uint32, maxBuf int) (*shm.Writer, *shm.Reader, *index.Indexer) {
	b.Helper()
	path := filepath.Join(b.TempDir(), "bench.ring")
	w, err := shm.Create(path, shm.Options{Capacity: capacity, WorkerID: 1, KVBlockSize: bs, MaxBufferSize: uint32(maxBuf)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	r, err := shm.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	ix, err := index.New(index.Config{WorkerID: 1, BlockSize: bs, MaxBufferSize: maxBuf})
	if err != nil {
		b.Fatal(err)
	}
	return w, r, ix
}
