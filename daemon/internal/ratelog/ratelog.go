// Package ratelog rate-limits warn lines: one line of a kind per stream every Every, the lines in between counted
// so that the next one says how many were suppressed. The stream engine limits its token-count and dropped-batch
// lines with it, the daemon its incomplete-answer lines.
package ratelog

import (
	"sync"
	"time"
)

// Every is the least time between two warn lines of one kind about one stream (incomplete answers, token-count
// mismatches); the lines in between are counted and the next line says how many were suppressed.
const Every = 10 * time.Second

// Log rate-limits one kind of log line. The zero value allows the first line at once. Safe for concurrent use.
type Log struct {
	mu         sync.Mutex // protects the fields below
	last       time.Time
	suppressed uint64
}

// Allow reports whether a line may be logged at now and, if so, how many were suppressed since the last one.
func (r *Log) Allow(now time.Time) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && now.Sub(r.last) < Every {
		r.suppressed++
		return 0, false
	}
	n := r.suppressed
	r.last, r.suppressed = now, 0
	return n, true
}
