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

// TestLazyStreams: a stream that is not published is drained lazily (its producer rings only at lazyLevel unread
// bytes), a published one or one with rank ports at every publication; attaching sets the ring's level. And a
// lazy stream is not starved: a record far below the level is applied without any query, by the worker's own
// deadline.
func TestLazyStreams(t *testing.T) {
	for _, tc := range []struct {
		name string
		a    *attachment
		want bool
	}{
		{"not published", &attachment{srv: &Server{}}, true},
		{"published", &attachment{srv: &Server{}, publishing: true}, false},
		{"rank ports", &attachment{srv: &Server{}, ranks: rankSet{on: true}}, false},
		{"Config.EagerDrain", &attachment{srv: &Server{cfg: Config{EagerDrain: true}}}, false},
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

	ts := startServer(t, nil)
	p := newProducer(t, ts.SocketPath(), 40, 4, 1<<16)
	ts.mu.Lock()
	st := ts.streams[keyOf(40, nil)]
	ts.mu.Unlock()
	_, a := st.current()
	if got, want := a.r.DoorbellLevel(), lazyLevel(1<<16); got != want {
		t.Fatalf("attached stream's doorbell level = %d, want %d", got, want)
	}
	p.mustPublish(stored(0, 0, nil, []uint64{1}, tokens(0, 1, 4))) // ~100 bytes: far below the level
	waitUntil(t, a.appliedAll, "the record applied by the worker's deadline, no query asking")
}
