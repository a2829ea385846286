package zmqpub

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// processCPU is this process's user+system CPU time (every thread: the publisher's goroutines, the reader's, the
// benchmark's pacing).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// countingReader reads c until want bytes have come, then closes done.
func countingReader(c net.Conn, want int64) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		buf := make([]byte, 256<<10)
		for got := int64(0); got < want; {
			n, err := c.Read(buf)
			got += int64(n)
			if err != nil {
				return
			}
		}
		close(done)
	}()
	return done
}

// BenchmarkPublishCPU: the process CPU of one Publish of a 4,643-byte batch (32x32 Stored, bench/RESULTS.md's
// median vLLM payload) to one subscriber over loopback TCP, everything included: the publisher's goroutines and
// syscalls, the subscriber's reads in this process, the pacing. The baseline, measured in the same benchmark, is a
// raw net.Conn writev of the same message to a reader of the same kind: x-baseline is what the publisher's
// hand-offs cost on top of the write itself (extra-cpu-us/op: the difference per call). gap=1ms paces the calls as 1,000 batches/s do (every call finds the
// publisher idle); gap=0 publishes back to back.
func BenchmarkPublishCPU(b *testing.B) {
	for _, gap := range []time.Duration{0, time.Millisecond} {
		b.Run("gap="+gap.String(), func(b *testing.B) {
			payload := bytes.Repeat([]byte{0xa5}, 4643)
			topic := []byte("kv")
			var seq [8]byte
			hdr := appendFrame(nil, flagMore, topic)
			hdr = appendFrame(hdr, flagMore, seq[:])
			hdr = appendFrameHeader(hdr, 0, len(payload))
			msgLen := int64(len(hdr) + len(payload))
			pace := func(start time.Time, i int) {
				if gap > 0 {
					if d := time.Until(start.Add(time.Duration(i+1) * gap)); d > 0 {
						time.Sleep(d)
					}
				}
			}

			// Baseline: a raw loopback connection, one writev per message.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			w, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			rc, err := ln.Accept()
			if err != nil {
				b.Fatal(err)
			}
			defer rc.Close()
			n := b.N
			rawDone := countingReader(rc, msgLen*int64(n))
			cpu0, start := processCPU(b), time.Now()
			for i := range n {
				bufs := net.Buffers{hdr, payload}
				if _, err := bufs.WriteTo(w); err != nil {
					b.Fatal(err)
				}
				pace(start, i)
			}
			<-rawDone
			baseCPU := processCPU(b) - cpu0

			// The publisher with one subscriber (ZMTP handshake, subscribed to everything, then a plain reader).
			p, err := New(Config{Endpoint: "tcp://*:0", Topic: string(topic)}, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			sc := rawPeerB(b, strings.Replace(strings.TrimPrefix(p.Stats().Endpoint, "tcp://"), "0.0.0.0", "127.0.0.1", 1))
			defer sc.Close()
			if _, err := sc.Write([]byte{0x00, 0x01, 0x01}); err != nil { // subscribe to everything
				b.Fatal(err)
			}
			for !subscribedAll(p) {
				time.Sleep(time.Millisecond)
			}
			subDone := countingReader(sc, msgLen*int64(n))
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, start = processCPU(b), time.Now()
			for i := range n {
				binary.BigEndian.PutUint64(seq[:], uint64(i))
				if !p.Publish(uint64(i), payload) {
					b.Fatal("Publish dropped")
				}
				pace(start, i)
			}
			<-subDone
			pubCPU := processCPU(b) - cpu0
			b.StopTimer()
			b.ReportMetric(float64(pubCPU.Nanoseconds())/1e3/float64(n), "cpu-us/op")
			b.ReportMetric(float64(baseCPU.Nanoseconds())/1e3/float64(n), "baseline-cpu-us/op")
			b.ReportMetric(float64((pubCPU-baseCPU).Nanoseconds())/1e3/float64(n), "extra-cpu-us/op")
			b.ReportMetric(float64(pubCPU)/float64(baseCPU), "x-baseline")
		})
	}
}

// subscribedAll reports whether p has a connection and every one is subscribed.
func subscribedAll(p *Publisher) bool {
	cs := p.pubs.snapshot()
	for _, c := range cs {
		if !c.subscribed.Load() {
			return false
		}
	}
	return len(cs) > 0
}

// rawPeerB is rawPeer for a benchmark: a SUB's ZMTP 3.0 NULL handshake over tcp.
func rawPeerB(b *testing.B, addr string) net.Conn {
	b.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	if _, err := c.Write(append(g, ready("SUB")...)); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 64)); err != nil {
		b.Fatalf("greeting: %v", err)
	}
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(c, hdr); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, hdr[1])); err != nil {
		b.Fatal(err)
	}
	return c
}
