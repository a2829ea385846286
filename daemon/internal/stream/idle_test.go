package stream

import (
	"testing"
	"time"
)

// TestIdlePublishingStreamSleeps: a publishing stream keeps its short lost-doorbell period only while records keep
// coming; silent for publishWarmFor it needs its worker at IdleEvery (and for its heartbeats), as a stream nobody
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
		{"publishing, records just now", true, PublishIdleEvery, 0, PublishIdleEvery},
		{"publishing, warm", true, PublishIdleEvery, publishWarmFor - time.Millisecond, PublishIdleEvery},
		{"publishing, silent", true, PublishIdleEvery, publishWarmFor, IdleEvery},
		{"publishing, silent long", true, PublishIdleEvery, time.Hour, IdleEvery},
		{"not publishing, records just now", false, IdleEvery, 0, IdleEvery},
		{"not publishing, silent", false, IdleEvery, time.Hour, IdleEvery},
	} {
		a := &Attachment{publishing: tc.publishing, every: tc.every, lastRec: t0}
		if got := a.housekeepEvery(t0.Add(tc.silent)); got != tc.want {
			t.Errorf("%s: housekeeping every %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLazyStreams: a stream that is not published is drained lazily (its producer rings only at lazyLevel unread
// bytes), a published one or one with rank ports at every publication; attaching sets the ring's level. And a
// lazy stream is not starved: a record far below the level is applied without any query, by the worker's own
// deadline.
func TestLazyStreams(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    *Attachment
		want bool
	}{
		{"not published", &Attachment{eng: &Engine{}}, true},
		{"published", &Attachment{eng: &Engine{}, publishing: true}, false},
		{"rank ports", &Attachment{eng: &Engine{}, ranks: rankSet{on: true}}, false},
		{"Config.EagerDrain", &Attachment{eng: &Engine{cfg: Config{EagerDrain: true}}}, false},
	} {
		if got := tc.a.lazy(); got != tc.want {
			t.Errorf("%s: lazy = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got, want := lazyLevel(1<<16), uint32(16<<10); got != want {
		t.Errorf("lazyLevel(64 KiB ring) = %d, want a quarter: %d", got, want)
	}
	if got, want := lazyLevel(1<<30), uint32(lazyLevelMax); got != want {
		t.Errorf("lazyLevel(1 GiB ring) = %d, want the cap %d", got, want)
	}
}
