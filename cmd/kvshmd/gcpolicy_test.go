package main

import "testing"

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, headroom uint64
		want           int
	}{
		{0, 64 * mib, 50},
		{10 * mib, 64 * mib, 50},    // small heap: half of it
		{64 * mib, 64 * mib, 50},    // never above half the live heap
		{128 * mib, 64 * mib, 50},   // 64 MiB over 128 MiB live
		{256 * mib, 64 * mib, 25},   //
		{1024 * mib, 64 * mib, 12},  // never below 1/8 of the live heap
		{4096 * mib, 64 * mib, 12},  //
		{1024 * mib, 256 * mib, 25}, //
		{100 * mib, 1024 * mib, 50}, // never above GOGC 50
	} {
		if got := gcPercentFor(tc.live, tc.headroom); got != tc.want {
			t.Errorf("gcPercentFor(%d MiB, %d MiB) = %d, want %d", tc.live/mib, tc.headroom/mib, got, tc.want)
		}
	}
}
