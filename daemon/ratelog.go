package daemon

import (
	"sync"
	"time"
)

// logEvery is the least time between two warn lines of one kind about one stream (incomplete answers, token-count
// mismatches); the lines in between are counted and the next line says how many were suppressed.
const logEvery = 10 * time.Second

// rateLog rate-limits one kind of log line. The zero value allows the first line at once. Safe for concurrent use.
type rateLog struct {
	mu         sync.Mutex // protects the fields below
	last       time.Time
	suppressed uint64
}

// allow reports whether a line may be logged at now and, if so, how many were suppressed since the last one.
func (r *rateLog) allow(now time.Time) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && now.Sub(r.last) < logEvery {
		r.suppressed++
		return 0, false
	}
	n := r.suppressed
	r.last, r.suppressed = now, 0
	return n, true
}
