package main

import (
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
