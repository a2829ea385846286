package main

import "testing"

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, headroom uint64
		want           int
	}{
		{0, 64 * mib, 100},
		{10 * mib, 64 * mib, 100},    // small heap: Go's default
		{64 * mib, 64 * mib, 100},    // headroom = live
		{128 * mib, 64 * mib, 50},    // 64 MiB over 128 MiB live
		{1024 * mib, 64 * mib, 12},   // never below 1/8 of the live heap
		{4096 * mib, 64 * mib, 12},   //
		{512 * mib, 256 * mib, 50},   //
		{100 * mib, 1024 * mib, 100}, // never above GOGC 100
	} {
		if got := gcPercentFor(tc.live, tc.headroom); got != tc.want {
			t.Errorf("gcPercentFor(%d MiB, %d MiB) = %d, want %d", tc.live/mib, tc.headroom/mib, got, tc.want)
		}
	}
}
