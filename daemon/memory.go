package daemon

import (
	"runtime/debug"
	"sync/atomic"
)

// A recovery answer is built whole (a TreeDump is ~85 bytes of JSON a resident block, 850 MB at 10 M blocks) and
// is garbage once written. The runtime's background scavenger returns freed heap to the OS slowly (it is paced to
// ~1% of a CPU, tens of MB a second), so after a large answer the daemon's RSS would stay at its peak for seconds
// to minutes. An answer of releaseReplyBytes or more is therefore followed, once written, by one
// debug.FreeOSMemory (a collection, then every free page returned) in its own goroutine, at most one at a time.
// Cost: that collection (the index is mostly pointer-free arrays: little to mark) and the page faults of the next
// large answer, which gets fresh pages; both small next to building and sending an answer of that size.

const releaseReplyBytes = 32 << 20

var releasing atomic.Bool

// releaseAfterReply returns a written answer's memory to the OS when it was large (see above).
func releaseAfterReply(n int) {
	if n < releaseReplyBytes || !releasing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer releasing.Store(false)
		debug.FreeOSMemory()
	}()
}
