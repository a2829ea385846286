package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvshm/kvshm/shm"
	"golang.org/x/sys/unix"
)

// Ring benchmarks: the Go drain (shm.Reader) and the Go publish (shm.Writer), each against a baseline measured in
// the same run. Run with
//
//	go test -run '^$' -bench 'Ring' -benchtime 2s ./bench/
//
// Drain metrics: records/s and ns/record for shm.Reader; baseline-ns/record for a plain loop (read the length, skip
// padding, copy the payload; no validation, no atomics) over the same ring's mapped bytes right after the same
// fill, and x-baseline = ring / baseline; heap-ns/record and x-heap for the same loop over a heap copy of the
// record stream (transparent huge pages, no page-boundary prefetch stalls). MB/s comes from SetBytes (payload
// bytes). allocs/op must be 0.

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
	path, w, r := newBenchRing(b, "drain.ring")
	mapped := mapDataArea(b, path)
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
	img, perFill := heapImage(payload)

	var records, mappedRecords, heapRecords int
	var mappedTime, heapTime time.Duration
	b.ReportAllocs()
	b.SetBytes(int64(perFill * size))
	for b.Loop() {
		b.StopTimer()
		// Baselines, each right after a fill as the timed drain is: the same loop over the ring's own mapped bytes,
		// and over a heap copy of the record stream.
		fill()
		st := r.Stats()
		t0 := time.Now()
		mappedRecords += plainDrain(mapped, st.Head, st.Tail, scratch)
		mappedTime += time.Since(t0)
		if _, err := ringDrain(r, scratch); err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		heapRecords += plainDrain(img, 0, uint64(len(img)), scratch)
		heapTime += time.Since(t0)
		fill()
		b.StartTimer()

		n, err := ringDrain(r, scratch)
		if err != nil {
			b.Fatal(err)
		}
		records += n
	}
	ringNs := float64(b.Elapsed().Nanoseconds()) / float64(records)
	mappedNs := float64(mappedTime.Nanoseconds()) / float64(mappedRecords)
	heapNs := float64(heapTime.Nanoseconds()) / float64(heapRecords)
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(ringNs, "ns/record")
	b.ReportMetric(mappedNs, "baseline-ns/record")
	b.ReportMetric(ringNs/mappedNs, "x-baseline")
	b.ReportMetric(heapNs, "heap-ns/record")
	b.ReportMetric(ringNs/heapNs, "x-heap")
}

// mapDataArea maps the ring file's data area read-only for the baseline loop.
func mapDataArea(b *testing.B, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, shm.HeaderSize+benchCapacity, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Munmap(m) })
	return m[shm.HeaderSize:]
}

// ringDrain reads every published record, copies each payload, and releases once. It is a separate function (and
// so is plainDrain) because b.Loop keeps the results of calls made directly in its body alive, which would add
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

// heapImage lays out one ring's worth of records ([u32 length][u32 type][payload], 8-aligned) in a heap slice.
func heapImage(payload []byte) ([]byte, int) {
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

// plainDrain walks the records in [head, tail) of a data area with no validation (skipping padding) and copies
// each payload: the floor for a drain.
//
//go:noinline
func plainDrain(data []byte, head, tail uint64, scratch []byte) int {
	mask := uint64(len(data) - 1)
	if len(data)&(len(data)-1) != 0 {
		mask = ^uint64(0) // heap image: not a power of two, never wraps
	}
	n := 0
	for pos := head; pos < tail; {
		idx := pos & mask
		length := uint64(binary.LittleEndian.Uint32(data[idx:]))
		if binary.LittleEndian.Uint32(data[idx+4:]) == shm.TypePadding {
			pos += length
			continue
		}
		copy(scratch, data[idx+8:idx+length])
		pos += (length + 7) &^ 7
		n++
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
	_, w, r := newBenchRing(b, "write.ring")
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

// newBenchRing creates a benchCapacity ring in a temporary directory with its writer and reader, both closed when
// the benchmark ends.
func newBenchRing(b *testing.B, name string) (string, *shm.Writer, *shm.Reader) {
	b.Helper()
	path := filepath.Join(b.TempDir(), name)
	w, err := shm.Create(path, shm.Options{Capacity: benchCapacity})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	r, err := shm.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	return path, w, r
}
