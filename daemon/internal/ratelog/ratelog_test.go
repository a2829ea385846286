package ratelog

import (
	"testing"
	"time"
)

// TestLog: the first line is allowed, lines within Every are suppressed and counted, the next allowed line
// reports how many were suppressed.
func TestLog(t *testing.T) {
	var r Log
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at         time.Duration
		ok         bool
		suppressed uint64
	}{
		{0, true, 0},
		{time.Second, false, 0},
		{Every - 1, false, 0},
		{Every, true, 2},
		{Every + time.Second, false, 0},
		{3 * Every, true, 1},
	}
	for i, s := range steps {
		n, ok := r.Allow(t0.Add(s.at))
		if ok != s.ok || n != s.suppressed {
			t.Fatalf("step %d (at %v): allow = %d, %v; want %d, %v", i, s.at, n, ok, s.suppressed, s.ok)
		}
	}
}
