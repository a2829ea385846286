package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// The collector's headroom policy of serve (--gc-headroom). Go's default (GOGC=100) lets the heap grow to twice
// the live data before collecting: right for a small daemon, but at millions of resident blocks the live data is
// the index (~100 B a block, pointer-free arrays the collector does not scan) and doubling it doubles the daemon's
// memory for garbage. So after every collection serve sets GOGC to keep the headroom at about headroom bytes,
// never below 1/8 of the live heap (GOGC 12) nor above half of it (GOGC 50): a heap of live data L may grow to
// L + min(max(headroom, L/8), L/2). Collections stay rare (each one about every headroom bytes allocated; below
// 128 MiB of live data, every L/2) and cheap (little to mark; a small heap is small to mark). An operator's GOGC (environment) wins: the policy is off when it is set, or when
// --gc-headroom is 0. --max-memory (the soft limit) still applies on top.

const (
	gcMinPercent = 12
	gcMaxPercent = 50
)

// gcPercentFor returns the GOGC that gives a live heap of live bytes about headroom bytes of headroom, within
// [gcMinPercent, gcMaxPercent].
func gcPercentFor(live, headroom uint64) int {
	if live == 0 {
		return gcMaxPercent
	}
	p := headroom * 100 / live
	return int(min(max(p, gcMinPercent), gcMaxPercent))
}

// startGCPolicy arms the policy: a callback after each collection (a finalizer on a sentinel, re-armed each time,
// so an idle daemon that allocates nothing is never woken by it) reads the live heap and sets GOGC.
func startGCPolicy(headroom uint64) {
	if headroom == 0 || os.Getenv("GOGC") != "" {
		return
	}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	cur := gcMaxPercent
	var arm func()
	arm = func() {
		s := new([16]byte) // not a tiny allocation: a finalizer on it runs once the collection that frees it ends
		runtime.SetFinalizer(s, func(*[16]byte) {
			metrics.Read(sample)
			if sample[0].Value.Kind() == metrics.KindUint64 {
				if p := gcPercentFor(sample[0].Value.Uint64(), headroom); p != cur {
					cur = p
					debug.SetGCPercent(p)
				}
			}
			arm()
		})
	}
	arm()
}

// applyMemoryLimit sets the runtime's soft memory limit when --max-memory was given (it overrides GOMEMLIMIT, which
// the runtime applies by itself otherwise).
func applyMemoryLimit(mem int64) {
	if mem > 0 {
		debug.SetMemoryLimit(mem)
	}
}
