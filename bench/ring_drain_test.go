package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvshm/kvshm/shm"
)

// Ring benchmarks: the Go drain (shm.Reader) and the Go publish (shm.Writer), each against a baseline measured in
// the same run. Run with
//
//	go test -run '^$' -bench 'Ring' -benchtime 2s ./bench/
//
// Metrics: records/s and ns/record for the ring, baseline-ns/record for a plain loop over the same record bytes in
// a heap slice (read the length, copy the payload: no validation, no shared memory), and x-baseline = ring time /
// baseline time. MB/s comes from SetBytes (payload bytes). allocs/op must be 0.

const benchCapacity = 4 << 20

var benchPayloadSizes = []int{64, 4096}

// BenchmarkRingDrain drains a prefilled ring: one op is one full drain (Next for every record, a copy of each
// payload into a scratch buffer, one Release). The refill runs with the timer stopped.
func BenchmarkRingDrain(b *testing.B) {
	for _, size := range benchPayloadSizes {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) { benchRingDrain(b, size) })
	}
}

func benchRingDrain(b *testing.B, size int) {
	path := filepath.Join(b.TempDir(), "drain.ring")
	w, err := shm.Create(path, shm.Options{Capacity: benchCapacity})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	r, err := shm.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i)
	}
	scratch := make([]byte, size)
	fill := func() int {
		n := 0
		for w.Append(shm.TypeEvent, payload) {
			n++
		}
		w.Publish()
		return n
	}
	img, perFill := baselineImage(payload)

	var records, baselineRecords int
	var baseline time.Duration
	var sink byte
	b.ReportAllocs()
	b.SetBytes(int64(perFill * size))
	for b.Loop() {
		b.StopTimer()
		fill()
		t0 := time.Now()
		baselineRecords += baselineDrain(img, scratch)
		baseline += time.Since(t0)
		sink ^= scratch[0]
		b.StartTimer()

		n, err := ringDrain(r, scratch)
		if err != nil {
			b.Fatal(err)
		}
		records += n
		sink ^= scratch[0]
	}
	_ = sink
	ringNs := float64(b.Elapsed().Nanoseconds()) / float64(records)
	baseNs := float64(baseline.Nanoseconds()) / float64(baselineRecords)
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(ringNs, "ns/record")
	b.ReportMetric(baseNs, "baseline-ns/record")
	b.ReportMetric(ringNs/baseNs, "x-baseline")
}

// ringDrain reads every published record, copies each payload, and releases once. It is a separate function (and
// so is baselineDrain) because b.Loop keeps the results of calls made directly in its body alive, which would add
// a spill per Next that a real drain loop does not pay.
//
//go:noinline
func ringDrain(r *shm.Reader, scratch []byte) (int, error) {
	n := 0
	for {
		rec, err := r.Next()
		if err != nil {
			r.Release()
			if errors.Is(err, shm.ErrEmpty) {
				return n, nil
			}
			return n, err
		}
		copy(scratch, rec.Payload)
		n++
	}
}

// baselineImage lays out one ring's worth of records ([u32 length][u32 type][payload], 8-aligned) in a heap slice.
func baselineImage(payload []byte) ([]byte, int) {
	size := (8 + len(payload) + 7) &^ 7
	n := benchCapacity / size
	img := make([]byte, n*size)
	for i := range n {
		binary.LittleEndian.PutUint32(img[i*size:], uint32(8+len(payload)))
		binary.LittleEndian.PutUint32(img[i*size+4:], shm.TypeEvent)
		copy(img[i*size+8:], payload)
	}
	return img, n
}

// baselineDrain walks the records of img with no validation and copies each payload: the floor for a drain.
//
//go:noinline
func baselineDrain(img, scratch []byte) int {
	n := 0
	for off := 0; off+8 <= len(img); n++ {
		length := int(binary.LittleEndian.Uint32(img[off:]))
		copy(scratch, img[off+8:off+length])
		off += (length + 7) &^ 7
	}
	return n
}

// BenchmarkRingWriteEvent publishes one event per op with shm.Writer.WriteEvent (one tail store each). The ring is
// drained with the timer stopped before it fills, so no event is dropped. The baseline copies the same payload
// and header into a heap buffer at the same offsets.
func BenchmarkRingWriteEvent(b *testing.B) {
	for _, size := range benchPayloadSizes {
		b.Run(fmt.Sprintf("payload=%d", size), func(b *testing.B) { benchRingWrite(b, size) })
	}
}

func benchRingWrite(b *testing.B, size int) {
	path := filepath.Join(b.TempDir(), "write.ring")
	w, err := shm.Create(path, shm.Options{Capacity: benchCapacity})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	r, err := shm.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	payload := make([]byte, size)
	recSize := (8 + size + 7) &^ 7
	perFill := benchCapacity/recSize - 1 // always fits, padding included
	drainAll := func() {
		for {
			if _, err := r.Next(); err != nil {
				if !errors.Is(err, shm.ErrEmpty) {
					b.Fatal(err)
				}
				break
			}
		}
		r.Release()
	}

	ops := 0
	b.ReportAllocs()
	b.SetBytes(int64(size))
	for b.Loop() {
		if ops%perFill == 0 {
			b.StopTimer()
			drainAll()
			b.StartTimer()
		}
		if err := w.WriteEvent(uint64(ops), payload); err != nil {
			b.Fatalf("WriteEvent %d: %v", ops, err)
		}
		ops++
	}
	if st := w.Stats(); st.DroppedEvents != 0 {
		b.Fatalf("%d events dropped", st.DroppedEvents)
	}

	buf := make([]byte, benchCapacity)
	t0 := time.Now()
	for i := range ops {
		off := (i * recSize) & (benchCapacity - 1)
		if off+recSize > benchCapacity {
			off = 0
		}
		copy(buf[off+8:], payload)
		binary.LittleEndian.PutUint32(buf[off:], uint32(8+size))
		binary.LittleEndian.PutUint32(buf[off+4:], shm.TypeEvent)
	}
	baseNs := float64(time.Since(t0).Nanoseconds()) / float64(ops)
	ringNs := float64(b.Elapsed().Nanoseconds()) / float64(ops)
	b.ReportMetric(baseNs, "baseline-ns/op")
	b.ReportMetric(ringNs/baseNs, "x-baseline")
}
