package main

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64 // 0: an error
	}{
		{"64MiB", 64 << 20}, {"4GiB", 4 << 30}, {"4G", 4 << 30}, {"512K", 512 << 10}, {"1000", 1000}, {"7B", 7},
		{"", 0}, {"0", 0}, {"-1", 0}, {"MiB", 0}, {"1.5GiB", 0}, {"99999999999999999999", 0}, {"17179869184GiB", 0},
	} {
		got, err := parseSize(c.in)
		if (err != nil) != (c.want == 0) || got != c.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, n := range []uint64{1, 1000, 1 << 10, 3 << 20, 64 << 20, 4 << 30} {
		if got, err := parseSize(formatSize(n)); err != nil || got != n {
			t.Errorf("parseSize(formatSize(%d) = %q) = %d, %v", n, formatSize(n), got, err)
		}
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"64MiB", "4G", "1", "", "18446744073709551615", "16777216TiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSize(s)
		if err == nil && n == 0 {
			t.Fatalf("parseSize(%q) = 0 without error", s)
		}
	})
}

// TestServeBoundsUsage: a bad bound is a usage error naming the flag.
func TestServeBoundsUsage(t *testing.T) {
	for _, c := range []struct {
		o    boundsOpts
		want string
	}{
		{boundsOpts{steps: 1, hwm: 1, streams: 1, conns: 1, ringBytes: "x", bufBytes: "1"}, "--max-ring-bytes"},
		{boundsOpts{steps: 1, hwm: 1, streams: 1, conns: 1, ringBytes: "1", bufBytes: "3GiB"}, "--zmq-buffer-bytes"},
		{boundsOpts{steps: 1, hwm: 1, streams: 1, conns: 1, ringBytes: "1", bufBytes: "1", maxMemory: "lots"}, "--max-memory"},
		{boundsOpts{steps: 0, hwm: 1, streams: 1, conns: 1, ringBytes: "1", bufBytes: "1"}, "--max-buffer-steps"},
		{boundsOpts{steps: 1, hwm: 1, streams: 1, conns: -1, ringBytes: "1", bufBytes: "1"}, "--max-conns-per-peer"},
		{boundsOpts{steps: 1, hwm: 1, streams: 1, conns: 1, ringBytes: "1", bufBytes: "1"}, "--zmq-conns-per-addr 0"},
	} {
		if _, _, err := c.o.bounds(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.o, err, c.want)
		}
	}
	b, mem, err := (&boundsOpts{steps: 10, hwm: 20, streams: 3, conns: 4, ringBytes: "1GiB", bufBytes: "8MiB",
		maxMemory: "2GiB", zmqConnsPerAddr: 5}).bounds()
	if err != nil || b.MaxRingBytes != 1<<30 || b.ZmqBufferBytes != 8<<20 || mem != 2<<30 || b.MaxStreamsPerPeer != 3 ||
		b.ZmqConnsPerAddr != 5 {
		t.Fatalf("bounds %+v, mem %d, %v", b, mem, err)
	}
}
