package stream

import "time"

// How often an attached stream needs its drain worker when no record comes (attachment.Housekeep; package drain
// has the idle strategy: park first on the ring's doorbell, poll only while records come faster than a wakeup).
//
// The period is also the lost-doorbell bound: the Python producer cannot fence between its tail store and its load
// of consumer_parked, so (rarely) its wakeup is lost exactly when the worker arms the ring, and the record then
// waits for the worker's next wakeup, which comes at the latest at this deadline (shm/FORMAT.md, "Doorbell"). A
// publishing stream's subscribers see that delay, so it is short (10 ms, as before the drain scheduler; heartbeats
// are checked at that pace). A stream nobody subscribes to is read only by queries, whose barriers wake the worker
// at once, so its period paces only the ring snapshot, the truncation and CLOSED checks and the pid backstop
// (every max(period, --pid-check-interval)): 1 s, the backstop's default. Each wakeup after a sleep of more than
// 10 ms also costs the Go runtime's sysmon ~60 short sleeps (it retakes the P the worker's futex_waitv held, then
// polls at 20 µs for a millisecond), so idle wakeups are what an idle daemon pays: measured with 64 idle streams,
// 250 ms cost 1.6-2.1% of a core with the /proc pid check; 1 s with a pidfd (pidwatch.go) 0.12% for the kvshmd
// process alone (BenchmarkDaemonProcCPU). The worker coalesces the deadlines of its streams (drain/doc.go): one
// wakeup per worker per period.
//
// A publishing stream keeps the 10 ms period only while it is warm: records came within publishWarmFor. A doorbell
// can be lost only when the producer publishes within the few instructions of the worker arming the ring. The arms
// that follow a pass (the worker sleeps right after draining, while the engine is likely to publish again) are
// covered by the short period; later the worker re-arms the ring about once a second (its heartbeat's pace), and a
// publish would have to hit one of those instants to be reached late, within IdleEvery even then. Without this an
// idle or slow publishing stream (every vLLM rank between requests) woke its worker 100 times a second: 1.5-2.9% of a
// core per stream, 64 idle ranks more than a core (TestIdlePublishingStreamSleeps).
const (
	IdleEvery        = time.Second
	PublishIdleEvery = 10 * time.Millisecond
	publishWarmFor   = 25 * time.Millisecond // two short periods after the last record's arm, with the worker's slack
)

// A stream that is not published (its index is read only by queries, whose barriers wake the worker) is drained
// lazily: its producer rings the doorbell only when lazyLevel bytes are unread (shm.Reader.SetDoorbellLevel, FORMAT.md
// "Doorbell"), and below that its records wait for the worker's next wakeup, whatever its cause: a query, another
// stream's doorbell, or this stream's own deadline (IdleEvery). A wakeup on this machine costs the daemon ~100 µs of
// CPU whatever it does (the Go runtime's and the virtual CPU's own idle exit), far more than applying one event, so
// 64 such streams at 10 events/s cost 640 wakeups a second when rung per record, and ~4 (one per worker per
// deadline) lazily. The level bounds the backlog a query's barrier may have to apply first (64 KiB: ~400 events of
// 32 blocks, ~1 ms) and keeps a busy stream far from a full ring (a quarter of a small ring).
//
// What lags: the ring statistics and metrics of such a stream (up to IdleEvery, as when idle), and --rank-ports,
// which opens a rank's port on its first event (so a stream with rank ports is not lazy).
const lazyLevelMax = 64 << 10

// lazyLevel is the doorbell level of a lazy stream whose ring holds capacity bytes.
func lazyLevel(capacity uint64) uint32 { return uint32(min(capacity/4, lazyLevelMax)) }

// lazy reports whether the attachment is drained lazily (see lazyLevelMax; never with Config.EagerDrain).
func (a *Attachment) lazy() bool {
	return !a.publishing && !a.ranks.on && !a.eng.cfg.EagerDrain
}
