package daemon

import (
	"testing"
	"time"
)

// TestIdlePublishingStreamSleeps: a publishing stream keeps its short lost-doorbell period only while records keep
// coming; silent for publishWarmFor it needs its worker at idleEvery (and for its heartbeats), as a stream nobody
// subscribes to. Before, an idle publishing stream woke its worker every 10 ms: 100 wakeups a second per idle rank.
func TestIdlePublishingStreamSleeps(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	for _, tc := range []struct {
		name       string
		publishing bool
		every      time.Duration
		silent     time.Duration
		want       time.Duration
	}{
		{"publishing, records just now", true, publishIdleEvery, 0, publishIdleEvery},
		{"publishing, warm", true, publishIdleEvery, publishWarmFor - time.Millisecond, publishIdleEvery},
		{"publishing, silent", true, publishIdleEvery, publishWarmFor, idleEvery},
		{"publishing, silent long", true, publishIdleEvery, time.Hour, idleEvery},
		{"not publishing, records just now", false, idleEvery, 0, idleEvery},
		{"not publishing, silent", false, idleEvery, time.Hour, idleEvery},
	} {
		a := &attachment{publishing: tc.publishing, every: tc.every, lastRec: t0}
		if got := a.housekeepEvery(t0.Add(tc.silent)); got != tc.want {
			t.Errorf("%s: housekeeping every %v, want %v", tc.name, got, tc.want)
		}
	}
}
